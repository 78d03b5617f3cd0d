"""Check `vllm serve` arguments with the installed vLLM's own argument parser.

Usage: python vllm_argcheck.py '<JSON list of the arguments after "serve">'
GLM5_ARGCHECK_PLATFORM=cuda parses as on a CUDA host where no GPU is present.
Exit 0 and one JSON line with the parsed values that matter, or exit 2 with vLLM's
own error (an unknown flag, a bad value, an unknown parser name). Imports vLLM's
CLI modules only; no GPU, no model load.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    argv = json.loads(sys.argv[1])
    if os.environ.get("GLM5_ARGCHECK_PLATFORM") == "cuda":
        # A host without a GPU (CI): vLLM cannot detect a platform, and its parser's
        # defaults need one. Parse as the CUDA platform, the one the unit runs on.
        # (vllm.platforms.cuda itself needs libcuda, so a parse-only platform is used.)
        import vllm.platforms
        from vllm.platforms.interface import Platform, PlatformEnum

        class ArgParseOnlyCudaPlatform(Platform):
            _enum = PlatformEnum.CUDA
            device_name = "cuda"
            device_type = "cuda"
            dispatch_key = "CUDA"

        vllm.platforms._current_platform = ArgParseOnlyCudaPlatform()  # type: ignore[attr-defined]
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(argv)  # exits 2 on an unknown flag or a bad value
    validate_parsed_serve_args(args)
    errors = []
    if args.reasoning_parser and args.reasoning_parser not in ReasoningParserManager.list_registered():
        errors.append(f"unknown reasoning parser {args.reasoning_parser!r}")
    if args.tool_call_parser and args.tool_call_parser not in ToolParserManager.list_registered():
        errors.append(f"unknown tool-call parser {args.tool_call_parser!r}")
    # argparse keeps --attention-backend a string; vLLM's AttentionConfig validates it.
    from vllm.config.attention import AttentionConfig

    backend = args.attention_backend
    try:
        backend = AttentionConfig(backend=backend).backend
    except Exception as exc:
        errors.append(f"--attention-backend {args.attention_backend!r}: {exc}".splitlines()[0])
    result = {
        "model": args.model_tag,
        "attention_backend": getattr(backend, "name", backend),
        "tensor_parallel_size": args.tensor_parallel_size,
        "max_model_len": args.max_model_len,
        "served_model_name": args.served_model_name,
        "api_key_on_command_line": bool(args.api_key),
        "errors": errors,
    }
    print(json.dumps(result))
    if errors:
        print("; ".join(errors), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
