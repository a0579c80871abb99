"""Real serving on loopback: vLLM (CPU) with tensor parallel 2 over a one-node Ray cluster.

The serving test (marker `stack`: `make test-stack`, not in `make test`) starts a real Ray
head (2 fake GPUs), the real vLLM API server with ``--distributed-executor-backend ray --tensor-parallel-size 2`` on the tiny
random model, sends a completion and a chat completion to 127.0.0.1, checks that
both TP workers are Ray actors holding the 2 GPUs, and stops everything by pid.
It needs the CPU test stack (``pip install -e '.[cpu,test]'``) and the test-only
platform plugin (``pip install --no-deps -e tests/vllm_ray_cpu_plugin``); about
1 to 1.5 min on 2 cores. The other tests here are quick checks of the tiny model
and the plugin switch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import serving as sh
from tests.support.tiny_model import build_tiny_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_RAY = importlib.util.find_spec("ray") is not None
HAVE_HF = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "tokenizers"))
PLUGIN_INSTALLED = any(
    ep.name == "dspark_ray_cpu" for ep in importlib.metadata.entry_points(group="vllm.platform_plugins")
)

needs_hf = pytest.mark.skipif(not HAVE_HF, reason="torch/transformers/tokenizers not installed")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm not installed (pip install -e '.[cpu]')")
needs_plugin = pytest.mark.skipif(
    not PLUGIN_INSTALLED,
    reason="test-only plugin not installed: pip install --no-deps -e tests/vllm_ray_cpu_plugin",
)


# ------------------------------------------------------------------ tiny model


@needs_hf
def test_tiny_model_is_small_deterministic_and_idempotent(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b")
    files = sorted(p.name for p in a.iterdir() if p.name != ".dspark-manifest.json")  # names its own folder
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert sum(p.stat().st_size for p in a.iterdir()) < 1_000_000
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["head_dim"] >= 32 and cfg["max_position_embeddings"] >= 512
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    t0 = time.monotonic()
    assert build_tiny_model(a) == a.resolve()
    assert time.monotonic() - t0 < 1.0
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    assert (tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token) == ("<s>", "</s>", "<unk>", "<pad>")
    text = "Hello world, node 42!"
    assert tok.decode(tok(text)["input_ids"]) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>hi</s><|assistant|>"


# ---------------------------------------------------------------- plugin switch

_PLATFORM_PROBE = "from vllm.platforms import current_platform as p; print('@@', type(p).__name__, p.ray_device_key)"


def _probe_platform(enabled: bool) -> str:
    env = dict(os.environ)
    env.pop(sh.PLUGIN_ENV, None)
    env.pop("VLLM_TARGET_DEVICE", None)
    if enabled:
        env[sh.PLUGIN_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", _PLATFORM_PROBE], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("@@")]
    assert lines, out.stderr[-2000:]
    return lines[-1][3:]


@needs_vllm
@needs_plugin
def test_plugin_only_acts_when_enabled() -> None:
    import dspark_ray_cpu_platform as plugin

    assert _probe_platform(enabled=False) == "CpuPlatform "  # stock: empty ray_device_key
    assert _probe_platform(enabled=True) == "RayCpuPlatform GPU"
    old = os.environ.pop(sh.PLUGIN_ENV, None)
    try:
        assert plugin.register() is None
        os.environ[sh.PLUGIN_ENV] = "1"
        assert plugin.register() == plugin.PLATFORM_QUALNAME
    finally:
        os.environ.pop(sh.PLUGIN_ENV, None)
        if old is not None:
            os.environ[sh.PLUGIN_ENV] = old


# -------------------------------------------------------------------- serving

PHASE_LINES = [
    "non-default args:",
    "Starting to load model",
    "Loading weights took",
    "CPU KV cache size:",
    "init engine (profile, create kv cache, warmup model) took",
    "Starting vLLM server on http://127.0.0.1:",
]


@pytest.mark.stack
@pytest.mark.serving
@pytest.mark.loopback
@needs_vllm
@needs_plugin
@pytest.mark.skipif(not HAVE_RAY, reason="ray not installed (pip install -e '.[cpu]')")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_tiny_model_tp2_over_ray_on_loopback(tmp_path: Path, tiny_model: Path) -> None:
    model = tiny_model
    scratch = sh.short_scratch_dir()
    env = sh.base_env(scratch)
    head: sh.RayNode | None = None
    server: sh.ProcRecord | None = None
    recorded: dict[int, int] = {}
    server_log = tmp_path / "vllm.log"
    try:
        head = sh.start_ray_head(scratch, env, tmp_path / "ray-head.log", num_gpus=2)
        port = sh.free_port()
        serve_env = dict(env, RAY_ADDRESS=head.address)
        server = sh.start_process(sh.vllm_serve_argv(model, port, served_name="tiny", tp=2), serve_env, server_log)
        base = f"http://127.0.0.1:{port}"
        sh.wait_http_ready(f"{base}/health", 300, server, log_path=server_log)
        status, body = sh.http_get(f"{base}/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny"]

        status, resp = sh.http_post_json(
            f"{base}/v1/completions", {"model": "tiny", "prompt": "Hello world", "max_tokens": 4, "temperature": 0}
        )
        assert status == 200, resp
        assert resp["choices"][0]["finish_reason"] == "length"
        assert resp["usage"]["completion_tokens"] == 4
        assert isinstance(resp["choices"][0]["text"], str)

        status, resp = sh.http_post_json(
            f"{base}/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4},
        )
        assert status == 200, resp
        assert resp["choices"][0]["message"]["role"] == "assistant"
        assert isinstance(resp["choices"][0]["message"]["content"], str)
        assert resp["usage"]["completion_tokens"] == 4

        # Both TP workers are live Ray actors, each holding one of the 2 (fake) GPUs.
        q = sh.ray_cluster_query(head.address, env)
        assert q is not None
        workers = [
            a for a in q["actors"] if a["class"] in ("RayWorkerProc", "RayWorkerWrapper") and a["state"] == "ALIVE"
        ]
        assert len(workers) == 2, q["actors"]
        assert {w["ip"] for w in workers} == {sh.LOOPBACK_NODE_IP}
        assert q["cluster"].get("GPU") == 2.0 and q["available"].get("GPU", 0.0) == 0.0
        worker_pids = [w["pid"] for w in workers]
        assert all(pid in head.proc.tree() for pid in worker_pids)  # children of our raylet
        recorded = sh.snapshot([*server.tree(), *head.proc.tree()])

        status, metrics = sh.http_get(f"{base}/metrics")
        assert status == 200
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            assert f"\n{name}{{" in metrics.decode(), name

        log = server_log.read_text(errors="replace")
        for phase in PHASE_LINES:
            assert phase in log, phase
    finally:
        left: list[int] = []
        if server is not None:
            left += sh.kill_tree(server, grace=15)
        if head is not None:
            left += sh.kill_tree(head.proc, grace=10)
        shutil.rmtree(scratch, ignore_errors=True)
    assert left == [], f"processes survived teardown: {left}"
    assert sh.survivors(recorded) == []  # API server, EngineCore, Ray head, both TP workers
