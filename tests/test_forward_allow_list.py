"""DSPARK_FORWARD_ENV is an allow-list by family (config/forward_env.py): only names the launcher reviewed reach the
nodes. The deny-list it replaced let RAY_JOB_CONFIG_JSON_ENV_VAR put PYTHONPATH into Ray's workers, and TMPDIR, Ray's
folders and config, torch's debug files, CA bundles, OpenTelemetry endpoints and FORWARDED_ALLOW_IPS through.
Every variable vLLM declares (0.32's `envs.py`, and 0.34's where its unpacked wheel is here) and every Ray, torch
and NCCL variable the docs name is classified: allowed by a family with its reason, or refused with one."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_launch.config.forward_env import (
    ALLOWED,
    NOT_REVIEWED,
    REFUSED_NAMES,
    allowed_family,
    profile_env_names,
    refusal,
    refused_kind,
)
from tests.support.launcher_env import run_dspark
from tests.support.paths import REPO

VLLM_034_ENVS = Path("/root/.cache/dspark-compat/overlays/vllm-0.34.0/vllm/envs.py")

# The issue's names, and others of the same kinds.
ISSUE_NAMES = (
    "RAY_JOB_CONFIG_JSON_ENV_VAR",
    "TMPDIR",
    "TMP",
    "TEMP",
    "RAY_TMPDIR",
    "RAY_object_spilling_config",
    "RAY_object_spilling_directory",
    "RAY_plasma_directory",
    "RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_TRACE",
    "TORCH_LOGS_OUT",
    "TORCH_COMPILE_DEBUG_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "FORWARDED_ALLOW_IPS",
    "HTTPS_PROXY",
    "VLLM_LOGGING_PREFIX",
    "VLLM_LOGGING_LEVEL",
    "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY",
    "NCCL_COMM_ID",
    "MASTER_ADDR",
)
# What a variable's name says it holds (a word of the name), for the names the allow-list must never take in.
DANGEROUS_WORDS = frozenset(
    {
        "PATH",
        "DIR",
        "FILE",
        "FOLDER",
        "ROOT",
        "HOST",
        "PORT",
        "IP",
        "IPS",
        "URL",
        "URI",
        "ENDPOINT",
        "ADDR",
        "ADDRESS",
        "PLUGIN",
        "PLUGINS",
        "CACHE",
        "KEY",
        "TOKEN",
        "SECRET",
        "LOGGING",
        "DEBUG",
        "TRACE",
        "DUMP",
        "DEV",
        "INSECURE",
        "PROXY",
        "CONFIG",
        "MODELSCOPE",
        "RAY",
        "REDIRECTS",
        "HEADERS",
    }
)
REVIEWED_EXCEPTIONS = {
    "VLLM_RPC_BASE_PATH": "the IPC socket folder (random names inside)",
    "NCCL_DEBUG": "a log level",
    "NCCL_DEBUG_SUBSYS": "the log's subsystems",
}


def dangerous(name: str) -> bool:
    return bool(DANGEROUS_WORDS & set(name.split("_"))) and name not in REVIEWED_EXCEPTIONS


def vllm_names() -> set[str]:
    """vllm.envs.environment_variables of the installed vLLM (0.32), and 0.34's by reading its envs.py."""
    script = "import json, vllm.envs as e; print('RESULT ' + json.dumps(sorted(e.environment_variables)))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    names = set(json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:]))
    if VLLM_034_ENVS.is_file():
        tree = ast.parse(VLLM_034_ENVS.read_text())
        for node in ast.walk(tree):
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if (
                isinstance(target, ast.Name)
                and target.id == "environment_variables"
                and isinstance(getattr(node, "value", None), ast.Dict)
            ):
                names |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    return names


def verdict(name: str) -> tuple[bool, str]:
    """(allowed, why): every name gets one, with a reason."""
    why = refusal(name)
    family = allowed_family(name)
    return (True, family.why) if why is None and family else (False, why or "")


def test_every_variable_vllm_declares_is_classified():
    names = vllm_names()
    assert len(names) > 300 and {"VLLM_SERVER_DEV_MODE", "VLLM_LOGGING_PREFIX", "VLLM_CPU_KVCACHE_SPACE"} <= names
    verdicts = {name: verdict(name) for name in names}
    assert all(why for _, why in verdicts.values()), [n for n, (_, why) in verdicts.items() if not why]
    allowed = sorted(name for name, (ok, _) in verdicts.items() if ok)
    # Allowed only when a family names it exactly (or is the b12x image's switch family): a new vLLM variable
    # is refused until someone reviews it.
    named = {name for family in ALLOWED for name in family.names}
    assert [name for name in allowed if name not in named and not name.startswith("VLLM_USE_B12X_")] == []
    risky = [name for name in allowed if dangerous(name)]
    assert risky == [], f"allowed, yet the name says it is a path, address, log format or secret: {risky}"
    for name in (
        "VLLM_SERVER_DEV_MODE",
        "VLLM_LOGGING_PREFIX",
        "VLLM_LOGGING_CONFIG_PATH",
        "VLLM_PLUGINS",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY",
        "VLLM_USAGE_STATS_SERVER",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_TUNED_CONFIG_FOLDER",
        "S3_ENDPOINT_URL",
    ):
        if name in names:
            assert not verdicts[name][0] and verdicts[name][1] != NOT_REVIEWED, name  # refused by its kind
    assert verdicts["VLLM_CPU_KVCACHE_SPACE"][0] and verdicts["VLLM_RPC_BASE_PATH"][0]
    refused_unreviewed = sum(1 for ok, why in verdicts.values() if not ok and why == NOT_REVIEWED)
    print(
        f"vLLM variables: {len(names)}; allowed {len(allowed)}; refused by kind "
        f"{len(names) - len(allowed) - refused_unreviewed}; refused as not reviewed {refused_unreviewed}"
    )


def test_every_ray_torch_and_nccl_variable_the_docs_name_is_classified():
    words = re.compile(
        r"\b(?:RAY|TORCH|TORCHINDUCTOR|PYTORCH|NCCL|CUDA|OMP|UCX|GLOO|TP|HF|OTEL|MALLOC)_[A-Za-z0-9_]*[A-Za-z0-9]\b"
    )
    names = set()
    for page in [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]:
        names |= set(words.findall(page.read_text()))
    assert {"RAY_ADDRESS", "NCCL_DEBUG", "NCCL_IB_HCA", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_EXTENSIONS_DIR"} <= names
    verdicts = {name: verdict(name) for name in sorted(names)}
    assert all(why for _, why in verdicts.values())
    # operations.md tells the operator to forward NCCL_DEBUG=INFO
    assert verdicts["NCCL_DEBUG"][0]
    risky = [name for name, (ok, _) in verdicts.items() if ok and dangerous(name)]
    assert risky == [], f"allowed, yet the name says it is a path, address, Ray's configuration or a secret: {risky}"
    every_allowed_name = [name for family in ALLOWED for name in family.names]
    assert [name for name in every_allowed_name if dangerous(name)] == []


def test_the_allow_list_never_holds_a_name_of_a_refused_kind():
    """A name in a family that REFUSED_NAMES (or the profiles) refuses would be dead data, or a hole."""
    dead = [name for family in ALLOWED for name in family.names if refused_kind(name) or name in profile_env_names()]
    assert dead == []
    assert len({family.title for family in ALLOWED}) == len(ALLOWED) and all(f.why for f in ALLOWED)
    assert all(why for _, why in REFUSED_NAMES)


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_the_issues_names_are_refused_unit(name):
    assert refusal(name), name


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_each_refused_name_stops_start_with_one_line_and_nothing_started(tmp_path, name):
    """The real CLI: `dspark start` with the name forwarded (and set in the launcher's environment) exits 2 with
    one line naming the setting, its file:line, the name and what is allowed; the head's interpreter never ran."""
    marker = tmp_path / "head-python-ran"
    head_python = tmp_path / "python"
    head_python.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    head_python.chmod(0o755)
    env_file = tmp_path / "dspark.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\n"
        f"DSPARK_HEAD_PYTHON={head_python}\nDSPARK_STATE_DIR={tmp_path / 'state'}\n"
        f"DSPARK_FORWARD_ENV=NCCL_DEBUG {name}\n"
    )
    env_file.chmod(0o600)
    value = str(tmp_path) if name in ("TMPDIR", "TMP", "TEMP", "RAY_TMPDIR") else "forwarded-value"
    proc = run_dspark(["start", "--env-file", str(env_file)], env={name: value, "NCCL_DEBUG": "INFO"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dspark: error: DSPARK_FORWARD_ENV from {env_file}:6 names {name}: ")
    assert "; allowed: the reviewed names" in lines[0] and "NCCL_DEBUG" in lines[0]
    assert not marker.exists() and not (tmp_path / "state").exists()
