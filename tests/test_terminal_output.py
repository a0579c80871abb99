"""What nodes send never reaches the terminal raw, and an agent's reply line is bounded
(docs/security.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.cli.output import fail, printable, say, warn
from dspark_launch.cli.reporter import ConsoleReporter
from dspark_launch.errors import ClusterFailure, DsparkError
from dspark_launch.serve.logfollow import LogReader
from tests.support.launcher_env import run_dspark

HOSTILE = "ok \x1b]0;retitled\x07 \x1b[2J\x1b[31mred\r\u202eevil\x9b1m done"
RAW = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


def _raw_free(text: str) -> bool:
    return not any(char in text for char in RAW)


def test_printable_escapes_every_non_printable_character_but_line_ends_and_tabs():
    shown = printable(HOSTILE + "\n\tnext")
    assert _raw_free(shown) and shown.endswith("\n\tnext")
    assert "\\x1b]0;retitled\\x07" in shown and "\\r" in shown and "\\u202e" in shown and "\\x9b" in shown
    assert printable("plain text, é, 漢字") == "plain text, é, 漢字"


def test_reporter_warnings_and_errors_escape_what_they_show(capsys):
    reporter = ConsoleReporter()
    reporter.phase(f"worker1: {HOSTILE}")
    reporter.warn(HOSTILE)
    reporter.waiting(HOSTILE, 1, 10)
    warn(HOSTILE)
    fail(DsparkError(f"worker1 (10.0.0.2): {HOSTILE}"))
    say(HOSTILE)
    out, err = capsys.readouterr()
    assert _raw_free(out) and _raw_free(err) and err.count("\\x1b]0;retitled") == 5, err


def test_dspark_logs_shows_a_log_with_escape_sequences_escaped(tmp_path):
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    log = state / "logs" / "vllm-serve.log"
    log.write_text(f"line one\n{HOSTILE}\n")
    log.chmod(0o600)
    env_file = tmp_path / "e.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\n"
        f"DSPARK_HEAD_PYTHON={sys.executable}\nDSPARK_STATE_DIR={state}\n"
    )
    env_file.chmod(0o600)
    proc = run_dspark(["logs", "--env-file", str(env_file)])
    assert proc.returncode == 0, proc.stderr
    assert "line one" in proc.stdout and "\\x1b]0;retitled\\x07" in proc.stdout and _raw_free(proc.stdout)


def _fake_agent(tmp_path: Path, line_bytes: int) -> Path:
    """An "interpreter" that answers any request with one line of `line_bytes` bytes."""
    script = tmp_path / f"agent-{line_bytes}"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdin.read()\n"
        f"sys.stdout.write('{{\"answer\": \"' + 'x' * ({line_bytes} - 15) + '\"}}\\n')\n"
    )
    script.chmod(0o755)
    return script


def test_an_agent_reply_line_over_1_mib_is_refused_with_one_clear_error(tmp_path):
    huge = NodeAgent("worker1", LocalTransport(str(_fake_agent(tmp_path, 3 * p.MAX_LINE))))
    with pytest.raises(ClusterFailure) as caught:
        huge.call(p.ReadLog("/nonexistent", 0))
    message = str(caught.value)
    assert "worker1" in message and "longer than 1048576 bytes" in message and len(message) < 500
    lines = []
    LocalTransport(str(_fake_agent(tmp_path, p.MAX_LINE))).exchange("{}", 30, lines.append)
    assert len(lines) == 1 and len(lines[0]) == p.MAX_LINE - 1  # a line of 1 MiB with its newline is read


def test_a_log_of_control_characters_is_read_in_answers_under_the_bound(tmp_path):
    log = tmp_path / "log"
    body = "\x1b" * (p.READ_CHUNK * 2 + 5)  # each one six bytes in the JSON answer (\u001b)
    log.write_text(body)
    agent = NodeAgent("here", LocalTransport(sys.executable))
    assert LogReader(agent, str(log)).refresh() == body
    answer = json.dumps({"answer": {"text": "\x1b" * p.READ_CHUNK, "offset": 0, "error": ""}})
    assert len(answer) < p.MAX_LINE
