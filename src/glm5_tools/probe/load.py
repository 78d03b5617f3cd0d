"""A bounded test client: N requests at concurrency C to ONE URL, counting failures.

Used by molecule/fleet to show that requests through vllm-router keep succeeding
while a backend is killed or the fleet is upgraded. It is a test, not a load
balancer: it sends to the single base URL it is given (the router) and nothing
else. Bounded three ways: at most ``--max-requests`` requests, at most
``--max-seconds`` seconds, and it stops early (after at least ``--min-requests``)
once ``--stop-file`` exists, so a playbook can hold the load for exactly as long as
the disruption takes. Prints one JSON report; exits 1 if any request failed.

Standard library only; a single file, copied to the host as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path


def _one(url: str, key: str, model: str, timeout: float) -> str:
    body = json.dumps({"model": model, "prompt": "GLM-5 fleet load", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        url + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
            if not answer.get("choices"):
                return "200 without choices"
            return "ok"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def run(args: argparse.Namespace) -> dict[str, object]:
    lock = threading.Lock()
    sent = 0
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    deadline = started + args.max_seconds

    def take() -> bool:
        nonlocal sent
        with lock:
            if sent >= args.max_requests or time.monotonic() > deadline:
                return False
            if sent >= args.min_requests and args.stop_file and Path(args.stop_file).exists():
                return False
            sent += 1
            return True

    def worker() -> None:
        while take():
            outcome = _one(args.url.rstrip("/"), args.key, args.model, args.timeout)
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = sum(n for outcome, n in outcomes.items() if outcome != "ok")
    return {
        "requests": sent,
        "ok": outcomes["ok"],
        "failed": failed,
        "failures": {k: v for k, v in outcomes.items() if k != "ok"},
        "concurrency": args.concurrency,
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL of the one endpoint to load")
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--min-requests", type=int, default=500)
    parser.add_argument("--max-requests", type=int, default=500)
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--report", default="", help="also write the report here")
    args = parser.parse_args(argv)
    args.key = os.environ.get("VLLM_API_KEY", "")
    if args.concurrency < 1 or args.min_requests > args.max_requests:
        parser.error("need concurrency >= 1 and min-requests <= max-requests")
    report = run(args)
    text = json.dumps(report)
    if args.report:
        Path(args.report).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
