"""The watchdog of `start --foreground` without a server: the stall verdict from vLLM's /metrics numbers, what
`status` shows of it, and the supervisor's recoveries (serve-only or full, backoff, the hourly limit, never on a run
an operator took over) over a fake watch and fake restarts. The same on two real nodes: tests/test_watchdog_testbed.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_launch.cluster.state import ServerRecord
from dspark_launch.config.settings import resolve
from dspark_launch.serve import recovery, stall
from dspark_launch.serve.supervise import Lost
from dspark_launch.serve.systemd_unit import unit_text

# What vLLM 0.32's /metrics shows (labels, the counters' _created samples, a data-parallel server's two engines).
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
vllm:num_requests_running{{engine="1",model_name="tiny"}} 0.0
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} 1.0
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {prompt}
vllm:prompt_tokens_created{{engine="0",model_name="tiny"}} 1.7649e+09
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {generated}
vllm:generation_tokens_total{{engine="1",model_name="tiny"}} 5.0
"""


def metrics(running=1, kv=0.25, prompt=100, generated=40) -> str:
    return METRICS.format(running=float(running), kv=kv, prompt=float(prompt), generated=float(generated))


def test_the_counters_are_summed_over_the_engines_and_a_page_without_them_is_no_verdict():
    counters = stall.EngineCounters.parse(metrics(running=2, generated=40))
    assert counters == stall.EngineCounters(
        running=2.0, waiting=1.0, generation_tokens=45.0, prompt_tokens=100.0, kv_cache_usage=0.25
    )
    assert stall.EngineCounters.parse("vllm:num_requests_running 1.0\n") is None
    assert stall.judge(None, None, "m", 0.0, 30)[1].state == "unknown"


def looks(tmp_path: Path, pages: list[tuple[float, str]], timeout: int = 30, marker: str = "run-1") -> list:
    return [stall.look(tmp_path, marker, page, timeout, now=at) for at, page in pages]


def test_an_idle_server_is_never_stalled_and_a_hang_with_requests_running_is(tmp_path):
    idle = looks(tmp_path, [(t, metrics(running=0)) for t in (0, 100, 1000)])
    assert [v.state for v in idle] == ["idle"] * 3
    # Requests arrive at 1002 and nothing moves after 1004: stalled once 30 s passed without a move.
    hung = looks(
        tmp_path,
        [
            (1002, metrics(generated=41)),
            (1004, metrics(generated=42)),
            (1020, metrics(generated=42)),
            (1034, metrics(generated=42)),
            (1040, metrics(generated=42)),
        ],
    )
    assert [v.state for v in hung] == ["progress", "progress", "quiet", "stalled", "stalled"]
    assert (hung[-2].quiet_s, hung[-1].quiet_s, hung[-1].since) == (30, 36, 1004)
    assert hung[-1].line.startswith(
        "engine: stalled for 36 s (DSPARK_STALL_TIMEOUT_S 30): 1 running, 1 waiting; "
        "generated tokens 47, prompt tokens 100, KV cache use 25%"
    )
    # A new server (another marker) starts its own watch.
    assert looks(tmp_path, [(1041, metrics(generated=42))], marker="run-2")[0].state == "quiet"
    # DSPARK_STALL_TIMEOUT_S=0: never judged stalled, still shown.
    assert looks(tmp_path, [(5000, metrics(generated=42))], timeout=0, marker="run-2")[0].state == "quiet"


