"""`dspark bench` and `dspark tune` against a real server on the two-namespace testbed: the tiny
model served with tensor parallel 2 over Ray, the patched scheduler, per-step diagnostics on.

One server for the whole module (a `vllm serve` life costs about 1.5 min here); the tests run in file order
and each leaves the live values as it found them, except the last (`--apply`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from dspark_launch.hotfix import contract
from dspark_launch.node import procfs
from tests.support.launcher_env import scratch
from tests.support.on_testbed import API_KEY, our_pids, popen, run, serving_env, state
from tests.support.processes import describe, wait_until
from tests.support.relay_streams import relayed_streams

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

SPACE = "1:3:2 2:3:2 1:2"  # three points: the cap, then the gate mode, changed
SMALL = ("--requests", "6", "--seconds", "90", "--max-reply-tokens", "8")
LIVE = (contract.ENV_CAP, contract.ENV_GATE_MODE, contract.ENV_AGING)
ENV_HEAD = "# the testbed's cluster\n# the cap, tuned by hand:\nDSPARK_MAX_INFLIGHT_PREFILLS=1  # start low\n"


class Served:
    def __init__(self, tb, folder: Path, env: Path):
        self.tb, self.folder, self.env = tb, folder, env
        self.outputs: list[str] = []  # everything the launcher printed: the key must be in none of it

    def dspark(self, *args: str, timeout: float = 600):
        done = run(self.tb, self.folder, self.env, *args, timeout=timeout)
        self.outputs.append(done.stdout + done.stderr)
        return done

    @property
    def log(self) -> str:
        return (self.folder / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def served(testbed, tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("tune")
    env = serving_env(testbed, folder, tiny_model, MAX_MODEL_LEN="1024", MAX_NUM_BATCHED_TOKENS="256")
    env.write_text(ENV_HEAD + env.read_text())
    server = Served(testbed, folder, env)
    try:
        started = server.dspark("start")
        assert started.returncode == 0, started.stderr[-4000:]
        yield server
    finally:
        server.dspark("stop", "--now")
        left = our_pids(testbed, "head") | our_pids(testbed, "worker1")
        testbed.reset()
        shutil.rmtree(scratch(folder), ignore_errors=True)
        assert left == set(), describe(left)


def in_force_in_log(text: str) -> list[tuple[int, int, float]]:
    """The values each `(live)` line of the engine log put in force, in order."""
    return [(line.cap, line.gate_mode, line.aging) for line in contract.parse_live_lines(text)]


def dedupe(values: list) -> list:
    """Consecutive repeats dropped: a reload to the values already in force may log nothing."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def point_of(key: str) -> tuple[int, int, float]:
    cap, mode, aging = key.split(":")
    return int(cap), int(mode), float(aging)


