"""The correctness probe and its garbage detector against a local fake server (a test
double of an OpenAI-compatible endpoint) that answers well, with gibberish, fluently
but wrongly, or with a high perplexity."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from glm5_tools.probe import FIXED_PROMPTS, ApiClient, ApiError, assess_answer, perplexity_from_logprobs, run_probe
from glm5_tools.probe.checks import gibberish_reason

GOOD = {
    "capital": "The capital of France is Paris.",
    "sum": "42",
    "proverb": "doctor",
    "week": "7",
    "gold": "Au",
}
FLUENT_WRONG = {
    "capital": "The capital of France is Lyon.",
    "sum": "The answer is 41.",
    "proverb": "teacher",
    "week": "There are five days in a week.",
    "gold": "Ag",
}
GIBBERISH = "zxcv qwrt bnmk ,,;; ##@@ tktktk xQzVb ppppp"


def _fake_hub_answers(mode: str, prompt: str) -> str:
    name = next(p.name for p in FIXED_PROMPTS if p.prompt == prompt)
    if mode == "gibberish":
        return GIBBERISH
    if mode == "wrong":
        return FLUENT_WRONG[name]
    if mode == "loop":
        return "the answer is the answer is the answer is the answer is the answer is"
    return GOOD[name]


class _FakeOpenAI(BaseHTTPRequestHandler):
    mode = "good"
    key = "k"

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self._reply(401, {"error": "Unauthorized"})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/chat/completions":
            assert body["temperature"] == 0
            text = _fake_hub_answers(self.mode, body["messages"][0]["content"])
            self._reply(200, {"choices": [{"message": {"role": "assistant", "content": text}}]})
        elif self.path == "/v1/completions":
            assert body["echo"] is True
            n = len(body["prompt"].split())
            lp = -6.0 if self.mode == "highppl" else -1.0
            self._reply(200, {"choices": [{"logprobs": {"token_logprobs": [None] + [lp] * n}}]})
        else:
            self._reply(404, {})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_server() -> Iterator[tuple[str, type[_FakeOpenAI]]]:
    handler = type("Handler", (_FakeOpenAI,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def test_good_answers_pass(fake_server):
    url, _ = fake_server
    report = run_probe(ApiClient(url, "k"), "glm-5")
    assert report.ok, report.failures
    assert report.perplexity == pytest.approx(2.718, rel=1e-3)


@pytest.mark.parametrize(("mode", "kind"), [("gibberish", "gibberish"), ("wrong", "wrong"), ("loop", "repetitive")])
def test_bad_answers_fail(fake_server, mode, kind):
    url, handler = fake_server
    handler.mode = mode
    report = run_probe(ApiClient(url, "k"), "glm-5")
    assert not report.ok
    assert {a["verdict"] for a in report.answers} == {kind}


def test_high_perplexity_fails(fake_server):
    url, handler = fake_server
    handler.mode = "highppl"
    report = run_probe(ApiClient(url, "k"), "glm-5", perplexity_threshold=20.0)
    assert [f for f in report.failures if f.startswith("perplexity")]
    assert all(a["verdict"] == "ok" for a in report.answers)


def test_wrong_key_is_an_error(fake_server):
    url, _ = fake_server
    with pytest.raises(ApiError) as exc:
        run_probe(ApiClient(url, "wrong"), "glm-5")
    assert exc.value.status == 401


@pytest.mark.parametrize("text", [
    "The capital of France is Paris.", "Paris", "42", "巴黎是法国的首都。",
    "Certainly! The chemical symbol for gold is Au, from the Latin aurum.",
])
def test_language_is_not_gibberish(text):
    assert gibberish_reason(text) is None


@pytest.mark.parametrize("text", [
    GIBBERISH, "\ufffd\ufffd\ufffd abc", "{{{{}}}}[[[[]]]]<<<<>>>>", "xQzVb kPtRw mNbVc zXcVb",
    "the the the the the the the the the the the the the",
])
def test_gibberish_is_detected(text):
    assert gibberish_reason(text) is not None


def test_fluent_but_wrong_is_wrong():
    prompt = FIXED_PROMPTS[0]
    verdict = assess_answer("The capital of France is Marseille, a lovely city.", prompt)
    assert verdict.kind == "wrong"
    assert "fluent but wrong" in verdict.reason
    assert assess_answer("", prompt).kind == "empty"


def test_perplexity():
    assert perplexity_from_logprobs([None, 0.0, 0.0]) == 1.0
    with pytest.raises(ValueError):
        perplexity_from_logprobs([None])
    with pytest.raises(ValueError):
        perplexity_from_logprobs([None, 0.5])
