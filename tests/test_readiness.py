"""Start's readiness survives a slow first request.

A real loopback server (tests/support/fake_api.py) stands in for vLLM's API, started through the head's
real agent as `launch` starts `vllm serve`; `serve.start.wait_until_serving` waits for it as it waits for vLLM:
/health, /v1/models, then the one-token chat completion, whose answers follow a script. The server's life
is asked of the agent, as in a start.
"""

from __future__ import annotations

import re
import secrets
import sys
import time
from pathlib import Path

import pytest

from dspark_launch.agent.protocol import Spawn
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.cluster.state import ServerRecord, SessionRecord, recorded
from dspark_launch.serve import readiness
from dspark_launch.serve.running_server import ServeFailure
from dspark_launch.serve.serve_spec import ServeSpec
from dspark_launch.serve.start import Ready, wait_until_serving
from dspark_launch.serve.stop import stop_server
from tests.support.paths import REPO

FAKE_API = REPO / "tests" / "support" / "fake_api.py"
SERVED = "tiny"
KEY = "sk-readiness-test-0123"
# Short first timeouts, growing to room enough for a loopback answer on a busy host.
QUICK = readiness.Backoff(first_timeout_s=3, max_timeout_s=60, first_pause_s=0.2, max_pause_s=0.5, check_s=0.5)


class Recorder:
    def __init__(self):
        self.phases: list[str] = []
        self.waits: list[tuple[str, float, float]] = []

    def phase(self, message: str) -> None:
        self.phases.append(message)

    def waiting(self, message: str, elapsed: float, timeout: float) -> None:
        self.waits.append((message, elapsed, timeout))

    def warn(self, message: str) -> None:
        self.phases.append(f"warning: {message}")


class Served:
    """The fake API started through the head's agent, recorded as `launch` records vllm serve."""

    def __init__(self, tmp_path: Path, script: str):
        state_dir = tmp_path / "state"
        (state_dir / "logs").mkdir(parents=True, mode=0o700)
        self.spec = ClusterSpec(
            nodes=(Node("head", "127.0.0.1", None, LocalTransport(sys.executable)),),
            ray_port=6379,
            ray_address="127.0.0.1:6379",
            fabric_ifname="lo",
            node_env=(),
            forwarded=(),
            gpus_per_node=1,
            object_store_bytes=0,
            auth_mode="token",
            dashboard="off",
            state_dir=state_dir,
            join_timeout_s=10,
            ssh_timeout_s=10,
            config_digest="test",
        )
        self.log = state_dir / "logs" / "fake-api.log"
        self.head = self.spec.head.agent()
        marker = f"dspark-readiness-{secrets.token_hex(4)}-server"
        answer = self.head.call(
            Spawn((sys.executable, str(FAKE_API), SERVED, "1", script), {}, marker, str(self.log)), "fake api"
        )
        self.server = ServerRecord(
            marker=marker,
            log=str(self.log),
            url="",
            served_name=SERVED,
            model=SERVED,
            started_at=time.time(),
            settings={},
            digest="test",
            cap=1,
            pid=answer.process.pid,
            start_time=answer.process.start_time,
            boot_id=answer.process.boot_id,
            sessions=[recorded(SessionRecord, answer.session)],
            chat=True,
        )
        self.port = 0

    def listening(self) -> Served:
        self.port = int(self._wait_for(r"listening on (\d+)").group(1))
        self.server.url = f"http://127.0.0.1:{self.port}"  # as `launch` records the serve spec's
        return self

    def _wait_for(self, pattern: str) -> re.Match:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"the fake API never wrote {pattern!r}: {self.text()}")

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def serve_spec(self, start_timeout_s: int) -> ServeSpec:
        return ServeSpec(
            serve_args=(SERVED,),
            env=(),
            host="127.0.0.1",
            port=self.port,
            served_name=SERVED,
            model=SERVED,
            cap=1,
            client_key=KEY,
            start_timeout_s=start_timeout_s,
            health_timeout_s=5,
            chat=True,
        )

    def wait(self, reporter: Recorder, start_timeout_s: int = 120, backoff: readiness.Backoff = QUICK) -> Ready:
        return wait_until_serving(
            self.spec, self.serve_spec(start_timeout_s), self.server, self.head, reporter, backoff
        )

    def stop(self) -> None:
        stop_server(self.spec, self.server, grace_s=2)


