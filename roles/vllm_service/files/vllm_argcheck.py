"""Check `vllm serve` arguments with the installed vLLM's own argument parser.

Usage: python vllm_argcheck.py '<JSON request>', the request being
  {"role_args": [...],        the arguments the role sets (after "serve")
   "extra_args": [...],       vllm_service_extra_args, appended after them
   "guarded_flags": {flag: role variable},  flags only the role may set
   "max_model_len_cap": int | null,         index_topk (dense), null = no cap
   "sparse": bool}            sparse attention: TRITON_MLA_SPARSE's limits apply
GLM5_ARGCHECK_PLATFORM=cuda parses as on a CUDA host where no GPU is present.
Exit 0 and one JSON line with the parsed values that matter, or exit 2 with the
reasons: vLLM's own error (an unknown flag, a bad value, an unknown parser name),
a guarded flag repeated in extra_args in any spelling vLLM accepts (--flag=value,
under_scores, an abbreviation), a guarded setting whose parsed value differs from
the one the role set (e.g. through a --config file), an API key on the command
line, or a parsed max_model_len above the cap. Imports vLLM's CLI modules only;
no GPU, no model load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

# Settings kept off the command line whatever the role's arguments are.
ALWAYS_GUARDED = ("api_key",)
# vLLM's FlexibleArgumentParser turns under_scores into dashes up to the first ".".
_KEY = re.compile(r"(?<=--)[^.]*")


def _use_parse_only_cuda_platform() -> None:
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


def option_dest(parser: argparse.ArgumentParser, word: str) -> str | None:
    """The namespace attribute an argv word sets, resolved as vLLM's parser resolves it
    (--flag=value, under_scores, unambiguous abbreviations); None for a value or an
    unknown word."""
    if not word.startswith("-") or word == "-" or word == "--":
        return None
    key = word.split("=", 1)[0]
    if key.startswith("--"):
        key = _KEY.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
    actions = parser._option_string_actions
    if key in actions:
        return actions[key].dest
    if key.startswith("--") and parser.allow_abbrev:
        dests = {action.dest for option, action in actions.items() if option.startswith(key)}
        if len(dests) == 1:
            return dests.pop()
    return None


def flag_of(parser: argparse.ArgumentParser, dest: str) -> str:
    """The long option string of a namespace attribute (for messages)."""
    options = [o for o, a in parser._option_string_actions.items() if a.dest == dest and o.startswith("--")]
    return min(options, key=len) if options else dest


def guard_errors(
    parser: argparse.ArgumentParser,
    role_args: list[str],
    extra_args: list[str],
    guarded_flags: dict[str, str],
    base: argparse.Namespace,
    full: argparse.Namespace,
) -> list[str]:
    """Refusals for guarded settings: repeated in extra_args, or parsed to another value."""
    variables: dict[str, str] = {}
    for flag, variable in guarded_flags.items():
        dest = option_dest(parser, flag)
        if dest is not None:
            variables.setdefault(dest, variable)
    guarded = set(variables) | set(ALWAYS_GUARDED)
    guarded.update(d for d in (option_dest(parser, w) for w in role_args) if d is not None)
    errors: list[str] = []
    seen: set[str] = set()
    for word in extra_args:
        dest = option_dest(parser, word)
        if dest in guarded and dest not in seen:
            seen.add(dest)
            errors.append(
                f"vllm_service_extra_args sets {flag_of(parser, dest)} (as {word.split('=', 1)[0]!r}): "
                f"the role sets it (set {variables.get(dest, 'the role variable')} instead)"
            )
    for dest in sorted(guarded - seen):
        if getattr(full, dest, None) != getattr(base, dest, None):
            shown = "<hidden>" if dest in ALWAYS_GUARDED else repr(getattr(full, dest, None))
            expected = "<unset>" if dest in ALWAYS_GUARDED else repr(getattr(base, dest, None))
            errors.append(
                f"the parsed {dest} is {shown}, not the role's {expected}: vllm_service_extra_args "
                f"overrides it (a --config file?); set {variables.get(dest, 'the role variable')} instead"
            )
    return errors


SIXTEEN_BIT_CACHE = ("auto", "bfloat16", "float16")
# patch 0013: vLLM's fp8_ds_mla layout read by the sparse kernel (656 bytes per token)
FP8_SPARSE_CACHE = ("fp8", "fp8_e4m3")


def sparse_fp8_cache_patched() -> bool:
    """The installed vLLM's TRITON_MLA_SPARSE takes an fp8 cache (patch 0013 applied)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
    return "fp8" in getattr(backend, "supported_kv_cache_dtypes", ())


