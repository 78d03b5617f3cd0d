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
to talk to. It is not a model: ``POST /v1/completions`` and ``/v1/chat/completions``
(same key check) answer one fixed text after VLLM_PROBE_STANDIN_LATENCY_MS
milliseconds (default 0), so that a router in front of it has requests to spread and
to hold in flight (molecule/fleet). Its /v1/models answer and its completions say
``owned_by`` / ``model`` so the correctness checks know to skip.

Standard library only; a single file, copied to the host as it is.
"""

from __future__ import annotations

import argparse
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


def make_handler(
    api_key: str | None, names: list[str], latency_s: float = 0.0
) -> type[BaseHTTPRequestHandler]:
    running = [0]
    running_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = OWNER
        # Keep-alive, as vLLM (uvicorn) does: a router reuses its connections.
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
                # vLLM's gauge of requests in flight (no key, as vLLM's /metrics): what a
                # rolling upgrade waits on before it restarts a drained backend.
                with running_lock:
                    n = running[0]
                text = "".join(
                    f'vllm:num_requests_running{{model_name="{m}"}} {n}\n' for m in names
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
                return
            if not self.path.startswith("/v1/"):
                self._send(404, {"error": "not found"})
                return
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": "Unauthorized"})
                return
            if self.path == "/v1/models":
                now = int(time.time())
                data = [
                    {"id": n, "object": "model", "created": now, "owned_by": OWNER} for n in names
                ]
                self._send(200, {"object": "list", "data": data})
                return
            self._send(404, {"error": f"{OWNER} serves no {self.path}"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": "Unauthorized"})
                return
            chat = self.path == "/v1/chat/completions"
            if self.path != "/v1/completions" and not chat:
                self._send(404, {"error": f"{OWNER} serves no {self.path}"})
                return
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                self._send(400, {"error": "body is not JSON"})
                return
            model = request.get("model") if isinstance(request, dict) else None
            if model not in names:
                self._send(404, {"error": f"model {model!r} is not served here"})
                return
            with running_lock:
                running[0] += 1
            try:
                time.sleep(latency_s)
            finally:
                with running_lock:
                    running[0] -= 1
            text = f"{OWNER} on {socket.gethostname()}"
            choice: dict[str, object] = (
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "stop"}
                if chat else {"index": 0, "text": text, "finish_reason": "stop"}
            )
            self._send(200, {
                "id": f"{OWNER}-{time.monotonic_ns()}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "owned_by": OWNER,
                "choices": [choice],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            })

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"{OWNER}: {self.address_string()} {format % args}\n")

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    run_checks(args)
    names = args.served_model_name or [args.model or OWNER]
    latency_s = int(os.environ.get("VLLM_PROBE_STANDIN_LATENCY_MS") or 0) / 1000
    server = ThreadingHTTPServer(
        (args.host, args.port), make_handler(os.environ.get("VLLM_API_KEY"), names, latency_s)
    )
    print(f"{OWNER}: serving {names} on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
