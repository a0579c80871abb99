"""`dspark config ...` through the real CLI, in subprocesses."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

from dspark_launch.config.registry import load_registry
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from tests.support.launcher_env import run_dspark
from tests.support.paths import REPO


def test_show_on_example_lists_every_knob_with_its_source():
    proc = run_dspark(["config", "show", "--env-file", str(REPO / ".env.dspark.example")])
    assert proc.returncode == 0, proc.stderr
    by_profile = {d.setting for d in DEEPSEEK_V4_FLASH.settings}
    for knob in load_registry().knobs:
        line = next(l for l in proc.stdout.splitlines() if l.split()[:1] == [knob.name])
        expected = "profile deepseek-v4-flash-0731" if knob.name in by_profile else ".env.dspark.example:"
        assert expected in line, line


def show_json(env_file) -> dict[str, dict]:
    proc = run_dspark(["config", "show", "--json", "--env-file", str(env_file)])
    assert proc.returncode == 0, proc.stderr
    return {s["name"]: s for s in json.loads(proc.stdout)["settings"]}


def test_show_marks_the_values_the_profile_replaced_and_keeps_the_operators_lines(tmp_path):
    from_example = show_json(REPO / ".env.dspark.example")
    assert from_example["DSPARK_MODEL"] == {
        "name": "DSPARK_MODEL",
        "value": "deepseek-ai/DeepSeek-V4-Flash-0731",
        "source": "profile deepseek-v4-flash-0731",
        "group": "serving",
        "secret": False,
        "notes": ["the profile replaced the built-in deepseek-ai/DeepSeek-V4-Flash"],
    }
    assert from_example["GPU_MEMORY_UTILIZATION"]["value"] == "0.87"
    assert from_example["VLLM_PORT"]["source"].startswith(str(REPO / ".env.dspark.example"))
    env = tmp_path / "mine.env"
    env.write_text("DSPARK_MODEL=deepseek-ai/DeepSeek-V4-Flash\n")  # written on purpose, equal to the built-in
    env.chmod(0o600)
    mine = show_json(env)
    assert (mine["DSPARK_MODEL"]["value"], mine["DSPARK_MODEL"]["source"]) == (
        "deepseek-ai/DeepSeek-V4-Flash",
        f"{env}:1",
    )
    # The profile's revision pins its own checkpoint only: with another model nothing replaces the empty default.
    assert mine["DSPARK_MODEL_REVISION"]["value"] == "" and mine["DSPARK_MODEL_REVISION"]["source"] == "default"
    got = run_dspark(["config", "get", "MAX_MODEL_LEN", "--env-file", str(env)])
    assert got.stdout.strip() == "1048576" and got.returncode == 0
    got = run_dspark(["config", "get", "DSPARK_SERVED_MODEL_NAME", "--env-file", str(env)])
    assert got.stdout.strip() == "deepseek-v4-flash-0731"


def test_show_json_and_secrets(tmp_path):
    env = tmp_path / "x.env"
    env.write_text("VLLM_API_KEY=sk-abc123\nDSPARK_MAX_INFLIGHT_PREFILLS=7\n")
    env.chmod(0o600)
    proc = run_dspark(["config", "show", "--json", "--env-file", str(env)])
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    by_name = {s["name"]: s for s in data["settings"]}
    assert by_name["VLLM_API_KEY"]["value"] == "set"
    assert by_name["DSPARK_MAX_INFLIGHT_PREFILLS"] == {
        "name": "DSPARK_MAX_INFLIGHT_PREFILLS",
        "value": "3",
        "source": f"{env}:2",
        "group": "hotfix",
        "secret": False,
        "notes": ["clamped"],
    }
    assert "sk-abc123" not in proc.stdout + proc.stderr


def test_check_exit_codes(tmp_path):
    good = tmp_path / "good.env"
    good.write_text("MAX_NUM_SEQS=8\n")
    assert run_dspark(["config", "check", "--env-file", str(good)]).returncode == 0
    warned = tmp_path / "warn.env"
    warned.write_text("DSPARK_MAX_INFLIGHT_PREFILLS=0\n")
    assert run_dspark(["config", "check", "--env-file", str(warned)]).returncode == 0
    assert run_dspark(["config", "check", "--strict", "--env-file", str(warned)]).returncode == 2
    bad = tmp_path / "bad.env"
    bad.write_text("\nDSPARK_MAX_INFLIGHT_PREFILLS=two\n")
    proc = run_dspark(["config", "check", "--env-file", str(bad)])
    assert proc.returncode == 2 and proc.stdout == ""
    errors = [l for l in proc.stderr.splitlines() if l.startswith("dspark: error:")]
    assert len(errors) == 1 and f"{bad}:2" in errors[0] and "two" in errors[0] and "1..3" in errors[0]
    assert "Traceback" not in proc.stderr


def test_get(tmp_path):
    env = tmp_path / "x.env"
    env.write_text("DSPARK_MAX_INFLIGHT_PREFILLS= 2 \n")
    proc = run_dspark(["config", "get", "DSPARK_MAX_INFLIGHT_PREFILLS", "--env-file", str(env)])
    assert (proc.returncode, proc.stdout) == (0, "2\n")
    proc = run_dspark(["config", "get", "DSPARKMAXINFLIGHTPREFILLS", "--env-file", str(env)])
    assert proc.stdout == "2\n"
    proc = run_dspark(["config", "get", "NOPE", "--env-file", str(env)])
    assert proc.returncode == 2 and "NOPE" in proc.stderr


def test_cli_environment_beats_file(tmp_path):
    env = tmp_path / "x.env"
    env.write_text("VLLM_PORT=9000\n")
    proc = run_dspark(["config", "get", "VLLM_PORT", "--env-file", str(env)], env={"VLLM_PORT": "9100"})
    assert proc.stdout == "9100\n" and "overrides" in proc.stderr


def test_init_creates_0600_and_refuses_to_overwrite(tmp_path):
    proc = run_dspark(["config", "init"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    created = tmp_path / ".env.dspark"
    assert stat.S_IMODE(created.stat().st_mode) == 0o600
    assert created.read_bytes() == (REPO / ".env.dspark.example").read_bytes()
    created.write_text("MAX_NUM_SEQS=9\n")
    proc = run_dspark(["config", "init"], cwd=tmp_path)
    assert proc.returncode != 0 and "already exists" in proc.stderr
    assert created.read_text() == "MAX_NUM_SEQS=9\n"
    assert run_dspark(["config", "get", "MAX_NUM_SEQS"], cwd=tmp_path).stdout == "9\n"


def test_version_and_help():
    from dspark_launch import __version__

    assert run_dspark(["--version"]).stdout.strip() == f"dspark-launch {__version__}"
    proc = run_dspark(["--help"])
    assert proc.returncode == 0 and "config" in proc.stdout


HEAVY = ("torch", "vllm", "ray")
PROBE = """
import sys
from dspark_launch.cli.main import app
for args in (["--help"], ["config", "show"], ["config", "show", "--json"], ["config", "check"],
             ["config", "get", "VLLM_PORT"]):
    try:
        app(args, prog_name="dspark")
    except SystemExit:
        pass
