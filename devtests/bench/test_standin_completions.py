"""vllm_probe_standin (TEST DOUBLE of `vllm serve`) answers what a load generator needs:
streamed completions with usage, /metrics in vLLM's Prometheus names, max_model_len in
/v1/models; the key is required as vLLM requires it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from glm5_tools.bench.metrics import parse, server_view
from glm5_tools.probe.standin import make_handler


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler("k", ["glm-5"], 4096))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _post(url: str, body: dict, key: str | None = "k") -> urllib.request.Request:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), headers)


def test_streamed_completion_with_usage(server: str) -> None:
    before = urllib.request.urlopen(f"{server}/metrics").read().decode()
    body = {"model": "glm-5", "prompt": "x" * 400, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    events = [line[6:] for line in urllib.request.urlopen(_post(server, body)).read().decode().split("\n\n")
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:5]] == [" standin"] * 5
    assert chunks[4]["choices"][0]["finish_reason"] == "length"
    assert chunks[5] == {**chunks[5], "choices": [], "usage": {"completion_tokens": 5}}
    # The same prompt again: its blocks are prefix-cache hits.
    urllib.request.urlopen(_post(server, {**body, "stream": False})).read()
    after = urllib.request.urlopen(f"{server}/metrics").read().decode()
    view = server_view(before, after)
    assert view.generation_tokens == 10 and view.prompt_tokens == 200
    # 400 characters: 6 whole blocks of 64 (16 tokens each), twice; the second time all hit.
    assert view.prefix_cache_queries == 192 and view.prefix_cache_hits == 96
    assert parse(after)["vllm:request_success_total"] == 2
    models = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{server}/v1/models", headers={"Authorization": "Bearer k"})).read())
    assert models["data"][0]["max_model_len"] == 4096


@pytest.mark.parametrize(
    ("body", "key", "status"),
    [
        ({"model": "glm-5", "prompt": "hi", "max_tokens": 1}, None, 401),
        ({"model": "other", "prompt": "hi", "max_tokens": 1}, "k", 404),
        ({"model": "glm-5", "prompt": "x" * 40000, "max_tokens": 1}, "k", 400),
        ({"model": "glm-5", "max_tokens": 1}, "k", 400),
    ],
)
def test_refusals(server: str, body: dict, key: str | None, status: int) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(_post(server, body, key))
    assert err.value.code == status
