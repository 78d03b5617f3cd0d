"""vllm_probe_standin: a TEST DOUBLE for ``vllm serve``, used where there is no GPU.

It is started by the hardened unit in the molecule containers in place of vLLM and
does, once, what vLLM does when it starts, so that the unit's hardening is only as
tight as vLLM allows: writes its caches (Triton, torch inductor, vLLM, XDG) under the
unit's CacheDirectory, uses /dev/shm (POSIX shared memory), reads /proc, maps
writable+executable memory (JIT compilers), starts many threads, forks a worker
process, opens AF_UNIX and TCP sockets (ZMQ / NCCL bootstrap) and reads the model
files named on its command line. A failed check exits 1 (so the unit fails).

Then it serves ``GET /health`` (no key) and ``GET /v1/models`` (Bearer key from
VLLM_API_KEY, as vLLM does) so that the post-deploy HTTP checks have something real
to talk to. Its /v1/models answer says ``owned_by: vllm_probe_standin`` so the
correctness checks know to skip, and carries ``max_model_len`` as vLLM's does.

For the serving benchmark (playbooks/bench.yml, docs/bench.md) it also answers
``POST /v1/completions`` the way a load generator talks to vLLM (server-sent events,
``stream_options.include_usage``) and ``GET /metrics`` with vLLM's Prometheus names.
It is NOT a model: the text is a fixed filler word, and its timing is a made-up
model of a GPU server (prefill at PREFILL_TPS prompt tokens a second, decode at
DECODE_TPS tokens a second for one stream, each further running stream slowing every
stream by BATCH_SLOWDOWN, and a stream's own context by CONTEXT_SLOWDOWN_TOKENS), with
a prompt's tokens estimated as characters / 4. The
figures a benchmark measures against it measure this double, nothing else.

For a fleet behind vllm-router (molecule/fleet) it answers ``POST /v1/chat/completions``
too (same key check and timing model), holds every completion a further
VLLM_PROBE_STANDIN_LATENCY_MS milliseconds (default 0) so that a router in front of it
has requests to spread and to hold in flight, and counts them in vLLM's gauge
``vllm:num_requests_running`` on /metrics (what a drain waits on). Its non-streamed
completions say ``owned_by`` and ``model`` so the correctness checks know to skip.

Its start-up speaks as vLLM 0.20.2's does (the texts of vLLM's own log lines, with
vLLM's prefix and made-up figures): loading the model, the weights loaded, the KV cache
sized, CUDA graphs captured, the engine and the API server up, "Application startup
complete." (``startup_lines``), so that the readiness waits' phase reports are tested on
the real texts. GLM5_STANDIN_PHASE_S (default 0) waits that many seconds between phases
(a start-up long enough for several progress rounds). GLM5_STANDIN_FAIL=kv_cache stops
the start-up as vLLM does when the KV cache does not fit: its error lines, exit status 1;
under a unit with Restart=on-failure that is a crash loop.

Standard library only; a single file, copied to the host as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import multiprocessing
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import shared_memory
from pathlib import Path

OWNER = "vllm_probe_standin"

# The made-up timing model of the completions endpoint (module docstring); the
# environment may change it (GLM5_STANDIN_PREFILL_TPS, ..._DECODE_TPS, ..._BATCH_SLOWDOWN).
PREFILL_TPS = 20000.0
DECODE_TPS = 200.0
BATCH_SLOWDOWN = 0.05
# Each token of context slows its stream's decode by 1 / CONTEXT_SLOWDOWN_TOKENS.
CONTEXT_SLOWDOWN_TOKENS = 16384.0
# Prefix-cache bookkeeping: a block is this many prompt characters (16 tokens of 4).
BLOCK_CHARS = 64
# KV capacity of the double, in tokens, for vllm:kv_cache_usage_perc.
KV_CAPACITY_TOKENS = 1_000_000
FILLER = " standin"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=OWNER, add_help=False)
    parser.add_argument("model", nargs="?")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--tokenizer")
    parser.add_argument("--hf-config-path")
    parser.add_argument("--chat-template")
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=2048)
    args, _unknown = parser.parse_known_args(argv)
    # `vllm serve MODEL ...`: the stand-in is run as `standin serve MODEL ...` too.
    if args.model == "serve":
        args.model = _unknown[0] if _unknown and not _unknown[0].startswith("-") else None
    return args


def _check_caches() -> str:
    written = []
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        value = os.environ.get(var)
        if not value:
            raise RuntimeError(f"{var} is not set")
        path = Path(value)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{OWNER}.probe").write_text("cache write ok\n")
        written.append(value)
    return ", ".join(written)


def _check_shm() -> str:
    seg = shared_memory.SharedMemory(create=True, size=1 << 20)
    try:
        buf = seg.buf
        assert buf is not None
        buf[:4] = b"glm5"
        return f"/dev/shm/{seg.name}"
    finally:
        seg.close()
        seg.unlink()


def _check_proc() -> str:
    for name in ("/proc/self/status", "/proc/meminfo", "/proc/cpuinfo", "/proc/self/maps"):
        Path(name).read_bytes()
    Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    return f"{len(os.sched_getaffinity(0))} CPUs"


def _check_wx() -> str:
    prot = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
    region = mmap.mmap(-1, mmap.PAGESIZE, prot=prot)
    region.write(b"\xc3")  # x86 `ret`: the kind of page a JIT writes and then runs
    region.close()
    return "PROT_WRITE|PROT_EXEC page mapped"


def _check_threads(count: int) -> str:
    barrier = threading.Barrier(count + 1, timeout=30)
    threads = [threading.Thread(target=barrier.wait, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    for t in threads:
        t.join()
    return f"{count} threads"


def _child(conn: object) -> None:
    conn.send(os.getpid())  # type: ignore[attr-defined]


def _check_process() -> str:
    ctx = multiprocessing.get_context("spawn")  # vLLM's engine core uses spawn
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,))
    proc.start()
    pid = parent.recv()
    proc.join(30)
    if proc.exitcode != 0:
        raise RuntimeError(f"worker exit code {proc.exitcode}")
    return f"worker pid {pid}"


def _check_sockets() -> str:
    runtime = os.environ.get("RUNTIME_DIRECTORY") or os.environ.get("XDG_RUNTIME_DIR") or "/dev/shm"
    path = Path(runtime.split(":")[0]) / f"{OWNER}.sock"
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cli:
            cli.connect(str(path))
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    return f"AF_UNIX {path}, TCP loopback port {port}"


def _check_model(args: argparse.Namespace) -> str:
    seen = []
    for name in (args.model, args.tokenizer, args.hf_config_path, args.chat_template):
        if not name:
            continue
        path = Path(name)
        if path.is_dir():
            next(iter(path.iterdir()), None)
        else:
            with path.open("rb") as fh:
                fh.read(4096)
        seen.append(name)
    return f"{len(seen)} model paths readable"


def run_checks(args: argparse.Namespace) -> dict[str, str]:
    checks: dict[str, Callable[[], str]] = {
        "caches": _check_caches,
        "shm": _check_shm,
        "proc": _check_proc,
        "wx_memory": _check_wx,
        "threads": lambda: _check_threads(args.threads),
        "process": _check_process,
        "sockets": _check_sockets,
        "model_files": lambda: _check_model(args),
    }
    results: dict[str, str] = {}
    failed = []
    for name, check in checks.items():
        try:
            results[name] = "ok: " + check()
        except Exception as exc:  # every failure is reported, then the start fails
            results[name] = f"FAILED: {type(exc).__name__}: {exc}"
            failed.append(name)
    for name, result in results.items():
        print(f"{OWNER}: {name}: {result}", flush=True)
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        report = Path(state.split(":")[0]) / f"{OWNER}-report.json"
        report.write_text(json.dumps({"failed": failed, "checks": results}, indent=2) + "\n")
    if failed:
        raise SystemExit(f"{OWNER}: start checks failed: {', '.join(failed)}")
    return results


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value else default


class EngineState:
    """What /metrics reports: counters in vLLM's names, kept by the completions path."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.running_tokens = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.request_success = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.seen_blocks: set[bytes] = set()
        self.prefill_tps = _env_float("GLM5_STANDIN_PREFILL_TPS", PREFILL_TPS)
        self.decode_tps = _env_float("GLM5_STANDIN_DECODE_TPS", DECODE_TPS)
        self.slowdown = _env_float("GLM5_STANDIN_BATCH_SLOWDOWN", BATCH_SLOWDOWN)

    def admit(self, prompt: str) -> int:
        """Counts the prompt (tokens, prefix-cache blocks); returns its token estimate."""
        tokens = max(1, len(prompt) // 4)
        digest = hashlib.sha256()
        with self.lock:
            for start in range(0, len(prompt) - BLOCK_CHARS + 1, BLOCK_CHARS):
                digest.update(prompt[start : start + BLOCK_CHARS].encode())
                key = digest.digest()
                self.prefix_queries += BLOCK_CHARS // 4
                if key in self.seen_blocks:
                    self.prefix_hits += BLOCK_CHARS // 4
                else:
                    self.seen_blocks.add(key)
            self.running += 1
            self.running_tokens += tokens
            self.prompt_tokens += tokens
        return tokens

    def token_delay(self, context: int) -> float:
        with self.lock:
            others = max(0, self.running - 1)
        return (1.0 + self.slowdown * others) * (1.0 + context / CONTEXT_SLOWDOWN_TOKENS) / self.decode_tps

    def step(self) -> None:
        with self.lock:
            self.generation_tokens += 1
            self.running_tokens += 1

    def finish(self, tokens: int, generated: int, ok: bool) -> None:
        with self.lock:
            self.running -= 1
            self.running_tokens -= tokens + generated
            if ok:
                self.request_success += 1

    def prometheus(self, name: str) -> str:
        label = f'{{engine="0",model_name="{name}"}}'
        with self.lock:
            rows = [
                ("vllm:num_requests_running", "gauge", self.running),
                ("vllm:num_requests_waiting", "gauge", 0),
                ("vllm:kv_cache_usage_perc", "gauge", self.running_tokens / KV_CAPACITY_TOKENS),
                ("vllm:prefix_cache_queries_total", "counter", self.prefix_queries),
                ("vllm:prefix_cache_hits_total", "counter", self.prefix_hits),
                ("vllm:prompt_tokens_total", "counter", self.prompt_tokens),
                ("vllm:generation_tokens_total", "counter", self.generation_tokens),
            ]
            success = self.request_success
        out = [f"# {OWNER}: a TEST DOUBLE; these figures describe it, not vLLM"]
        for metric, kind, value in rows:
            out += [f"# TYPE {metric} {kind}", f"{metric}{label} {float(value)}"]
        out += [
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{name}"}} {float(success)}',
        ]
        return "\n".join(out) + "\n"


def make_handler(
    api_key: str | None,
    names: list[str],
    max_model_len: int = 2048,
    state: EngineState | None = None,
    latency_s: float = 0.0,
) -> type[BaseHTTPRequestHandler]:
    engine = state or EngineState()

    class Handler(BaseHTTPRequestHandler):
        server_version = OWNER
        # Keep-alive, as vLLM (uvicorn) does: a router reuses its connections. Every
        # answer has a Content-Length, but a stream, which closes its connection.
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path == "/metrics":
                data = engine.prometheus(names[0]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if not self.path.startswith("/v1/"):
                self._send(404, {"error": "not found"})
                return
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": "Unauthorized"})
                return
            if self.path == "/v1/models":
                now = int(time.time())
                cards = [
                    {"id": n, "object": "model", "created": now, "owned_by": OWNER,
                     "max_model_len": max_model_len}
                    for n in names
                ]
                self._send(200, {"object": "list", "data": cards})
                return
            self._send(404, {"error": f"{OWNER} serves no {self.path}"})

        def do_POST(self) -> None:
            # The body is read first, whatever the answer: on a kept-alive connection the
            # next request starts after it.
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            chat = self.path == "/v1/chat/completions"
            if self.path != "/v1/completions" and not chat:
                self._send(404, {"error": f"{OWNER} serves no POST {self.path}"})
                return
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": "Unauthorized"})
                return
            try:
                body = json.loads(raw or b"{}")
                if chat:
                    prompt = "\n".join(str(m.get("content") or "") for m in body["messages"])
                else:
                    prompt = body["prompt"]
                    prompt = prompt if isinstance(prompt, str) else str(prompt[0])
                max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                self._send(400, {"error": f"bad request: {exc}"})
                return
            if body.get("model") not in names:
                self._send(404, {"error": f"The model `{body.get('model')}` does not exist."})
                return
            # A lower bound of the prompt's tokens (no tokenizer here): at most 8 characters a token.
            floor = len(prompt) // 8
            if floor + max_tokens > max_model_len:
                self._send(400, {"error": f">= {floor} prompt tokens + {max_tokens} > max_model_len {max_model_len}"})
                return
            self._complete(body, prompt, max_tokens, chat)

        def _choice(self, text: str, finish: str | None, chat: bool, stream: bool) -> dict[str, object]:
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            key = "delta" if stream else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}

        def _complete(self, body: dict[str, object], prompt: str, max_tokens: int, chat: bool = False) -> None:
            tokens = engine.admit(prompt)
            generated, ok = 0, False
            stream = bool(body.get("stream"))
            usage_opts = body.get("stream_options")
            usage_wanted = isinstance(usage_opts, dict) and bool(usage_opts.get("include_usage"))
            kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
            base = {"id": f"cmpl-{OWNER}-{threading.get_ident()}", "object": kind,
                    "created": int(time.time()), "model": body.get("model")}
            try:
                # Counted as running (engine.admit) for the whole hold: what a drain waits on.
                time.sleep(latency_s + tokens / engine.prefill_tps)
                if stream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                for i in range(max_tokens):
                    if i:
                        time.sleep(engine.token_delay(tokens + i))
                    engine.step()
                    generated += 1
                    if stream:
                        last = i == max_tokens - 1
                        choice = self._choice(FILLER, "length" if last else None, chat, stream)
                        self._event({**base, "choices": [choice]})
                # No tokenizer here: the usage names only what the double counted
                # exactly (its tokens); the client keeps its own prompt count.
                usage = {"completion_tokens": generated}
                if stream:
                    if usage_wanted:
                        self._event({**base, "choices": [], "usage": usage})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                else:
                    choice = self._choice(FILLER * generated, "length", chat, stream)
                    self._send(200, {**base, "owned_by": OWNER, "choices": [choice], "usage": usage})
                ok = True
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                engine.finish(tokens, generated, ok)

        def _event(self, payload: dict[str, object]) -> None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"{OWNER}: {self.address_string()} {format % args}\n")

    return Handler