print(sorted(m for m in sys.modules if m.split(".")[0] in %r))
""" % (HEAVY,)


def test_config_commands_never_import_heavy_modules():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_check_env_file_dev_null_and_non_regular_files(tmp_path):
    proc = run_dspark(["config", "check", "--env-file", "/dev/null"])
    assert proc.returncode == 0 and "env file /dev/null" in proc.stdout, proc.stderr
    for path, kind in ((tmp_path, "a directory"), (REPO / "nope.env", "no such file")):
        proc = run_dspark(["config", "check", "--env-file", str(path)])
        assert proc.returncode == 2 and kind in proc.stderr and "Traceback" not in proc.stderr


def test_check_bad_characters_in_env_file_are_one_line(tmp_path):
    """Values that used to pass `config check` and crash later (issue 14, point 9)."""
    for text in (
        b"DSPARK_MODEL=/m\x00x\n",
        b"VLLM_API_KEY=sk-\xc3\xa9\n",
        b"RAY_AUTH_TOKEN=x\n",
        "DSPARK_API_KEYS=sk-aaaa\u00a0sk-bbbb\n".encode(),
        b"DSPARK_SSH_OPTIONS=-A\n",
        b"DSPARK_FORWARD_ENV=LD_PRELOAD\n",
        b"VLLM_EXTRA_ARGS=--port 9\n",
    ):
        env = tmp_path / "bad.env"
        env.write_bytes(text)
        env.chmod(0o600)
        proc = run_dspark(["config", "check", "--env-file", str(env)])
        errors = [l for l in proc.stderr.splitlines() if l.startswith("dspark: error:")]
        assert proc.returncode == 2 and proc.stdout == "" and len(errors) == 1, (text, proc.stderr)
        assert f"{env}:1" in errors[0] and "Traceback" not in proc.stderr and "sk-" not in proc.stderr
