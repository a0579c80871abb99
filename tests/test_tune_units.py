"""`dspark bench` / `dspark tune` without a server (issue 34): the candidates, the recommendation and its
ties, the env-file writer, the operator's prompts, the plot, the statistics."""

from __future__ import annotations

import json
import stat
import xml.etree.ElementTree as ET

import pytest

from dspark_launch.config.env_write import set_values, where_set
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError
from dspark_launch.hotfix import contract
from dspark_launch.serve import http
from dspark_launch.tune import workload as wl
from dspark_launch.tune.loadgen import Outcome
from dspark_launch.tune.plot import svg
from dspark_launch.tune.points import DEFAULT_SPACE, TARGET_SWEEP, Point, parse_space
from dspark_launch.tune.recommend import recommend, spread
from dspark_launch.tune.stats import class_stats, percentile, run_stats
from tests.support.launcher_env import run_dspark

# The key with a port check that lets every request go (the check itself: tests/test_keyed_requests.py).
KEYED = http.Keyed("k-123", lambda ip, port: True)


def test_the_default_space_has_six_points_over_the_three_caps():
    points = parse_space(DEFAULT_SPACE)
    assert len(points) == 6 and {p.cap for p in points} == {1, 2, 3}
    assert Point(2, 3, 8.0) in points and Point(1, 2) in points


@pytest.mark.parametrize(
    "text, why",
    [
        ("1:3 4:3", "out of range"),
        ("1:3 two", "not a point"),
        ("2:9", "out of range"),
        ("1:3:99", "out of range"),
        ("1:3 1:3", "1 point(s)"),
        ("2:4:2:10 2:4:2:100", "out of range"),
        ("2:3:2:100 2:4:2:100", "only gate mode 4 reads"),
    ],
)
def test_a_bad_space_names_the_point_and_what_is_allowed(text, why):
    with pytest.raises(ConfigError) as refused:
        parse_space(text)
    assert why in str(refused.value) and "allowed:" in str(refused.value) and "--space=" in str(refused.value)


def test_aging_outside_mode_3_is_the_running_one_and_values_are_what_reload_writes():
    point = parse_space("1:2:7 2:3:0.5", default_aging=4.0)
    assert point[0] == Point(1, 2, 4.0)
    assert point[1].values() == {
        "DSPARK_MAX_INFLIGHT_PREFILLS": "2",
        "DSPARK_PREFILL_GATE_MODE": "3",
        "DSPARK_PREFILL_AGING": "0.5",
        "DSPARK_TARGET_STEP_MS": "%g" % contract.DEFAULT_TARGET_STEP_MS,
    }


def test_the_target_sweep_is_mode_4_over_its_target_and_each_point_reloads_its_target():
    points = parse_space(TARGET_SWEEP, default_aging=4.0, default_target_ms=150.0)
    assert [p.target_ms for p in points] == [50.0, 100.0, 200.0] and {p.gate_mode for p in points} == {4}
    assert [p.values()["DSPARK_TARGET_STEP_MS"] for p in points] == ["50", "100", "200"]
    assert len({p.key for p in points}) == 3 and "target 50 ms" in points[0].name
    # a point that leaves the target out keeps the running server's, as reload would
    kept = parse_space("2:4 2:4:3", default_target_ms=150.0)
    assert [p.target_ms for p in kept] == [150.0, 150.0] and kept[1].aging == 3.0
    # the server's running values come back as the same point
    assert Point.of(points[0].values()) == points[0]


def outcome(klass, index, sent, first, gap, tokens, status=200):
    chunks = tuple(first + i * gap for i in range(tokens))
    return Outcome(
        klass=klass, index=index, status=status, sent=sent, chunks=chunks, prompt_tokens=10, completion_tokens=tokens
    )


def test_class_statistics_are_measured_from_the_chunk_times():
    runs = [
        outcome("chat", 0, 0.0, 1.0, 0.1, 11),
        outcome("chat", 1, 0.0, 3.0, 0.2, 6),
        Outcome(
            klass="chat",
            index=2,
            status=500,
            sent=0.0,
            chunks=(),
            prompt_tokens=None,
            completion_tokens=None,
            error="HTTP 500",
        ),
    ]
    s = class_stats(runs)
    assert (s.requests, s.ok, s.errors, s.cut) == (3, 2, 1, 0)
    assert s.ttft_mean_s == pytest.approx(2.0) and s.ttft_p90_s == pytest.approx(2.8)
    assert s.itl_max_s == pytest.approx(0.2) and s.itl_p50_s == pytest.approx(0.1)
    assert s.decode_tok_s_per_stream == pytest.approx(7.5)  # (10 tok / 1 s + 5 tok / 1 s) / 2
    assert s.decode_tok_s == pytest.approx(17 / 4.0)  # 17 tokens from the first send (0) to the last chunk (4)
    assert percentile([], 50) is None and percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def stats_with(chat_ttft: float, itl_p99: float, rate: float):
    """A run whose chat first token, p99 gap and decode rate are the given values (gap = itl_p99)."""
    tokens = 5
    o = outcome("chat", 0, 0.0, chat_ttft, itl_p99, tokens)
    span = chat_ttft + (tokens - 1) * itl_p99
    doc = Outcome(
        klass="document",
        index=0,
        status=200,
        sent=0.0,
        chunks=(span,) * 1,
        prompt_tokens=100,
        completion_tokens=max(1, int(rate * span) - tokens),
    )
    return run_stats(["chat", "document"], [o, doc], span)


