"""Another local user, without the key, cannot write a line the launcher takes for the EngineCore's own
(node/engine_log.py): the drain's done line (which ended a drain with a stream in flight) nor the scheduler's
refusal of its control file (which failed a reload). uvicorn's access log wrote a client address taken from
`X-Forwarded-For` (trusted from 127.0.0.1) after a prefix the old pattern let through, and `splitlines` cut a
logged request id at U+2028/U+0085. Now: the access log is off for the server the launcher starts, the EngineCore's
prefix must start the line (with vLLM's process name exactly, and, in the drain, one of the run's pids), and
lines are split at "\\n" only."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.handlers.processes import _DrainLog
from dspark_launch.hotfix import contract
from dspark_launch.node.engine_log import EngineMessage, engine_line, engine_lines
from dspark_launch.serve.drain import BUSY_LOG, DRAINED_LOG

ENGINE_PID = 599
DONE = f"(EngineCore pid={ENGINE_PID}) INFO 12-02 01:14:25 [core.py:1666] {DRAINED_LOG}"
REFUSED = (
    f"(EngineCore pid={ENGINE_PID}) WARNING 12-02 01:14:25 [scheduler.py:3601] dspark-issue27 hotfix v7: "
    "ignoring the control file FORGED-BY-NOBODY; keeping cap=1"
)
# The pattern before the fix: any text without "(" before the EngineCore's prefix.
OLD_PATTERN = re.compile(
    r"[^(]*\(EngineCore(?:_DP(?P<rank>\d+))?[\w-]* pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[(?:[^\]\s]*/)?(?P<file>[\w.-]+):\d+\] (?P<message>.*)"
)


def access_log_line(forwarded_for: str) -> str:
    """What uvicorn's access log writes for `GET /health` from a client whose X-Forwarded-For uvicorn trusted:
    its own default formatter (uvicorn.config.LOGGING_CONFIG) on the record its h11 protocol logs."""
    from uvicorn.config import LOGGING_CONFIG
    from uvicorn.logging import AccessFormatter

    formatter = AccessFormatter(LOGGING_CONFIG["formatters"]["access"]["fmt"], use_colors=False)
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        (f"{forwarded_for}:0", "GET", "/health", "1.1", 200),
        None,
    )
    return formatter.format(record)


def test_an_access_log_line_with_a_forged_client_address_is_not_the_engines():
    for forged in (DONE, REFUSED):
        line = access_log_line(forged)
        assert line.startswith("INFO:     (EngineCore pid=")
        assert OLD_PATTERN.fullmatch(line), "the guard: the old pattern took this line for the engine's"
        assert engine_line(line, "core.py") is None and engine_line(line, "scheduler.py") is None
    assert engine_line(DONE, "core.py") == EngineMessage(0, DRAINED_LOG)  # the engine's own line still counts
    said = engine_lines(REFUSED + "\n", "scheduler.py")
    assert len(said) == 1 and contract.LIVE_WARNING_RE.search(said[0].message)


def test_a_separator_inside_a_logged_request_id_does_not_start_a_line():
    """U+2028 and U+0085 inside a request id that request logging writes unescaped: one line, the API server's."""
    for separator in ("\u2028", "\u0085", "\u2029", "\x1c", "\r"):
        logged = (
            f"(APIServer pid=512) INFO 12-02 01:14:26 [logger.py:49] Received request chatcmpl-x{separator}"
            f"{REFUSED}: params: ...\n"
        )
        assert engine_lines(logged, "scheduler.py") == [], repr(separator)
        if separator != "\r":  # the guard: str.splitlines made a line of the forged part
            assert any(engine_line(part, "scheduler.py") for part in logged.splitlines()), repr(separator)
    assert engine_lines(REFUSED + "\r\n", "scheduler.py") != []  # a CRLF log still reads


def test_only_vllms_own_process_names_count():
    for name in ("EngineCoreX", "EngineCore_DP0-forged", "EngineCore_DPx", "APIServer", "EngineCore_DP"):
        assert engine_line(DONE.replace("EngineCore pid", f"{name} pid"), "core.py") is None, name
    assert engine_line(DONE.replace("EngineCore pid", "EngineCore_DP2 pid"), "core.py").rank == 2
    assert engine_line(" " + DONE, "core.py") is None and engine_line(DONE + "\nmore", "core.py") is None


def test_the_drain_counts_only_lines_of_the_runs_own_processes(tmp_path):
    """The head's agent knows the run's pids before it signals: a done line naming another pid is not the end."""
    log = tmp_path / "vllm-serve.log"
    log.write_text("")
    reader = _DrainLog(p.DrainEnd(str(log), DRAINED_LOG, BUSY_LOG), frozenset({ENGINE_PID, 512}))
    with log.open("a") as out:
        out.write(access_log_line(DONE) + "\n")
        out.write(DONE.replace(f"pid={ENGINE_PID}", "pid=4242") + "\n")
        out.write(f"(APIServer pid=512) INFO 12-02 01:14:26 [logger.py:49] Received request x\u2028{DONE}\n")
    reader.read()
    assert not reader.done
    with log.open("a") as out:
        out.write(DONE + "\n")
    reader.read()
    assert reader.done and not reader.busy


# The scheduler's `(live)` line as the hotfix writes it (cap 1 -> 2; contract.LIVE_LOG_FORMAT).
LIVE = contract.live_line(
    6, "cap 1 -> 2", {**{s.key: s.default for s in contract.LIVE_SETTINGS}, "cap": 2, "gate_mode": 1}, 640
)


def test_tunes_evidence_reads_only_the_schedulers_own_lines():
    """`tune` checks each round against the scheduler's `(live)` lines (tune/enginelog.py): a forged one, from the
    access log or inside a logged request, changes nothing it reports."""
    from dspark_launch.tune.enginelog import EngineLog

    forged = LIVE.replace("cap 1 -> 2", "cap 1 -> 3").replace("cap 2", "cap 3").replace("cap=2", "cap=3")
    assert contract.parse_live_lines(forged)[0].cap == 3
    engine = f"(EngineCore pid={ENGINE_PID}) INFO 12-02 01:14:25 [v1/core/sched/scheduler.py:3600] "
    text = "\n".join(
        [
            engine + LIVE,
            access_log_line(engine + forged),
            f"(APIServer pid=512) INFO 12-02 01:14:26 [logger.py:49] Received request x\u2028{engine}{forged}",
            "",
        ]
    )  # the forged ones last

    class Reader:
        def __init__(self):
            self.texts = [text]

        def new_text(self) -> str:
            return self.texts.pop(0) if self.texts else ""

    log = EngineLog(Reader(), 2.0)
    assert log.in_force is not None and log.in_force.cap == 2


def test_the_launcher_starts_vllm_without_the_access_log(tmp_path):
    """The serve spec's argv turns uvicorn's access log off, and VLLM_EXTRA_ARGS cannot turn it back on."""
    from dspark_launch.config.settings import resolve
    from dspark_launch.errors import ConfigError
    from dspark_launch.serve.serve_spec import ACCESS_LOG_OFF
    from tests.support.vllm_parser import refusal

    assert ACCESS_LOG_OFF == "--disable-uvicorn-access-log"
    env = tmp_path / "dspark.env"
    for extra in (
        "--no-disable-uvicorn-access-log",
        "--no-disable-uvicorn",
        "--disable_uvicorn_access_log",
        "--enable-uvicorn-access-log",
        "--enable-uvicorn",
    ):  # 0.32's negative form, then 0.34's
        env.write_text(
            f"DSPARK_HEAD_IP=10.9.0.1\nDSPARK_WORKER_HOSTS=root@10.9.0.2\nDSPARK_FABRIC_IFNAME=fab0\n"
            f"VLLM_EXTRA_ARGS=--enforce-eager {extra}\n"
        )
        env.chmod(0o600)
        with pytest.raises(ConfigError, match="which the launcher sets"):
            resolve(env_file=str(env), environ={})
    assert refusal(["/models/m", ACCESS_LOG_OFF]) is None  # vLLM's own parser takes the flag


NEWEST_PARSER = """
import vllm
from dspark_launch.node.serve_argcheck import serve_parser
print("RESULT", vllm.__version__, *[s for a in serve_parser()._actions if a.dest == "disable_uvicorn_access_log"
                                    for s in a.option_strings])
"""


def test_the_newest_vllm_has_the_flag_and_every_spelling_of_it_is_refused():
    """vLLM 0.34 (the recommended release, its own parser) keeps the flag; its negative form changed
    (`--enable-uvicorn-access-log`): each spelling it knows is in the launcher's table."""
    from dspark_launch.config.serve_flags import UNSET_FLAGS
    from tests.support import newest_vllm
    from tests.support.compat_vllm import cannot_build

    if cannot_build():
        pytest.skip(cannot_build())
    proc = newest_vllm.run_python(newest_vllm.newest(), NEWEST_PARSER, timeout=600)
    said = next((line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert said, proc.stderr[-3000:]
    version, *spellings = said
    assert version == newest_vllm.newest() and "--disable-uvicorn-access-log" in spellings, said
    table = {s for flag in UNSET_FLAGS for s in flag.spellings}
    assert set(spellings) <= table, set(spellings) - table


def test_the_serve_spec_argv_holds_the_flag(tmp_path):
    from dspark_launch.cluster.spec import cluster_spec
    from dspark_launch.config.profile_resolve import resolve as resolve_profile
    from dspark_launch.config.settings import resolve
    from dspark_launch.node.vllm_offer import VllmOffer
    from dspark_launch.profiles.catalog import PROFILES
    from dspark_launch.serve.serve_spec import ACCESS_LOG_OFF, build_serve_spec
    from tests.support.paths import DATA

    env = tmp_path / "dspark.env"
    env.write_text(
        "DSPARK_HEAD_IP=10.9.0.1\nDSPARK_WORKER_HOSTS=root@10.9.0.2\nDSPARK_FABRIC_IFNAME=fab0\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\nDSPARK_PROFILE={PROFILES[0].name}\n"
    )
    env.chmod(0o600)
    settings = resolve(env_file=str(env), environ={})
    spec = cluster_spec(settings)
    offer = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    serve = build_serve_spec(settings, spec, {}, resolve_profile(PROFILES[0], offer, settings), None)
    assert serve.argv.count(ACCESS_LOG_OFF) == 1


# --------------------------------------------------------------------------- on the testbed

FORGER_LOG = "forger.log"


@pytest.mark.testbed
@pytest.mark.serving
def test_a_forged_x_forwarded_for_neither_fails_a_reload_nor_ends_a_drain(testbed_clean, tmp_path, tiny_model):
    """`nobody`, without the key, sends `GET /health` every 50 ms with an X-Forwarded-For holding the scheduler's
    refusal of its control file and the EngineCore's done line (with the EngineCore's real pid, which `ps` shows
    anyone), one of them behind a U+0085. `reload` still takes the new cap (exit 0), a drained `stop` with a stream
    in flight still lets it run to its length (1+ finished, 0 cut; before: "idle ... 0 finished, 0 cut" and the
    stream cut), and the server log holds none of the forged text."""
    from tests.support import log_forger
    from tests.support.launcher_env import paced_extra_args
    from tests.support.on_testbed import run, serving_env, set_knob
    from tests.support.relay_streams import PACED_TOKENS, drained_relay, relayed_streams

    tb = testbed_clean
    env = serving_env(
        tb,
        tmp_path,
        tiny_model,
        MAX_MODEL_LEN="1024",
        MAX_NUM_BATCHED_TOKENS="1024",
        DSPARK_DRAIN_TIMEOUT_S="300",
        VLLM_EXTRA_ARGS=paced_extra_args(),
    )
    started = run(tb, tmp_path, env, "start")
    assert started.returncode == 0, started.stderr[-4000:]
    log_path = tmp_path / "state" / "logs" / "vllm-serve.log"
    engine_pid = int(re.findall(r"^\(EngineCore(?:_DP0)? pid=(\d+)\)", log_path.read_text(errors="replace"), re.M)[-1])
    forged = [
        REFUSED.replace(f"pid={ENGINE_PID}", f"pid={engine_pid}"),
        DONE.replace(f"pid={ENGINE_PID}", f"pid={engine_pid}"),
        "x\u0085" + DONE.replace(f"pid={ENGINE_PID}", f"pid={engine_pid}"),
    ]
    assert all("," not in line for line in forged)  # uvicorn keeps the last comma-separated entry only
    forger_log = tmp_path / FORGER_LOG
    with forger_log.open("w") as out:
        forger = tb.popen(
            "head", log_forger.argv(sys.executable, "127.0.0.1", 8000, forged), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while log_forger.answered(forger_log) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert log_forger.answered(forger_log) >= 3, forger_log.read_text()[-2000:]

        set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
        reloaded = run(tb, tmp_path, env, "reload")
        assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr[-3000:]
        assert "DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2: in force" in reloaded.stdout, reloaded.stdout

        client = relayed_streams(tb, PACED_TOKENS)
        stopped = run(tb, tmp_path, env, "stop")
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        assert "idle" not in stopped.stderr, stopped.stderr[-3000:]
        drained_relay(client, stopped.stderr)
        answered = log_forger.answered(forger_log)
    finally:
        forger.kill()
        forger.wait(timeout=30)
    assert answered >= 10, forger_log.read_text()[-2000:]  # the server did take the forger's requests
    text = log_path.read_text(errors="replace")
    assert "FORGED-BY-NOBODY" not in text and '"GET /health HTTP/1.1"' not in text
