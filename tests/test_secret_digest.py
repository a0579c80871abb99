"""A rotated key is drift: the deployment record keeps a salted digest of each secret
(never the secret), so `status`, `restart` and `reload` see a new VLLM_API_KEY where the set/unset public
values could not."""

from __future__ import annotations

import json
import time

from dspark_launch import __version__
from dspark_launch.cluster.state import Deployment, ServerRecord, save_state
from dspark_launch.config.secret_digest import ROTATED, compared_values, digest, matches, secret_digests
from dspark_launch.config.settings import resolve
from dspark_launch.serve.restart_kind import reload_changes, restart_kind
from dspark_launch.serve.status import drift
from tests.support.launcher_env import run_dspark

OLD, NEW = "sk-old-key-0123456789", "sk-new-key-9876543210"
CLUSTER = {"DSPARK_HEAD_IP": "127.0.0.1", "DSPARK_WORKER_HOSTS": "127.0.0.2", "DSPARK_FABRIC_IFNAME": "lo"}


def settings(clean_environ, **values):
    return resolve(env_file="/dev/null", environ={**clean_environ, **CLUSTER, **values})


def test_a_digest_is_salted_and_checks_only_its_own_value():
    one, two = digest(OLD), digest(OLD)
    assert one != two and OLD not in one and one.startswith("hmac-sha256:")
    assert matches(one, OLD) and matches(two, OLD) and not matches(one, NEW)
    assert not matches("hmac-sha256:zz:00", OLD) and not matches("", OLD)


def test_a_rotated_key_is_a_change_that_needs_a_restart(clean_environ):
    started = settings(clean_environ, VLLM_API_KEY=OLD)
    recorded = secret_digests(started)
    assert set(recorded) == {"VLLM_API_KEY"} and OLD not in json.dumps(recorded)
    same = settings(clean_environ, VLLM_API_KEY=OLD)
    assert compared_values(same, recorded) == started.public_values()
    rotated = settings(clean_environ, VLLM_API_KEY=NEW)
    assert rotated.public_values() == started.public_values()  # what the launcher compared before
    now = compared_values(rotated, recorded)
    assert now["VLLM_API_KEY"] == ROTATED
    assert [d.name for d in drift(started.public_values(), now)] == ["VLLM_API_KEY"]
    kind = restart_kind(started.public_values(), now, True)
    assert kind.serve_only and "VLLM_API_KEY set -> set (another value)" in kind.line
    changes = reload_changes(started.public_values(), now)
    assert [c.name for c in changes.restart] == ["VLLM_API_KEY"] and not changes.live
    # A configured Ray token that changed takes Ray down too.
    token_then = settings(clean_environ, RAY_AUTH_TOKEN="a" * 40)
    token_now = compared_values(settings(clean_environ, RAY_AUTH_TOKEN="b" * 40), secret_digests(token_then))
    assert not restart_kind(token_then.public_values(), token_now, True).serve_only


def test_reload_names_the_rotated_key_and_changes_nothing(tmp_path, clean_environ):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    env_file = tmp_path / "x.env"
    lines = "".join(f"{k}={v}\n" for k, v in CLUSTER.items()) + f"DSPARK_STATE_DIR={state_dir}\n"
    env_file.write_text(lines + f"VLLM_API_KEY={OLD}\n")
    env_file.chmod(0o600)
    started = resolve(env_file=str(env_file), environ=clean_environ)
    server = ServerRecord(
        marker="dspark-digest-server",
        log="",
        url="http://127.0.0.1:1",
        served_name="tiny",
        model="tiny",
        started_at=time.time(),
        settings=started.public_values(),
        digest="x",
        cap=1,
        control_file=str(state_dir / "control"),
        secrets=secret_digests(started),
    )
    save_state(
        state_dir,
        Deployment(
            ray_address="127.0.0.1:6379",
            config_digest="x",
            started_at=time.time(),
            launcher_version=__version__,
            nodes=[],
            server=server,
        ),
    )
    record = (state_dir / "state.json").read_text()
    assert OLD not in record and "hmac-sha256:" in record
    proc = run_dspark(["reload", "--env-file", str(env_file)])
    assert proc.returncode == 0 and "nothing" in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
    env_file.write_text(lines + f"VLLM_API_KEY={NEW}\n")
    proc = run_dspark(["reload", "--env-file", str(env_file)])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert f"VLLM_API_KEY set -> set (another value) ({env_file}:5)" in errors[0] and "dspark restart" in errors[0]
    assert OLD not in proc.stdout + proc.stderr and NEW not in proc.stdout + proc.stderr
    assert (state_dir / "state.json").read_text() == record
