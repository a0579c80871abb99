"""Streaming chat requests against a server, run as a script inside a testbed node (stdlib only).

    python stream_client.py URL KEY MODEL COUNT MAX_TOKENS [relay]

Prints `first I` when stream I got its first token (so a test knows they are all in flight), then one
JSON line per stream when all ended: index, tokens received, the last finish_reason seen (None when
the stream was cut before one came), the HTTP status and any error.

`relay`: one stream at a time, each sent as soon as the previous ended, until one fails (the server
draining or gone refuses it) or RELAY_MAX were sent: a stream is in flight whenever the server takes
requests, however fast the tiny model streams and however long a command takes to reach its drain.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request


def one(url: str, key: str, model: str, index: int, max_tokens: int, results: list, lock: threading.Lock) -> None:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Tell a story ({index})."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    result = {"index": index, "tokens": 0, "finish_reason": None, "status": 0, "error": None}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=300) as reply:
            result["status"] = reply.status
            for raw in reply:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                for choice in chunk.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        result["tokens"] += 1
                        if result["tokens"] == 1:
                            with lock:
                                print(f"first {index}", flush=True)
                    if choice.get("finish_reason"):
                        result["finish_reason"] = choice["finish_reason"]
                if "error" in chunk:
                    result["error"] = str(chunk["error"])[:200]
    except Exception as exc:  # the outcome of a cut stream, reported as data
        result["error"] = f"{type(exc).__name__}: {exc}"[:200]
    results.append(result)


RELAY_MAX = 200


def relay(url: str, key: str, model: str, max_tokens: int, results: list, lock: threading.Lock) -> None:
    for index in range(RELAY_MAX):
        one(url, key, model, index, max_tokens, results, lock)
        if results[-1]["error"] is not None:
            return


def main() -> None:
    url, key, model, count, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    results: list = []
    lock = threading.Lock()
    if sys.argv[6:] == ["relay"]:
        relay(url, key, model, max_tokens, results, lock)
        for result in results:
            print(json.dumps(result), flush=True)
        return
    threads = [threading.Thread(target=one, args=(url, key, model, i, max_tokens, results, lock)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in sorted(results, key=lambda r: r["index"]):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