@pytest.fixture
def served(tmp_path):
    started: list[Served] = []

    def start(script: str) -> Served:
        started.append(Served(tmp_path, script))
        return started[-1].listening()

    yield start
    for one in started:
        one.stop()


def chats(text: str) -> list[str]:
    return re.findall(r"chat request \d+: (\w+)", text)


def test_a_first_answer_that_hangs_then_fails_is_retried_until_one_comes(served):
    api = served("hang,503,ok")
    reporter = Recorder()
    ready = api.wait(reporter)
    answer = ready.first_answer
    assert answer.outcome == readiness.ANSWERED and answer.attempts == 3 and answer.reply.status == 200
    assert chats(api.text()) == ["hang", "503", "ok"]
    # Each failed attempt is said, then the answer with its latency; the wait shows the attempt against the
    # start's timeout meanwhile.
    said = [p for p in reporter.phases if "attempt" in p]
    assert len(said) == 3, reporter.phases
    assert re.fullmatch(
        r"the one-token chat completion: attempt 1: no answer after [\d.]+ s; retrying in \d+ s", said[0]
    ), said
    assert re.fullmatch(
        r"the one-token chat completion: attempt 2: HTTP 503 after [\d.]+ s; retrying in \d+ s", said[1]
    ), said
    assert (
        said[2] == "the one-token chat completion answered (attempt 3); checking that the served scheduler runs "
        "the hotfix"
    ), said
    assert any(
        m == "the one-token chat completion: waiting for the first answer (attempt 1)" and t == 120
        for m, _, t in reporter.waits
    )
    assert answer.latency_s > 0 and answer.waited_s >= answer.latency_s
    assert "cap=1 " in ready.log


def test_an_answer_that_never_comes_ends_at_the_start_timeout(served):
    api = served("hang")
    reporter = Recorder()
    # The timeout counts from the launch: on a busy host the health phase's agent calls take seconds of it.
    with pytest.raises(ServeFailure) as failed:
        api.wait(
            reporter,
            start_timeout_s=30,
            backoff=readiness.Backoff(first_timeout_s=2, max_timeout_s=2, first_pause_s=0.2, check_s=0.5),
        )
    assert re.search(
        r"not ready after 30 s: the API is up but the one-token chat completion got no answer in "
        r"\d+ attempt\(s\)",
        str(failed.value),
    ), failed.value
    assert len(chats(api.text())) >= 2  # retried, not given up after the first


def test_a_refusal_is_final_at_once(served):
    api = served("401")
    with pytest.raises(ServeFailure, match="the one-token chat completion failed: HTTP 401"):
        api.wait(Recorder())
    assert chats(api.text()) == ["401"]


def test_a_server_that_dies_while_an_attempt_hangs_is_reported_at_once(served):
    """Its child keeps the request's connection open: only the life check can see it died."""
    api = served("orphan")
    own_timeout = 120
    began = time.monotonic()
    with pytest.raises(ServeFailure, match="vllm serve exited during start") as failed:
        api.wait(Recorder(), start_timeout_s=600, backoff=readiness.Backoff(first_timeout_s=own_timeout, check_s=0.5))
    assert time.monotonic() - began < own_timeout
    text = api.text()
    assert chats(text) == ["orphan"] and "holds the connection" in text
    assert "client closed" not in text  # reported while the attempt was still in flight
    assert "fake-api.log" in str(failed.value)