def _vllm_line(process: str, level: str, where: str, message: str) -> str:
    """A line as vLLM 0.20.2 prints it: (process pid=N) LEVEL MM-DD HH:MM:SS [file:line] message."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"({process} pid={os.getpid()}) {level} {stamp} [{where}] {message}"


def startup_lines(args: argparse.Namespace, fail: str = "") -> list[tuple[str, bool]]:
    """vLLM's start-up, phase by phase: (line, a phase ends here). With ``fail=kv_cache``
    it ends in vLLM's error for a KV cache that does not fit (the figures are made up)."""
    engine, api = "EngineCore_DP0", "APIServer"
    url = f"http://{args.host}:{args.port}"
    lines: list[tuple[str, bool]] = [
        (_vllm_line(engine, "INFO", "gpu_model_runner.py:4778", f"Starting to load model {args.model}..."), True),
        (_vllm_line(engine, "INFO", "gpu_model_runner.py:4880",
                    "Model loading took 47.31 GiB memory and 312.504121 seconds"), True),
        (_vllm_line(engine, "INFO", "gpu_worker.py:441", "Available KV cache memory: 31.2 GiB"), True),
    ]
    if fail == "kv_cache":
        needed = (f"To serve at least one request with the models's max seq len ({args.max_model_len}), (48.6 GiB"
                  " KV cache is needed, which is larger than the available KV cache memory (31.2 GiB). Based on"
                  " the available memory, the estimated maximum model length is 130048. Try increasing"
                  " `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See"
                  " https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
        for text in ("EngineCore failed to start.", "Traceback (most recent call last):",
                     f"ValueError: {needed}"):
            lines.append((_vllm_line(engine, "ERROR", "core.py:1136", text), False))
        lines.append((_vllm_line(api, "ERROR", "api_server.py:100", "RuntimeError: Engine core initialization"
                                 " failed. See root cause above. Failed core proc(s): {}"), False))
        return lines
    lines += [
        (_vllm_line(engine, "INFO", "kv_cache_utils.py:1708", "GPU KV cache size: 1,020,928 tokens"), False),
        (_vllm_line(engine, "INFO", "kv_cache_utils.py:1710",
                    f"Maximum concurrency for {args.max_model_len:,} tokens per request: 5.04x"), True),
        (_vllm_line(engine, "INFO", "gpu_model_runner.py:6195",
                    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%| 67/67"), True),
        (_vllm_line(engine, "INFO", "gpu_model_runner.py:6134", "Graph capturing finished in 14 secs, took 0.84 GiB"),
         False),
        (_vllm_line(engine, "INFO", "core.py:307", "init engine (profile, create kv cache, warmup model) took 96.41 s"),
         True),
        (_vllm_line(api, "INFO", "api_server.py:602", f"Starting vLLM server on {url}"), False),
        (f"({api} pid={os.getpid()}) INFO:     Started server process [{os.getpid()}]", False),
        (f"({api} pid={os.getpid()}) INFO:     Waiting for application startup.", False),
        (f"({api} pid={os.getpid()}) INFO:     Application startup complete.", False),
    ]
    return lines


def start_up(args: argparse.Namespace) -> None:
    """Prints vLLM's start-up lines, GLM5_STANDIN_PHASE_S seconds apart; exits 1 where
    GLM5_STANDIN_FAIL makes the start-up fail."""
    pause = _env_float("GLM5_STANDIN_PHASE_S", 0.0)
    fail = os.environ.get("GLM5_STANDIN_FAIL", "")
    for line, phase_ends in startup_lines(args, fail):
        print(line, flush=True)
        if phase_ends and pause > 0:
            time.sleep(pause)
    if fail:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    run_checks(args)
    start_up(args)
    names = args.served_model_name or [args.model or OWNER]
    latency_s = int(os.environ.get("VLLM_PROBE_STANDIN_LATENCY_MS") or 0) / 1000
    server = ThreadingHTTPServer(
        (args.host, args.port),
        make_handler(os.environ.get("VLLM_API_KEY"), names, args.max_model_len, latency_s=latency_s),
    )
    server.daemon_threads = True
    print(f"{OWNER}: serving {names} on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