def test_bench_streams_the_classes_and_the_operators_prompts(served, tmp_path, tiny_model):
    from transformers import AutoTokenizer

    prompts = tmp_path / "prompts.jsonl"
    texts = ["hello world", "tell me about the quick brown fox and the lazy dog " * 4, "what is a cluster node"]
    prompts.write_text("".join(json.dumps({"prompt": t, "max_tokens": 5}) + "\n" for t in texts))
    out = tmp_path / "bench.json"
    # the JSONL and the JSON out live in this test's folder, which the head node sees at the same path
    done = served.dspark(
        "bench",
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--requests",
        "20",
        "--seconds",
        "120",
        "--max-reply-tokens",
        "6",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    result = data["result"]
    assert set(result["classes"]) == {"chat", "document", "agent", "operator"}
    for name, c in result["classes"].items():
        assert c["ok"] >= 1 and c["errors"] == 0 and c["ttft_mean_s"] > 0, (name, c)
    # the operator's prompts were the ones sent: the server counted their tokens as the model's tokenizer does
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    expected = []
    for t in texts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        expected.append(len(ids["input_ids"] if hasattr(ids, "keys") else ids))
    sent = sorted(
        (r["index"], r["prompt_tokens"], r["completion_tokens"]) for r in result["requests"] if r["class"] == "operator"
    )
    assert sent == [(i, n, 5) for i, n in enumerate(expected)], (sent, expected)
    # the long document was a long cold prompt, the agent's later turns resent a growing conversation
    requests = {(r["class"], r["index"]): r for r in result["requests"]}
    assert requests[("document", 0)]["prompt_tokens"] > 300
    agent = [r["prompt_tokens"] for r in result["requests"] if r["class"] == "agent"]
    assert len(agent) >= 2 and agent == sorted(agent) and agent[0] < agent[-1]
    assert "TTFT mean" in done.stdout and "operator" in done.stdout
    print(done.stdout)


def in_engine(served) -> float:
    """Requests the server runs or queues now, from `status --json`'s metrics."""
    view = json.loads(served.dspark("status", "--json").stdout)
    metrics = view["server"]["metrics"]
    return metrics.get("vllm:num_requests_running", 0) + metrics.get("vllm:num_requests_waiting", 0)


def test_tune_refuses_while_other_clients_are_served(served, tmp_path):
    # A relay (one stream after another): a stream is in flight however long the tune command takes to start
    # (two fixed streams could end first on loaded cores, and tune would rightly find nobody served).
    client = relayed_streams(served.tb, 400)
    try:
        before = state(served.folder)["server"]
        refused = served.dspark("tune", "--space", SPACE, "--out", str(tmp_path / "t"), *SMALL)
        assert refused.returncode == 3, refused.stderr[-3000:]
        assert "serving other clients" in refused.stderr and "--while-serving" in refused.stderr
        assert state(served.folder)["server"] == before and not (tmp_path / "t").exists()
    finally:
        client.kill()
        client.communicate(timeout=60)
    # The cut stream is aborted by the server: idle again before the next test's tune looks.
    assert wait_until(lambda: in_engine(served) == 0, 120), "the server still runs the relay's stream"


def test_tune_measures_three_points_in_force_and_restores_the_values(served, tmp_path):
    before_log = len(served.log)
    before_live = state(served.folder)["server"]["live"]
    out = tmp_path / "tune"
    done = served.dspark("tune", "--space", SPACE, "--rounds", "2", "--out", str(out), *SMALL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    print(done.stdout)  # the table: reported (docs/tune.md shows one), never asserted
    assert re.search(r"tune: 3 points x 2 rounds = 6 runs of \d+ requests each .* at most [\d.]+ min", done.stderr)
    assert "tune [6/6]" in done.stderr
    data = json.loads((out / "tune.json").read_text())
    assert (out / "tune.svg").read_text().startswith("<svg")
    keys = [p["point"] for p in data["points"]]
    assert sorted(keys) == sorted(["1:3:2", "2:3:2", "1:2:2"])
    classes = set(data["classes"])
    assert classes == {"chat", "document", "agent"}
    for point in data["points"]:
        assert len(point["rounds"]) == 2 and point["verified_rounds"] == 2, point["rounds"]
        for r in point["rounds"]:
            assert set(r["classes"]) == classes and all(r["classes"][c]["ok"] >= 1 for c in classes), r["classes"]
            assert r["engine_log"]["in_force"] and r["engine_log"]["steps"] > 0
        assert set(point["summary"]) == classes | {"all"}
    assert data["recommendation"]["point"] in keys
    assert "recommended (balanced): " in done.stdout and "why: " in done.stdout

    # The engine log itself: the runs in the order they ran put exactly their values in force, and every
    # scheduler step between two (live) lines ran with the values of the point measured there.
    order = sorted(((r["round"], r["order"], p["point"]) for p in data["points"] for r in p["rounds"]))
    log = served.log[before_log:]
    original = (1, 3, 2.0)
    ran = [original, *(point_of(key) for _, _, key in order), original]
    assert dedupe([original, *in_force_in_log(log)]) == dedupe(ran), (in_force_in_log(log), ran)
    pieces = re.split(r"\(live\); in force: cap (\d+), gate mode (\d+)", log)
    for cap, mode, text in zip(pieces[1::3], pieces[2::3], pieces[3::3]):
        steps = re.findall(r"dspark-issue27 step=\d+ cap=(\d+) .*? mode=(\d+) ", text)
        assert all(s == (cap, mode) for s in steps), (cap, mode, set(steps))
    # the values in force before are back, in the record and on the scheduler
    assert state(served.folder)["server"]["live"] == before_live == {}
    assert "restored the live values in force before" in done.stdout


def test_tune_interrupted_restores_the_values_and_the_key_is_nowhere(served, tmp_path):
    proc = popen(
        served.tb,
        served.folder,
        served.env,
        "tune",
        "--space",
        "2:3:2 3:3:2",
        "--rounds",
        "3",
        "--out",
        str(tmp_path / "t"),
        *SMALL,
    )
    seen, argv_hits = [], []
    try:
        for line in proc.stderr:
            seen.append(line)
            for node in ("head", "worker1"):  # while tune runs: no process shows the key in its argv
                for pid in served.tb.pids_in(node):
                    try:
                        if API_KEY in "\0".join(procfs.cmdline(pid)):
                            argv_hits.append(describe({pid}))
                    except (FileNotFoundError, ProcessLookupError):
                        pass
            if "tune [2/6]" in line:
                time.sleep(1.0)
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    served.outputs.append("".join(seen) + out + err)
    assert proc.returncode == 130, "".join(seen)[-3000:] + err[-3000:]
    assert "tune interrupted (exit 130); the live values in force before are back" in err, err[-3000:]
    assert argv_hits == []
    assert state(served.folder)["server"]["live"] == {}
    last = contract.parse_live_lines(served.log)[-1]
    assert (last.cap, last.gate_mode, last.aging) == (1, 3, 2.0)


def test_tune_apply_writes_the_env_file_and_puts_the_point_in_force(served, tmp_path):
    mode = served.env.stat().st_mode
    out = tmp_path / "tune"
    done = served.dspark(
        "tune", "--space", "2:3:2 3:3:4", "--rounds", "1", "--favor", "throughput", "--apply", "--out", str(out), *SMALL
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    data = json.loads((out / "tune.json").read_text())
    cap, gate, aging = point_of(data["recommendation"]["point"])
    assert data["applied"] and cap in (2, 3)
    text = served.env.read_text()
    assert text.startswith(ENV_HEAD.replace("=1  #", f"={cap}  #")), text[:300]  # its own line, comment kept
    assert served.env.stat().st_mode == mode
    shown = json.loads(served.dspark("config", "show", "--json").stdout)
    by_name = {s["name"]: s for s in shown["settings"]}
    assert (by_name[contract.ENV_CAP]["value"], by_name[contract.ENV_CAP]["source"]) == (str(cap), f"{served.env}:3")
    assert by_name[contract.ENV_AGING]["value"] in (f"{aging:g}", f"{aging:.1f}")
    checked = served.dspark("config", "check")
    assert checked.returncode == 0, checked.stderr
    last = contract.parse_live_lines(served.log)[-1]
    assert (last.cap, last.gate_mode, last.aging) == (cap, gate, aging)  # in force, no restart
    status = json.loads(served.dspark("status", "--json").stdout)
    assert status["server"]["drift"] == [] and status["server"]["cap"] == cap

    # the API key: in no output of any command of this module, no file of the state folder or the tune's
    secret = API_KEY.encode()
    assert all(API_KEY not in o for o in served.outputs)
    for folder in (served.folder / "state", out):
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = Path(dirpath, name)
                if path.is_file() and not path.is_symlink():
                    assert secret not in path.read_bytes(), path
