"""glm5_tools.slicebench.drive against a double of vLLM's API (/v1/completions streamed,
/start_profile and /stop_profile; the double writes a trace where vLLM's profiler would)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trace_maker as tm

from glm5_tools.slicebench import drive


class _Double:
    """The state a test inspects: which streams had their first token when profiling began."""

    def __init__(self, trace_dir: Path) -> None:
        self.trace_dir = trace_dir
        self.first_sent = 0
        self.at_start: list[int] = []
        self.prompts: list[int] = []
        self.lock = threading.Lock()
        self.n = 0


def _server(double: _Double) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _ok(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self._ok()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            assert self.headers["Authorization"] == "Bearer k"
            if self.path == "/start_profile":
                double.at_start.append(double.first_sent)
                self._ok()
            elif self.path == "/stop_profile":
                double.n += 1
                tm.write_trace(double.trace_dir / f"worker.{double.n}.pt.trace.json.gz", steps=3)
                self._ok()
            else:
                double.prompts.append(len(body["prompt"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                time.sleep(0.05 * (1 + len(double.prompts) % 3))  # prefills of differing length
                try:
                    for i in range(body["max_tokens"]):
                        self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                        self.wfile.flush()
                        if i == 0:
                            with double.lock:
                                double.first_sent += 1
                        time.sleep(0.02)
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def served(tmp_path: Path):
    double = _Double(tmp_path / "trace")
    double.trace_dir.mkdir()
    server = _server(double)
    yield drive.Server(f"http://127.0.0.1:{server.server_address[1]}", "k", "glm-5"), double
    server.shutdown()


def test_decode_profiling_starts_once_every_stream_decodes(served, tmp_path: Path):
    server, double = served
    cap = drive.parse_captures("decode-c4", prompt_len=64, chunk=8192, decode_tokens=200)[0]
    meta = drive.run_capture(server, cap, double.trace_dir, tmp_path / "out", vocab=4096, seed=1, settle_s=0.3)
    assert double.at_start == [4]
    assert double.prompts == [64] * 4
    assert meta["batch"] == 4 and meta["kind"] == "decode" and meta["tokens_per_step"] == 4
    assert (tmp_path / "out" / "decode-c4" / "trace.json.gz").is_file()
    assert not list(double.trace_dir.iterdir())  # moved, so the next capture finds its own
    assert json.loads((tmp_path / "out" / "decode-c4" / "meta.json").read_text())["label"] == "decode-c4"


def test_a_prefill_capture_is_one_chunk_of_prompt_and_one_token(served, tmp_path: Path):
    server, double = served
    cap = drive.parse_captures("prefill", prompt_len=64, chunk=2048, decode_tokens=200)[0]
    meta = drive.run_capture(server, cap, double.trace_dir, tmp_path / "out", vocab=4096, seed=1)
    assert double.at_start == [0] and double.prompts == [2048]
    assert (meta["tokens_per_step"], meta["max_tokens"]) == (2048, 1)


def test_a_batch_of_prompts_is_sent_at_once_with_fresh_prompts(served, tmp_path: Path):
    server, double = served
    cap = drive.parse_captures("prefill-c4", prompt_len=64, chunk=2048, decode_tokens=200)[0]
    meta = drive.run_capture(server, cap, double.trace_dir, tmp_path / "out", vocab=4096, seed=1)
    assert double.at_start == [0] and double.prompts == [64] * 4
    assert (meta["batch"], meta["tokens_per_step"], meta["max_tokens"]) == (4, 256, 1)
    # every first token after the send, the double's prefills 0.05-0.15 s
    firsts = meta["first_token_s"]
    assert len(firsts) == 4 and firsts == sorted(firsts) and firsts[0] > 0.04 and firsts[-1] < 5
    decode = [drive.random_prompt(64, 4096, 1 + i) for i in range(4)]
    assert all(drive.random_prompt(64, 4096, 1 + 10_000 + i) not in decode for i in range(4))


def test_captures_are_named_as_documented():
    caps = drive.parse_captures("decode-c1,decode-c64,prefill", prompt_len=1024, chunk=8192, decode_tokens=512)
    assert [(c.label, c.batch, c.tokens_per_step) for c in caps] == [("decode-c1", 1, 1), ("decode-c64", 64, 64),
                                                                     ("prefill", 1, 8192)]
    assert drive.parse_captures("prefill-c16", prompt_len=1024, chunk=8192, decode_tokens=1)[0].tokens_per_step == 8192
    with pytest.raises(ValueError, match="decode-c<batch>"):
        drive.parse_captures("decode-many", prompt_len=1, chunk=1, decode_tokens=1)
    prompt = drive.random_prompt(100, 154880, 3)
    assert prompt == drive.random_prompt(100, 154880, 3) and min(prompt) >= 256 and max(prompt) < 154880 - 256
