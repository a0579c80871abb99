"""The env file decides which programs run: read only when nobody but this user or root could have
written it (docs/security.md); the example is never read from the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError
from tests.support.launcher_env import run_dspark

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")


def _env(folder: Path, text: str = "VLLM_PORT=9001\n", name: str = ".env.dspark", mode: int = 0o600) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(mode)
    return path


def _folder(parent: Path, name: str, mode: int = 0o700) -> Path:
    folder = parent / name
    folder.mkdir()
    folder.chmod(mode)
    return folder


@as_root
def test_root_plan_in_a_shared_folder_never_runs_another_users_head_python(tmp_path):
    shared = _folder(tmp_path, "shared", 0o1777)
    marker = tmp_path / "ran-as-root"
    evil = shared / "python"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    evil.chmod(0o755)
    planted = _env(
        shared,
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\n"
        f"DSPARK_HEAD_PYTHON={evil}\nDSPARK_STATE_DIR={tmp_path / 'state'}\n",
        mode=0o644,
    )
    os.chown(planted, NOBODY, NOBODY)
    proc = run_dspark(["plan"], cwd=shared)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert len(errors) == 1 and str(planted) in errors[0], proc.stderr
    assert not marker.exists()


@as_root
def test_env_files_another_user_could_write_are_refused(tmp_path, clean_environ):
    refused: list[tuple[Path, str]] = []
    theirs = _env(_folder(tmp_path, "a"))
    os.chown(theirs, NOBODY, NOBODY)
    refused.append((theirs, f"is owned by uid {NOBODY}"))
    refused.append((_env(_folder(tmp_path, "b"), mode=0o620), "mode 0620"))
    refused.append((_env(_folder(tmp_path, "c"), mode=0o602), "mode 0602"))
    refused.append((_env(_folder(tmp_path, "d", 0o775)), "its folder"))
    refused.append((_env(_folder(tmp_path, "e", 0o1777)), "its folder"))
    their_folder = _folder(tmp_path, "f", 0o755)
    in_their_folder = _env(their_folder)
    os.chown(their_folder, NOBODY, NOBODY)
    refused.append((in_their_folder, f"owned by uid {NOBODY}"))
    open_above = _folder(tmp_path, "g", 0o777)
    refused.append((_env(_folder(open_above, "inner")), "could replace"))
    good = _env(_folder(tmp_path, "good"))
    link = _folder(tmp_path, "h", 0o777) / "link.env"
    link.symlink_to(good)
    refused.append((link, "its folder"))
    for path, why in refused:
        with pytest.raises(ConfigError) as caught:
            resolve(env_file=str(path), environ=clean_environ)
        message = str(caught.value)
        assert str(path) in message and why in message and "\n" not in message, (path, message)
    linked = _folder(tmp_path, "i") / "link.env"
    linked.symlink_to(good)
    for accepted in (good, linked):
        assert resolve(env_file=str(accepted), environ=clean_environ).vllm_port == 9001
    assert resolve(env_file=os.devnull, environ=clean_environ).env_file == Path(os.devnull)


@as_root
def test_a_refused_env_file_from_the_working_directory_is_never_used(tmp_path, clean_environ):
    folder = _folder(tmp_path, "cwd", 0o755)
    planted = _env(folder)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="owned by uid"):
        resolve(environ=clean_environ, cwd=folder)
    proc = run_dspark(["config", "check"], cwd=folder)
    assert proc.returncode == 2 and str(planted) in proc.stderr, proc.stderr


def test_without_an_env_file_the_example_is_not_read_from_the_working_directory(tmp_path):
    folder = _folder(tmp_path, "cwd", 0o755)
    _env(folder, "VLLM_PORT=9009\nDSPARK_HEAD_PYTHON=/tmp/not-there\n", name=".env.dspark.example", mode=0o644)
    proc = run_dspark(["config", "show", "--json"], cwd=folder)
    assert proc.returncode == 0, proc.stderr
    import json

    shown = json.loads(proc.stdout)
    values = {entry["name"]: (entry["value"], entry["source"]) for entry in shown["settings"]}
    assert shown["env_file"] is None and not shown["from_example"]
    assert values["VLLM_PORT"] == ("8888", "default") and values["DSPARK_HEAD_PYTHON"][1] == "default"
    assert any(w.startswith("no env file") for w in shown["warnings"])
    proc = run_dspark(["config", "get", "VLLM_PORT"], cwd=folder, env={"VLLM_PORT": "9010"})
    assert proc.stdout == "9010\n"
