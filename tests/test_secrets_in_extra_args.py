"""Secrets in VLLM_EXTRA_ARGS and the forwarded names that once
passed, refused at `config check` with one line that never shows a secret.

The lists are checked against vLLM itself: its own set of sensitive serve arguments
(`_SENSITIVE_ARG_FIELDS`, which it redacts in its log) through its real parser, and every path-like
variable its `envs.py` declares.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dspark_launch.config.forward_env import refusal as forward_refusal
from dspark_launch.config.serve_flags import check_extra_args
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError
from tests.support.launcher_env import run_dspark
from tests.support.vllm_parser import PARSER_PREAMBLE

SECRET = "hf_LEAKEDsecret0123456789"


def refusal(clean_environ, **values) -> str:
    with pytest.raises(ConfigError) as err:
        resolve(env_file="/dev/null", environ={**clean_environ, **values})
    message = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in message and "allowed:" in message
    return message


SECRET_FORMS = [
    "--hf-token {}",
    "--hf-token={}",
    "--hf_token {}",
    "--hf-tok {}",
    "--watermark-config {}",
    "--watermark_config={}",
    "--watermark-conf {}",
]


@pytest.mark.parametrize("form", SECRET_FORMS)
def test_secret_flags_in_extra_args_are_refused_without_their_value(clean_environ, form):
    value = form.format(SECRET if "hf" in form else "'{\"key\": 4242}'")
    message = refusal(clean_environ, VLLM_EXTRA_ARGS=f"--enforce-eager {value}")
    assert "VLLM_EXTRA_ARGS" in message and "whose value is a secret" in message and "leave it out" in message
    assert SECRET not in message and "4242" not in message


def test_the_cli_refuses_a_hub_token_in_extra_args_in_one_line(tmp_path):
    env_file = tmp_path / "x.env"
    env_file.write_text(f"VLLM_EXTRA_ARGS=--enforce-eager --hf-token {SECRET}\n")
    env_file.chmod(0o600)
    proc = run_dspark(["config", "check", "--env-file", str(env_file)])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "VLLM_EXTRA_ARGS" in errors[0] and f"{env_file}:1" in errors[0] and "--hf-token" in errors[0]
    assert SECRET not in proc.stdout + proc.stderr
    proc = run_dspark(["config", "show", "--env-file", str(env_file)])
    assert SECRET not in proc.stdout + proc.stderr


_SENSITIVE = (
    PARSER_PREAMBLE
    + r"""
from vllm.entrypoints.serve.utils.api_utils import _SENSITIVE_ARG_FIELDS
options = sorted(o for a in parser._actions if a.dest in _SENSITIVE_ARG_FIELDS for o in a.option_strings)
print("RESULT " + json.dumps({"fields": sorted(_SENSITIVE_ARG_FIELDS), "options": options}))
"""
)


def test_every_argument_vllm_treats_as_sensitive_is_refused():
    proc = subprocess.run([sys.executable, "-c", _SENSITIVE], capture_output=True, text=True, timeout=300)
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert {"api_key", "hf_token", "watermark_config"} <= set(result["fields"])
    assert len(result["options"]) >= 3, result
    for option in result["options"]:
        with pytest.raises(ValueError):
            check_extra_args(["--enforce-eager", option, "x"])


DENIED = (
    "VLLM_SERVER_DEV_MODE",
    "RAY_DEBUG",
    "RAY_DEBUG_POST_MORTEM",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_NCCL_SO_PATH",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_USE_MODELSCOPE",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "NCCL_DEBUG_FILE",
    "VLLM_TORCH_PROFILER_DIR",
    "VLLM_DEBUG_DUMP_PATH",
    # the families: names of the same kind that vLLM, Ray or NCCL may add
    "RAY_DEBUGGER_EXTERNAL",
    "VLLM_SOME_NEW_DEV_MODE",
    "VLLM_NEW_DUMP_DIR",
    "NCCL_TOPO_DUMP_FILE",
)


@pytest.mark.parametrize("name", DENIED)
def test_dev_mode_debugger_and_path_names_are_refused(clean_environ, name):
    message = refusal(clean_environ, DSPARK_FORWARD_ENV=f"NCCL_DEBUG {name}")
    assert f"names {name}:" in message and "DSPARK_FORWARD_ENV" in message


_ENV_NAMES = r"""
import json
import vllm.envs as envs
print("RESULT " + json.dumps(sorted(envs.environment_variables)))
"""


def test_every_path_variable_vllm_declares_is_refused():
    """vLLM's own list of variables: each `VLLM_*_DIR/_PATH/_FILE/_ROOT` is a place root writes to or reads
    code from, and is refused, except the IPC socket folder (random names inside it)."""
    proc = subprocess.run([sys.executable, "-c", _ENV_NAMES], capture_output=True, text=True, timeout=300)
    names = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:])
    paths = [n for n in names if n.endswith(("_DIR", "_PATH", "_FILE", "_ROOT"))]
    assert "VLLM_LOGGING_CONFIG_PATH" in paths and "VLLM_RPC_BASE_PATH" in paths and len(paths) > 5
    assert [n for n in paths if not forward_refusal(n)] == ["VLLM_RPC_BASE_PATH"]
    assert "VLLM_SERVER_DEV_MODE" in names and forward_refusal("VLLM_SERVER_DEV_MODE")