def test_the_recommendation_is_a_measured_point_and_overlapping_spreads_are_equal():
    a, b, c = Point(1, 3), Point(2, 3), Point(3, 3)
    rounds = {
        a: [stats_with(0.50, 0.010, 10), stats_with(0.60, 0.011, 10)],
        b: [stats_with(0.55, 0.020, 20), stats_with(0.58, 0.022, 20)],  # chat TTFT overlaps a's
        c: [stats_with(0.20, 0.050, 30), stats_with(0.25, 0.060, 30)],
    }
    latency = recommend(rounds, "latency")
    assert latency.point == c and latency.equal == () and "spreads apart" in latency.reason
    del rounds[c]
    tied = recommend(rounds, "latency")
    assert tied.point == a and tied.equal == (b,)  # equal first tokens: the smoother streams decide
    assert "spreads overlap" in tied.reason and "p99 inter-token time" in tied.reason
    assert recommend(rounds, "balanced").point in rounds
    unverified = recommend({a: [], b: rounds[b]}, "throughput")
    assert unverified.point == b


def test_spread_and_overlap():
    assert spread([3.0, 1.0, 2.0]).mid == 2.0 and spread([]) is None
    assert spread([1, 2]).overlaps(spread([2, 3])) and not spread([1, 2]).overlaps(spread([2.5, 3]))


def env_file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / ".env.dspark"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_apply_keeps_comments_order_and_mode_and_config_check_reads_the_new_value(tmp_path):
    text = (
        "# my cluster\nDSPARK_HEAD_IP=127.0.0.1\n# the cap, tuned by hand\n"
        'export DSPARKMAXINFLIGHTPREFILLS="1"   # alias, quoted, commented\nMAX_NUM_SEQS=6\n'
    )
    path = env_file(tmp_path, text, 0o640)
    settings = resolve(env_file=str(path), environ={})
    sources = {n: settings.entries[n].source for n in ("DSPARK_MAX_INFLIGHT_PREFILLS", "DSPARK_PREFILL_GATE_MODE")}
    assert sources["DSPARK_MAX_INFLIGHT_PREFILLS"] == f"{path}:4"
    changes = {
        name: (value, where_set(path, name, sources[name]))
        for name, value in (("DSPARK_MAX_INFLIGHT_PREFILLS", "2"), ("DSPARK_PREFILL_GATE_MODE", "2"))
    }
    inode = path.stat().st_ino
    set_values(path, changes, read_sha256=settings.env_file_sha256, note="set by dspark tune --apply")
    assert path.read_text() == text.replace('"1"', '"2"') + "# set by dspark tune --apply\nDSPARK_PREFILL_GATE_MODE=2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_ino != inode
    path.chmod(0o600)  # the loader's trust rule; the writer kept what it found
    checked = run_dspark(["config", "check", "--env-file", str(path)])
    assert checked.returncode == 0, checked.stderr
    shown = json.loads(run_dspark(["config", "show", "--json", "--env-file", str(path)]).stdout)
    by_name = {s["name"]: s for s in shown["settings"]}
    assert (by_name["DSPARK_MAX_INFLIGHT_PREFILLS"]["value"], by_name["DSPARK_MAX_INFLIGHT_PREFILLS"]["source"]) == (
        "2",
        f"{path}:4",
    )
    assert by_name["DSPARK_PREFILL_GATE_MODE"]["source"] == f"{path}:7"


def test_apply_refuses_a_value_the_environment_sets(tmp_path):
    path = env_file(tmp_path, "DSPARK_MAX_INFLIGHT_PREFILLS=1\n")
    with pytest.raises(ConfigError) as refused:
        where_set(path, "DSPARK_MAX_INFLIGHT_PREFILLS", "environment")
    assert "beats the env file" in str(refused.value)


