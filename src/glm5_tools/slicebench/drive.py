"""Profiler captures of a served step under a chosen load (vLLM 0.20.2's torch profiler).

The server runs with ``--profiler-config '{"profiler": "torch", "torch_profiler_dir": DIR,
"torch_profiler_with_stack": false, "ignore_frontend": true, "max_iterations": N}'``, which
adds ``POST /start_profile`` and ``/stop_profile``; each start records the next N engine
steps of the worker and writes one ``*.pt.trace.json.gz`` under DIR. A capture here:

- ``decode-c1`` / ``decode-cB``: B streamed requests (random prompt ids of
  ``--prompt-len`` tokens, ``ignore_eos``), profiling started once every one of them has
  its first token, so that every recorded step is a decode step of batch B;
- ``prefill``: profiling started, then one request of ``--chunk`` prompt tokens and one
  output token: its prefill is one chunk (the server's ``max_num_batched_tokens``);
- ``prefill-cB``: profiling started, then B requests of ``--prompt-len`` prompt tokens and
  one output token each, sent at once (a batch of prompts, as a concurrency point's first
  wave); their prompts are drawn for this capture (no prefix-cache hit), and meta.json
  has each one's first token, in seconds from the send.

Only the standard library: it runs with the GPU machine's own Python.
``python -m glm5_tools.slicebench drive --url URL --key-file F --model NAME --trace-dir DIR
--out OUT [--captures decode-c1,decode-c64,prefill] [--chunk 8192] [--vocab 154880]``
writes OUT/<capture>/trace.json.gz and OUT/<capture>/meta.json.
"""

from __future__ import annotations

import http.client
import json
import random
import shutil
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Capture:
    label: str
    kind: str  # decode | prefill
    batch: int
    prompt_len: int
    max_tokens: int
    tokens_per_step: int


def parse_captures(spec: str, *, prompt_len: int, chunk: int, decode_tokens: int) -> list[Capture]:
    out = []
    for label in [s for s in spec.split(",") if s]:
        if label == "prefill":
            out.append(Capture(label, "prefill", 1, chunk, 1, chunk))
        elif label.startswith("prefill-c") and label[len("prefill-c"):].isdigit():
            b = int(label[len("prefill-c"):])
            out.append(Capture(label, "prefill", b, prompt_len, 1, min(chunk, b * prompt_len)))
        elif label.startswith("decode-c") and label[len("decode-c"):].isdigit():
            b = int(label[len("decode-c"):])
            out.append(Capture(label, "decode", b, prompt_len, decode_tokens, b))
        else:
            raise ValueError(f"drive: capture {label!r}: expected prefill, prefill-c<batch> or decode-c<batch>")
    return out


class Server:
    def __init__(self, url: str, key: str, model: str) -> None:
        self.url, self.key, self.model = url.rstrip("/"), key, model

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 600) -> int:
        req = urllib.request.Request(self.url + path, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.key}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return int(resp.status) == 200
        except OSError:
            return False

    def stream(self, prompt: list[int], max_tokens: int, first: threading.Event, stop: threading.Event,
               first_at: list[float] | None = None) -> None:
        """One streamed completion; sets ``first`` at its first chunk (and appends
        time.monotonic() then to ``first_at``), returns when done or when ``stop`` is set
        (closing the connection aborts the request in vLLM)."""
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=600)
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True}
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"drive: completion answered {resp.status}: {resp.read()[:300]!r}")
            while not stop.is_set():
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    if first_at is not None and not first.is_set():
                        first_at.append(time.monotonic())
                    first.set()
        finally:
            first.set()
            conn.close()


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256, vocab - 256) for _ in range(n)]  # no added or padding ids


def _new_trace(trace_dir: Path, before: set[Path], timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = sorted(set(trace_dir.glob("*.pt.trace.json*")) - before, key=lambda p: p.stat().st_mtime)
        if new:
            size = -1
            while new[-1].stat().st_size != size:  # written in one go by the exporter; wait until it stops growing
                size = new[-1].stat().st_size
                time.sleep(1.0)
            return new[-1]
        time.sleep(0.5)
    raise TimeoutError(f"drive: no new trace under {trace_dir} after {timeout:.0f} s")


def run_capture(server: Server, cap: Capture, trace_dir: Path, out: Path, *, vocab: int, seed: int,
                settle_s: float = 3.0, trace_timeout: float = 180.0) -> dict[str, Any]:
    before = set(trace_dir.glob("*.pt.trace.json*"))
    stop = threading.Event()
    t0 = time.monotonic()
    threads = []
    extra: dict[str, Any] = {}
    if cap.kind == "decode":
        firsts = []
        for i in range(cap.batch):
            ev = threading.Event()
            th = threading.Thread(target=server.stream, daemon=True,
                                  args=(random_prompt(cap.prompt_len, vocab, seed + i), cap.max_tokens, ev, stop))
            th.start()
            threads.append(th)
            firsts.append(ev)
        for ev in firsts:
            ev.wait(600)
        time.sleep(0.5)  # past the last prefill chunk
        server.post("/start_profile")
        time.sleep(settle_s)
        server.post("/stop_profile")
    elif cap.batch == 1:
        server.post("/start_profile")
        ev = threading.Event()
        server.stream(random_prompt(cap.prompt_len, vocab, seed), 1, ev, stop)
        server.post("/stop_profile")
    else:
        server.post("/start_profile")
        first_at: list[float] = []
        sent = time.monotonic()
        for i in range(cap.batch):  # prompts of their own: no other capture sends them
            th = threading.Thread(target=server.stream, daemon=True,
                                  args=(random_prompt(cap.prompt_len, vocab, seed + 10_000 + i), 1,
                                        threading.Event(), stop, first_at))
            th.start()
            threads.append(th)
        for th in threads:
            th.join(600)
        extra["first_token_s"] = sorted(round(t - sent, 4) for t in first_at)
        server.post("/stop_profile")
    stop.set()
    for th in threads:
        th.join(30)
    trace = _new_trace(trace_dir, before, trace_timeout)
    dest = out / cap.label
    dest.mkdir(parents=True, exist_ok=True)
    suffix = ".json.gz" if trace.name.endswith(".gz") else ".json"
    shutil.move(str(trace), dest / f"trace{suffix}")
    meta = {**asdict(cap), **extra, "seconds": round(time.monotonic() - t0, 1)}
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta
