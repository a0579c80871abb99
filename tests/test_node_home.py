"""HOME for Ray and vllm serve is the node user's own: from its passwd entry, never the
caller's shell. With `sudo -E` the shell keeps another account's HOME, and root's vLLM, Triton, compile and
remote-code module caches would sit there, in a folder that account controls."""

from __future__ import annotations

import os
import pwd
import sys

from dspark_launch.agent import protocol as p
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.cluster.spec import Node
from dspark_launch.config.forward_env import refusal


def test_processes_the_agent_starts_get_the_users_own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "someone-elses-home"))  # as `sudo -E` leaves it
    monkeypatch.setenv("USER", "someone")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    agent = Node("head", "127.0.0.1", None, LocalTransport(sys.executable)).agent()
    answer = agent.call(
        p.Run(
            ("/bin/sh", "-c", 'echo "HOME=$HOME USER=$USER LOGNAME=$LOGNAME"'),
            {"HOME": str(tmp_path / "declared")},
            "dspark-home-test-head",
            str(logs / "run.log"),
            30,
        )
    )
    assert answer.returncode == 0
    entry = pwd.getpwuid(os.geteuid())
    assert (logs / "run.log").read_text().strip() == f"HOME={entry.pw_dir} USER={entry.pw_name} LOGNAME={entry.pw_name}"


def test_home_and_the_login_names_are_not_forwarded():
    for name in ("HOME", "USER", "LOGNAME"):
        assert refusal(name)