def sparse_cache_errors(kv_cache_dtype: str, speculative: bool) -> list[str]:
    """What TRITON_MLA_SPARSE refuses of --kv-cache-dtype, before vLLM would at start."""
    accepted = "auto, bfloat16, float16, fp8 or fp8_e4m3 (fp8: patch 0013's fp8_ds_mla layout)"
    if kv_cache_dtype in SIXTEEN_BIT_CACHE:
        return []
    if kv_cache_dtype not in FP8_SPARSE_CACHE:
        return [f"--kv-cache-dtype {kv_cache_dtype}: TRITON_MLA_SPARSE takes {accepted}"]
    if not sparse_fp8_cache_patched():
        return [
            f"--kv-cache-dtype {kv_cache_dtype}: this vLLM's TRITON_MLA_SPARSE keeps a bf16/fp16 MLA cache "
            "(the fp8 cache needs patch 0013 of the patch set)"
        ]
    if speculative:
        return [
            f"--kv-cache-dtype {kv_cache_dtype} with --speculative-config: the sparse fp8 cache is not "
            "checked with the MTP drafter; expected auto, bfloat16 or float16 with speculative decoding"
        ]
    return []


def main() -> int:
    request: dict[str, Any] = json.loads(sys.argv[1])
    role_args = [str(a) for a in request["role_args"]]
    extra_args = [str(a) for a in request.get("extra_args", [])]
    guarded_flags = {str(k): str(v) for k, v in request.get("guarded_flags", {}).items()}
    cap = request.get("max_model_len_cap")
    if os.environ.get("GLM5_ARGCHECK_PLATFORM") == "cuda":
        _use_parse_only_cuda_platform()
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    base = parser.parse_args(list(role_args))  # exits 2 on an unknown flag or a bad value
    args = parser.parse_args(role_args + extra_args)
    validate_parsed_serve_args(args)
    errors = guard_errors(parser, role_args, extra_args, guarded_flags, base, args)
    if args.reasoning_parser and args.reasoning_parser not in ReasoningParserManager.list_registered():
        errors.append(f"unknown reasoning parser {args.reasoning_parser!r}")
    if args.tool_call_parser and args.tool_call_parser not in ToolParserManager.list_registered():
        errors.append(f"unknown tool-call parser {args.tool_call_parser!r}")
    if cap is not None and (args.max_model_len is None or int(args.max_model_len) > int(cap)):
        errors.append(
            f"max_model_len {args.max_model_len} exceeds index_topk {cap}: the dense Triton MLA path "
            "equals GLM-5's sparse attention only up to index_topk tokens "
            "(vllm_service_allow_long_context: true accepts it)"
        )
    # argparse keeps --attention-backend a string; vLLM's AttentionConfig validates it.
    from vllm.config.attention import AttentionConfig

    backend = args.attention_backend
    try:
        backend = AttentionConfig(backend=backend).backend
    except Exception as exc:
        errors.append(f"--attention-backend {args.attention_backend!r}: {exc}".splitlines()[0])
    # patch 0011's limit, refused before vLLM would at start (after the weights load);
    # speculative decoding is taken since patch 0012, an fp8 cache since patch 0013
    sparse = request.get("sparse") and getattr(backend, "name", backend) == "TRITON_MLA_SPARSE"
    if sparse:
        errors.extend(sparse_cache_errors(str(args.kv_cache_dtype), bool(getattr(args, "speculative_config", None))))
    result = {
        "model": args.model_tag,
        "attention_backend": getattr(backend, "name", backend),
        "tensor_parallel_size": args.tensor_parallel_size,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_model_len": args.max_model_len,
        "served_model_name": args.served_model_name,
        "host": args.host,
        "port": args.port,
        "chat_template_content_format": args.chat_template_content_format,
        "speculative_config": getattr(args, "speculative_config", None),
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
