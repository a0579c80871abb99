"""The state folder, its files,
the first Ray token, records of other launcher versions, Ray's private temp folders, the systemd unit.

Real code throughout: the real CLI in a subprocess, the real agent operation in process
(its parent folder pointed at a test folder so other users' /tmp stays untouched), the
real `systemd-analyze verify`. Runs as root (like the testbed); a few checks need root to
plant a folder of another user.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.handlers import ray as ray_handlers
from dspark_launch.cluster.state import (
    Deployment,
    NodeRecord,
    ServerRecord,
    StateUnreadable,
    ensure_state_dir,
    load_state,
    ray_token,
    save_state,
)
from dspark_launch.errors import ConfigError
from dspark_launch.node import procfs, ray_dirs
from tests.support.launcher_env import run_dspark

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's folder needs root")


def env_file(tmp_path: Path, state_dir: Path) -> Path:
    path = tmp_path / "t.env"
    path.write_text(
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\n"
        f"DSPARK_STATE_DIR={state_dir}\nSSH_CONNECT_TIMEOUT_S=2\n"
    )
    path.chmod(0o600)
    return path


def dspark(tmp_path: Path, state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_dspark([*args, "--env-file", str(env_file(tmp_path, state_dir))], timeout=120)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def head_only_record(server: ServerRecord | None = None) -> Deployment:
    return Deployment(
        ray_address="127.0.0.1:6379",
        config_digest="x",
        started_at=time.time(),
        launcher_version="0.0-test",
        nodes=[NodeRecord(name="head", ip="127.0.0.1", ssh_host=None, marker="dspark-test-head")],
        server=server,
    )


# --------------------------------------------------------------------------- 6. the state folder


def sticky_tmp_like(tmp_path: Path) -> Path:
    folder = tmp_path / "shared-tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def test_a_shared_tmp_is_refused_and_keeps_its_sticky_bit(tmp_path):
    """DSPARK_STATE_DIR=/tmp (here a folder like it) as root: refused, never chmod-ed."""
    shared = sticky_tmp_like(tmp_path)
    with pytest.raises(ConfigError, match="group or others can write it"):
        ensure_state_dir(shared)
    proc = dspark(tmp_path, shared, "stop")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"DSPARK_STATE_DIR={shared}" in line and "mode 1777" in line
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert list(shared.iterdir()) == []  # nothing written: no lock, no logs/


def test_a_group_writable_or_linked_state_folder_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o770)
    loose.chmod(0o770)
    with pytest.raises(ConfigError, match="mode 0770"):
        ensure_state_dir(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o770
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        ensure_state_dir(link)
    assert list(target.iterdir()) == []


def test_a_new_state_folder_is_created_private(tmp_path):
    os.umask(0o022)
    state_dir = tmp_path / "a" / "b" / "state"
    ensure_state_dir(state_dir)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir / "logs").stat().st_mode) == 0o700
    ensure_state_dir(state_dir)  # an existing safe one is accepted as it is


@needs_root
def test_records_in_a_folder_of_another_user_are_not_trusted(tmp_path):
    """A planted record naming a live process (pid, start time and boot all matching): `stop` from
    a folder owned by someone else must refuse it, not kill the process."""
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        started = procfs.start_time(victim.pid)
        server = ServerRecord(
            marker="dspark-planted-server",
            log="",
            url="http://127.0.0.1:9",
            served_name="x",
            model="x",
            started_at=time.time(),
            settings={},
            digest="x",
            cap=1,
            pid=victim.pid,
            start_time=started,
            boot_id=procfs.boot_id(),
        )
        save_state(planted, head_only_record(server))
        os.chown(planted, NOBODY, NOBODY)
        os.chown(planted / "state.json", NOBODY, NOBODY)
        for command in (["stop"], ["status", "--json"]):
            proc = dspark(tmp_path, planted, *command)
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert f"is owned by uid {NOBODY}" in one_error_line(proc)
        assert victim.poll() is None, "a planted record got a process killed"
    finally:
        victim.kill()
        victim.wait()


def test_a_linked_state_file_is_not_read(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    save_state(tmp_path, head_only_record())  # a valid record, but outside the folder
    (tmp_path / "state.json").rename(elsewhere)
    (state_dir / "state.json").symlink_to(elsewhere)
    with pytest.raises(StateUnreadable, match="state.json: cannot read it"):
        load_state(state_dir)


def test_writes_use_unique_temporary_names_and_never_follow_a_link(tmp_path):
    """A link planted at the old fixed temporary name (state.json.tmp) must not redirect the write."""
    state_dir = tmp_path / "state"
    ensure_state_dir(state_dir)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in ("state.json.tmp", "ray-auth-token.tmp"):
        (state_dir / name).symlink_to(victim)
    save_state(state_dir, head_only_record())
    token = ray_token(state_dir, "", create=True)
    assert victim.read_text() == "precious\n"
    assert load_state(state_dir).launcher_version == "0.0-test"
    assert (state_dir / "ray-auth-token").read_text().strip() == token
    for name in ("state.json", "ray-auth-token"):
        st = os.lstat(state_dir / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    leftovers = [p.name for p in state_dir.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]
    assert leftovers == []


# --------------------------------------------------------------------------- 7. the first Ray token


def _token_at_barrier(state_dir: str, barrier, results) -> None:
    barrier.wait()
    results.put(ray_token(Path(state_dir), "", create=True))


def test_concurrent_first_tokens_agree_with_the_file(tmp_path):
    """Many first starts at the same instant: every one gets the token the file keeps (the launcher
    creates it only under the lock; even without the lock, two creators cannot disagree)."""
    for attempt in range(5):
        state_dir = tmp_path / f"state{attempt}"
        ensure_state_dir(state_dir)
        context = multiprocessing.get_context("fork")
        barrier, results = context.Barrier(12), context.Queue()
        workers = [
            context.Process(target=_token_at_barrier, args=(str(state_dir), barrier, results)) for _ in range(12)
        ]
        for worker in workers:
            worker.start()
        tokens = {results.get(timeout=30) for _ in workers}
        for worker in workers:
            worker.join()
        assert tokens == {(state_dir / "ray-auth-token").read_text().strip()}
        assert len(tokens.pop()) == 64


def test_a_token_is_never_created_outside_the_lock(tmp_path):
    state_dir = tmp_path / "state"
    ensure_state_dir(state_dir)
    assert ray_token(state_dir, "") == ""
    assert not (state_dir / "ray-auth-token").exists()
    assert ray_token(state_dir, "x" * 40) == "x" * 40


# --------------------------------------------------------------------------- 9. records of other versions


def _with_unknown_fields(record: dict) -> dict:
    record["added_by_a_newer_launcher"] = {"nested": [1, 2]}
    record["nodes"][0]["container_image"] = "example/image:1"
    record["nodes"][0]["processes"] = [{"pid": 1, "start_time": 1, "cmd": "x", "future": True}]
    record["server"]["profile"] = "newer"
    return record


def test_a_record_from_another_version_stops_and_reports(tmp_path):
    """Unknown fields at every level: `status` and `stop` work (they crashed with TypeError before)."""
    state_dir = tmp_path / "state"
    ensure_state_dir(state_dir)
    server = ServerRecord(
        marker="dspark-gone-server",
        log=str(state_dir / "logs" / "vllm-serve.log"),
        url="http://127.0.0.1:9",
        served_name="x",
        model="x",
        started_at=time.time(),
        settings={},
        digest="x",
        cap=1,
        pid=2**22 + 7,
        start_time=1,
        boot_id="another-boot",
    )
    save_state(state_dir, head_only_record(server))
    path = state_dir / "state.json"
    path.write_text(json.dumps(_with_unknown_fields(json.loads(path.read_text()))))
    assert load_state(state_dir).server.marker == "dspark-gone-server"
    status = dspark(tmp_path, state_dir, "status", "--json")
    assert "Traceback" not in status.stderr and status.returncode in (0, 1), status.stderr
    assert status.stdout, status.stderr
    assert json.loads(status.stdout)["server"]["state"] == "dead"
    stop = dspark(tmp_path, state_dir, "stop")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "Traceback" not in stop.stderr
    assert not path.exists()  # stopped and cleared


@pytest.mark.parametrize("text", ["{not json", "[]", '{"nodes": 3}', "\x00\x01"])
def test_a_corrupt_record_is_exit_1_naming_the_file(tmp_path, text):
    state_dir = tmp_path / "state"
    ensure_state_dir(state_dir)
    (state_dir / "state.json").write_text(text)
    for command in (["stop"], ["status"]):
        proc = dspark(tmp_path, state_dir, *command)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert str(state_dir / "state.json") in one_error_line(proc)


# --------------------------------------------------------------------------- 1. Ray's private temp folders


@pytest.fixture
def tmp_parent(monkeypatch) -> Path:
    """A folder like /tmp (root's, sticky, world-writable) standing in for the real /tmp: planting a
    link at /tmp/dspark-<uid> would break every other Ray on this machine. Short, as /tmp is."""
    parent = Path(tempfile.mkdtemp(prefix="dr", dir="/tmp"))
    parent.chmod(0o1777)
    monkeypatch.setattr(ray_dirs, "ROOT_PARENT", str(parent))
    monkeypatch.setattr(ray_dirs, "RUN_PARENT", str(parent))  # root's folder: in /run, here beside
    yield parent
    shutil.rmtree(parent)


def prepare(name: str = "abcd1234-head") -> str:
    return ray_handlers.ray_temp_dir(p.RayTempDir(name), lambda progress: None).path


def refusal(name: str = "abcd1234-head") -> str:
    with pytest.raises(p.OperationFailed) as caught:
        prepare(name)
    failure = caught.value.failure
    assert failure.step == "ray temp folder" and "\n" not in failure.detail
    return failure.detail


def test_ray_folders_live_in_a_private_folder(tmp_parent):
    os.umask(0o022)
    path = Path(prepare())
    root = tmp_parent / f"dspark-{os.geteuid()}"
    assert path == root / "abcd1234-head"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.geteuid()
    # What Ray does there (ray._common.utils.try_to_create_directory): makedirs, then chmod 0777; and
    # `ray start`'s record of the last cluster, which the next start must not trip over.
    path.chmod(0o777)
    (path / "ray_current_cluster").write_text("10.213.0.1:6379")
    assert Path(prepare()) == path  # reused: inside the private folder only this user set its mode
    assert not (path / "ray_current_cluster").exists()


def test_a_planted_link_to_etc_is_refused_and_etc_untouched(tmp_parent):
    victim = tmp_parent / "etc-like"
    victim.mkdir(mode=0o755)
    victim.chmod(0o755)
    root = tmp_parent / f"dspark-{os.geteuid()}"
    root.symlink_to(victim)
    assert "symbolic link" in refusal() and str(root) in refusal()
    root.unlink()
    root.mkdir(mode=0o700)
    (root / "abcd1234-head").symlink_to(victim)
    assert "symbolic link" in refusal()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755 and list(victim.iterdir()) == []


@needs_root
def test_a_planted_root_of_another_user_or_open_is_refused(tmp_parent):
    root = tmp_parent / f"dspark-{os.geteuid()}"
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    assert f"owned by uid {NOBODY}" in refusal()
    os.chown(root, os.geteuid(), os.getegid())
    root.chmod(0o755)
    assert "mode 0755" in refusal()
    assert stat.S_IMODE(root.stat().st_mode) == 0o755  # refused, never repaired


@needs_root
def test_roots_private_folder_is_in_run():
    assert ray_dirs.private_root() == Path("/run/dspark-0")


@needs_root
def test_roots_private_folder_is_in_run_and_a_planted_tmp_folder_changes_nothing(tmp_parent, monkeypatch):
    run_stat = os.stat("/run")
    assert run_stat.st_uid == 0 and not run_stat.st_mode & 0o022  # nobody else can create a folder there
    run = tmp_parent / "r"  # short, for Ray's socket paths
    run.mkdir(mode=0o755)
    monkeypatch.setattr(ray_dirs, "RUN_PARENT", str(run))
    old = tmp_parent / "dspark-0"  # the old predictable place, made first by another user
    old.mkdir(mode=0o700)
    os.chown(old, NOBODY, NOBODY)
    path = Path(prepare())
    assert path == run / "dspark-0" / "abcd1234-head"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and old.stat().st_uid == NOBODY
    assert len("/run/dspark-0/abcd1234-worker100") + ray_dirs.SOCKET_TAIL <= ray_dirs.SOCKET_PATH_MAX


def test_a_users_private_folder_has_a_name_nobody_can_plant(tmp_parent, tmp_path, monkeypatch):
    """A user other than root: /tmp/dspark-<random>, the random part kept in their state folder; a
    folder planted at that name (the name guessed or leaked) gets a new name, never a refusal."""
    monkeypatch.setattr(ray_dirs, "_is_root", lambda: False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    first = Path(prepare("ab-h"))
    kept = tmp_path / "state" / "dspark" / "private-tmp-name"
    suffix = kept.read_text().strip()
    assert first == tmp_parent / f"dspark-{suffix}" / "ab-h" and len(suffix) == 8
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    assert Path(prepare("ab-h")) == first  # kept: the same folder every time
    kept.write_text("0badc0de\n")
    planted = tmp_parent / "dspark-0badc0de"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    again = Path(prepare("ab-h"))
    assert again.parent != planted and again.parent.parent == tmp_parent and kept.read_text().strip() != "0badc0de"
    assert stat.S_IMODE(planted.stat().st_mode) == 0o777 and list(planted.iterdir()) == []  # untouched
    assert len("/tmp/dspark-0123abcd/abcd1234-worker100") + ray_dirs.SOCKET_TAIL <= ray_dirs.SOCKET_PATH_MAX


def test_bad_names_and_long_paths_are_refused(tmp_parent):
    assert "refusing folder name" in refusal("../etc")
    assert "refusing folder name" in refusal("a/b")
    assert "too long" in refusal("x" * 40)


# --------------------------------------------------------------------------- 10. the systemd unit


def systemd_words(line: str) -> list[str]:
    """An Exec*= line split as systemd does for these quoted words (double quotes, backslash escapes),
    then %% unescaped, and $$ in the arguments (systemd expands variables there, not in the path)."""
    words = [word.replace("%%", "%") for word in shlex.split(line)]
    return words[:1] + [word.replace("$$", "$") for word in words[1:]]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_with_spaces_verifies(tmp_path):
    home = tmp_path / "my dspark 100%" / "$HOME"
    bin_dir = home / "bin dir"
    bin_dir.mkdir(parents=True)
    launcher = bin_dir / "dspark"
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m dspark_launch "$@"\n')
    launcher.chmod(0o755)
    env = home / ".env dspark"
    env.write_text("")
    proc = run_dspark(
        ["systemd-unit", "--env-file", str(env), "--user", "root"], env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    )
    assert proc.returncode == 0, proc.stderr
    unit = proc.stdout
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["User"] == "root" and lines["SuccessExitStatus"] == "3 143" and lines["Restart"] == "on-failure"
    assert systemd_words(lines["ExecStart"]) == [str(launcher), "start", "--foreground", "--env-file", str(env)]
    assert systemd_words(lines["ExecStop"]) == [str(launcher), "stop", "--env-file", str(env)]
    assert systemd_words(lines["ExecReload"]) == [str(launcher), "reload", "--env-file", str(env)]
    assert lines["WorkingDirectory"].replace("%%", "%") == str(home)
    unit_file = tmp_path / "dspark.service"
    unit_file.write_text(unit + "\n")
    verify = subprocess.run(["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    assert "dspark.service" not in verify.stderr, verify.stderr


def test_systemd_unit_refuses_control_characters_in_every_path(tmp_path):
    evil = tmp_path / "x\nExecStartPre=/path/evil\nX="  # folders "x\nExecStartPre=", "path", "evil\nX="
    evil.mkdir(parents=True)
    env = evil / ".env.dspark"
    env.write_text("")
    proc = run_dspark(["systemd-unit", "--env-file", str(env), "--user", "root"])
    assert proc.returncode == 2 and "env file's path" in one_error_line(proc) and "U+000A" in proc.stderr
    assert "ExecStartPre" not in proc.stdout and proc.stdout == ""
    bin_dir = tmp_path / "bin\rExecStartPre=evil"
    bin_dir.mkdir()
    launcher = bin_dir / "dspark"
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m dspark_launch "$@"\n')
    launcher.chmod(0o755)
    good_env = tmp_path / "e.env"
    good_env.write_text("")
    proc = run_dspark(["systemd-unit", "--env-file", str(good_env)], env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 2 and "launcher's path" in one_error_line(proc) and proc.stdout == ""


def test_systemd_unit_user_defaults_to_you_and_is_checked(tmp_path):
    env = tmp_path / "e.env"
    env.write_text("")
    proc = run_dspark(["systemd-unit", "--env-file", str(env)])
    import getpass

    assert proc.returncode == 0 and f"\nUser={getpass.getuser()}\n" in proc.stdout
    bad = run_dspark(["systemd-unit", "--env-file", str(env), "--user", "root\nExecStartPre=/bin/evil"])
    assert bad.returncode == 2 and "--user=" in one_error_line(bad) and "ExecStartPre" not in bad.stdout