def test_a_long_prefill_is_progress_though_no_token_counter_moves(tmp_path):
    """vLLM counts a prompt's tokens once, with its first token: a chunked prefill moves only its KV blocks."""
    pages = [(t, metrics(kv=0.01 * (1 + t // 10))) for t in range(0, 300, 10)]
    assert {v.state for v in looks(tmp_path, pages)[1:]} == {"progress"}  # the first look has nothing to compare


def test_status_and_the_supervisor_share_the_progress_point(tmp_path):
    looks(tmp_path, [(0, metrics())])  # the supervisor's look
    later = stall.look(tmp_path, "run-1", metrics(), 30, now=45)  # a status 45 s later, nothing moved since
    assert later.state == "stalled" and later.quiet_s == 45
    (tmp_path / stall.WATCH_FILE).write_text("not json")  # a damaged point is only a lost hint
    (tmp_path / stall.WATCH_FILE).chmod(0o600)
    assert stall.look(tmp_path, "run-1", metrics(), 30, now=50).state == "quiet"


def test_status_shows_the_stall_and_counts_it_degraded():
    from dspark_launch.cli.status_view import status_renderables
    from dspark_launch.serve.status import ServerView, ServiceStatus

    watch = stall.judge(
        stall.ProgressPoint("m", 0, stall.EngineCounters.parse(metrics())),
        stall.EngineCounters.parse(metrics()),
        "m",
        42,
        30,
    )[1]
    view = ServiceStatus(
        state="degraded",
        ray_address="10.9.0.1:6379",
        config_digest="d",
        started_at=1.0,
        checked_at=2.0,
        problems=(),
        nodes=(),
        server=ServerView(state="up", pid=7, url="http://127.0.0.1:8888", engine=watch),
        recoveries=(recovery.Recovery(at=1.0, kind="serve-only", cause="x"),),
    )
    text = "\n".join(getattr(r, "plain", str(r)) for r in status_renderables(view, ".env.dspark", rich=False, now=61.0))
    assert "  engine: stalled for 42 s (DSPARK_STALL_TIMEOUT_S 30): 1 running" in text
    assert "supervisor: 1 recovery(ies) within the last hour; the last 1 min ago, serve-only: x" in text
    data = view.to_data()
    assert data["server"]["engine"]["state"] == "stalled" and data["server"]["engine"]["quiet_s"] == 42
    assert data["server"]["engine"]["counters"]["generation_tokens"] == 45.0
    assert data["recoveries"] == [{"at": 1.0, "kind": "serve-only", "cause": "x"}]


# ----------------------------------------------------------------------------------------------- recoveries


def server(n: int) -> ServerRecord:
    return ServerRecord(
        marker=f"run-{n}",
        log=f"/nonexistent/vllm-serve-{n}.log",
        url="http://127.0.0.1:8888",
        served_name="tiny",
        model="m",
        started_at=0.0,
        settings={},
        digest="d",
        cap=1,
        pid=100 + n,
    )


class Clock:
    def __init__(self):
        self.now = 10_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def run(monkeypatch, tmp_path):
    """`supervise` over fake watches (one loss per entry of `losses`, in order), fake restarts and a fake clock."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    env = tmp_path / "dspark.env"
    env.write_text(f"DSPARK_STATE_DIR={state}\nDSPARK_RECOVERY_LIMIT=2\nDSPARK_RECOVERY_BACKOFF_S=5\n")

    def go(losses: list, ours=lambda marker: True, fail: set[int] = frozenset(), **settings_env):
        settings = resolve(env_file=str(env), environ=settings_env)
        spec = type("Spec", (), {"state_dir": state})()
        clock, restarts, told, watched = Clock(), [], [], []
        queue = list(losses)
        monkeypatch.setattr(recovery, "watch", lambda spec, srv, sleep, engine, nodes: queue.pop(0))
        monkeypatch.setattr(recovery, "engine_look", lambda settings, spec, srv: None)
        monkeypatch.setattr(recovery, "still_ours", lambda spec, marker, sleep: ours(marker))

        def recover(lost, settings, spec, srv, force, reporter):
            restarts.append((lost.kind, srv.marker if srv else None))
            if len(restarts) in fail:
                raise recovery.DsparkError("the head's agent did not answer")
            return server(len(restarts) + 1)

        monkeypatch.setattr(recovery, "_recover", recover)
        ended = recovery.supervise(
            settings, spec, server(1), False, None, told.append, watched.append, clock.sleep, clock
        )
        return ended, restarts, told, watched, clock, state

    return go


STALLED = Lost("stalled", "vllm serve (pid 101) answers but its engine: stalled for 31 s")


def test_each_loss_is_recovered_with_backoff_until_the_hourly_limit(run):
    ended, restarts, told, watched, clock, state = run(
        [STALLED, Lost("exited", "vllm serve (pid 102) exited: x"), STALLED]
    )
    assert restarts == [("stalled", "run-1"), ("exited", "run-2")]  # serve-only both times (recovery._recover)
    assert clock.slept == [2, 2, 1, 2, 2, 2, 2, 2]  # 5 s, then 10 s, in polls of at most SERVER_CHECK_S
    assert told[0] == (
        "vllm serve (pid 101) answers but its engine: stalled for 31 s; serve-only restart in 5 s "
        "(recovery 1 of at most 2 within an hour)"
    )
    assert told[1].startswith("recovered: vllm serve (pid 102) serves at http://127.0.0.1:8888")
    assert "serve-only restart in 10 s (recovery 2 of at most 2" in told[2]
    assert watched == [None, server(2), None, server(3)]
    assert ended.gave_up and ended.server == server(3)
    assert ended.cause.startswith(
        "vllm serve (pid 101) answers but its engine: stalled for 31 s; 2 recoveries within "
        "the last hour already (DSPARK_RECOVERY_LIMIT=2, the first at "
    )
    assert ended.cause.endswith("): giving up")
    kept = json.loads((state / recovery.RECOVERIES_FILE).read_text())
    assert [(r["kind"], r["cause"][:20]) for r in kept] == [
        ("serve-only", "vllm serve (pid 101)"),
        ("serve-only", "vllm serve (pid 102)"),
    ]


def test_recoveries_of_an_earlier_supervisor_count_and_age_out(run, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    recovery._remember(state, recovery.Recovery(10_000.0 - 3_700, "full", "an hour and more ago"))
    recovery._remember(state, recovery.Recovery(10_000.0 - 60, "serve-only", "a minute ago"))
    ended, restarts, *_ = run([STALLED, STALLED])
    assert len(restarts) == 1 and ended.gave_up  # the recovery a minute ago counted, the older one not


def test_a_lost_node_and_a_failed_recovery_get_a_full_restart(run, monkeypatch):
    ended, restarts, told, *_ = run(
        [Lost("ray", "Ray on worker1 (10.9.0.2) is dead under vllm serve (pid 101)"), STALLED], fail={1}
    )
    assert restarts == [("ray", "run-1"), ("failed", None)]
    assert "full restart in 10 s (recovery 2 of at most 2" in told[1]
    assert told[1].startswith("the full restart failed: the head's agent did not answer")


def test_recovery_off_ends_at_the_first_loss_and_a_takeover_is_never_acted_on(run):
    ended, restarts, told, *_ = run([STALLED], DSPARK_RECOVERY_LIMIT="0")
    assert restarts == [] and told == [] and not ended.gave_up and ended.cause == STALLED.cause
    # An operator's command took the run over during the backoff: nothing restarted, TAKEN_OVER.
    ended, restarts, told, *_ = run([STALLED], ours=lambda marker: False)
    assert ended is None and restarts == [] and len(told) == 1
    assert run([None])[0] is None


def test_the_unit_leaves_a_supervisor_that_gave_up_down():
    unit = unit_text(["/usr/bin/dspark"], Path("/srv/d/.env.dspark"), "dspark", 60)
    assert "RestartPreventExitStatus=4\n" in unit and "Restart=on-failure\n" in unit
    assert "StartLimitIntervalSec=3600\nStartLimitBurst=5\n" in unit
    assert unit.index("StartLimitBurst") < unit.index("[Service]")  # a [Unit] setting