def test_operator_prompts_are_read_and_a_bad_line_is_named(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "one"}\n\n{"messages": [{"role": "user", "content": "two"}], "max_tokens": 9}\n')
    found = wl.read_prompts(good)
    assert [(r.text, r.messages, r.max_tokens) for r in found] == [
        ("one", (), 128),
        ("", ({"role": "user", "content": "two"},), 9),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "one"}\n{"prompt": "x", "max_tokens": 0}\n')
    with pytest.raises(ConfigError) as refused:
        wl.read_prompts(bad)
    assert f"{bad}:2" in str(refused.value) and "max_tokens=0" in str(refused.value)


def test_the_workload_is_sized_from_the_profile_and_bounded():
    big = wl.build(wl.Profile(max_model_len=131072, budget=8192, threshold=1024, max_num_seqs=6))
    by = {c.name: c for c in big.classes}
    assert by["chat"].lanes == 4 and by["document"].requests[0].prompt_tokens == 4 * 8192 - 64
    assert by["agent"].turns and by["agent"].requests[1].prompt_tokens == 512
    small = wl.build(
        wl.Profile(1024, 256, 32, 6), [wl.Request("operator", 0, 50, text="hi")], max_requests=6, max_reply=8
    )
    assert small.requests <= 8 and {c.name for c in small.classes} == {"chat", "document", "agent", "operator"}
    assert all(r.max_tokens <= 8 for c in small.classes for r in c.requests)
    assert all(r.prompt_tokens + r.max_tokens <= 1024 for c in small.classes for r in c.requests)


def test_the_plot_is_svg_with_a_marker_per_point_and_class():
    a, b = Point(1, 3), Point(2, 3)
    text = svg(
        [a, b],
        {a: spread([0.01, 0.012]), b: spread([0.02])},
        {"chat": {a: spread([0.5]), b: spread([0.4])}, "document": {a: spread([5.0, 6.0]), b: spread([3.0])}},
        b,
        "t",
    )
    root = ET.fromstring(text)
    titles = [el.text for el in root.iter("{http://www.w3.org/2000/svg}title")]
    assert len(titles) == 4 and any(t.startswith("cap 2 mode 3 aging 2: document 3.000 s") for t in titles)
    assert "recommended" in text


class _Streaming:
    """A loopback stand-in for the OpenAI streaming API: `max_tokens` chunks `gap` s apart, then usage."""

    def __init__(self, key: str, gap: float):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append((self.path, self.headers.get("Authorization"), body))
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self.send_response(401)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                import time as _time

                words = sum(len(m["content"].split()) for m in body["messages"])
                usage = {"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": body["max_tokens"]}}
                try:
                    for i in range(body["max_tokens"]):
                        _time.sleep(gap)
                        chunk = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client cut the stream (the time bound)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_load_generator_streams_every_class_and_stays_in_its_bounds():
    from dspark_launch.tune.loadgen import Run, Target

    fake = _Streaming("k-123", gap=0.01)
    try:
        work = wl.build(wl.Profile(1024, 256, 32, 4), max_reply=5)
        run = Run(Target(fake.url, "m", True, KEYED), work, tokens_per_word=1.0, seconds=60)
        outcomes = run.run()
        stats = run_stats(work.names, outcomes, run.ended - run.began)
        assert {o.klass for o in outcomes} == {"chat", "document", "agent"} and all(o.ok for o in outcomes)
        assert all(c.ok == c.requests and c.itl_p50_s > 0 for c in stats.classes.values())
        assert all(
            auth == "Bearer k-123" and body["stream"] and body["stream_options"] == {"include_usage": True}
            for _, auth, body in fake.seen
        )
        agent = [body["messages"] for _, _, body in fake.seen if body["messages"][0]["content"].split()[1] == "agent"]
        assert [len(m) for m in agent] == [1 + 2 * i for i in range(len(agent))]  # the conversation grows
        assert agent[1][:2] == [agent[0][0], {"role": "assistant", "content": "t0 t1 t2 t3 t4 "}]
        doc = [o for o in outcomes if o.klass == "document"]
        assert doc[0].prompt_tokens >= 600  # one word a token here: the planned size was sent

        slow = _Streaming("k-123", gap=0.5)
        try:
            cut = Run(
                Target(slow.url, "m", True, KEYED),
                wl.build(wl.Profile(1024, 256, 32, 4), max_reply=50),
                tokens_per_word=1.0,
                seconds=1.5,
            )
            timed = cut.run()
            assert cut.ended - cut.began < 10 and timed and all(o.cut and not o.error for o in timed)
        finally:
            slow.close()
    finally:
        fake.close()


def test_bench_and_tune_import_neither_vllm_nor_ray_nor_torch():
    import subprocess
    import sys

    code = (
        "import sys; import dspark_launch.tune.tune, dspark_launch.tune.bench, dspark_launch.cli.tune_cmd; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'ray', 'torch', 'transformers'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
