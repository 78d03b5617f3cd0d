"""``python -m glm5_tools.probe``: run the correctness probe, print JSON, exit 1 on failure.

The API key is read from the environment variable named by ``--api-key-env``
(default VLLM_API_KEY), never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from glm5_tools.probe.checks import run_probe
from glm5_tools.probe.client import ApiClient, ApiError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glm5-probe", description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", default="VLLM_API_KEY")
    parser.add_argument("--perplexity-threshold", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    client = ApiClient(args.base_url, os.environ.get(args.api_key_env), timeout=args.timeout)
    try:
        report = run_probe(client, args.model, args.perplexity_threshold)
    except ApiError as exc:
        print(json.dumps({"ok": False, "failures": [str(exc)]}))
        return 2
    print(json.dumps(report.to_dict(), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
