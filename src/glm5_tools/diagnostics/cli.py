"""python -m glm5_tools.diagnostics: run the funnel, print the verdict table, write JSON.

Exit status: 0 when no stage failed, 1 when one did, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glm5_tools.diagnostics.result import StageResult, render_table, write_json


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def run(args: argparse.Namespace) -> list[StageResult]:
    from glm5_tools.diagnostics import (
        stage_attention,
        stage_dequant,
        stage_e2e,
        stage_layers,
        stage_mapping,
        stage_sharding,
        stage_sparse,
        torch_dequant,
    )
    from glm5_tools.diagnostics.dims import MLADims, load_config
    from glm5_tools.diagnostics.gguf_io import read_tensors

    cfg = load_config(Path(args.hf_config))
    device = _device(args.device)
    stages = {int(s) for s in args.stages.split(",")}
    if not stages <= set(range(1, 10)):
        raise ValueError(f"--stages {args.stages}: stages are 1-9")
    if stages & {8, 9}:
        if device != "cpu":
            raise ValueError("stages 8 and 9 run vLLM on the CPU in Triton's interpreter: run them with "
                             "--device cpu (in their own invocation on a GPU host)")
        from glm5_tools.diagnostics.vllm_forward import prepare_environment

        prepare_environment()  # before any stage imports vllm or triton
    tensors, meta = read_tensors(Path(args.gguf)) if stages & {1, 2, 3, 4} else ({}, {})
    arch = str(meta.get("general.architecture", "glm-dsa"))
    results: list[StageResult] = []
    if 1 in stages:
        if device == "cpu":
            results.append(stage_dequant.run_stage(
                tensors, stage_dequant.torch_cpu_dequantizer,
                "cpu: independent torch dequantizer (not vLLM's kernel)",
                per_type=args.per_type, supports=torch_dequant.supported))
        else:
            results.append(stage_dequant.run_stage(
                tensors, stage_dequant.vllm_gpu_dequantizer("cuda:0"),
                "gpu: vllm ggml_dequantize", per_type=args.per_type))
    if 2 in stages:
        from glm5_tools.diagnostics.stage_mapping import hf_params_from_config, hf_params_from_safetensors

        cfg_dir = Path(args.hf_config)
        cfg_dir = cfg_dir if cfg_dir.is_dir() else cfg_dir.parent
        params = hf_params_from_safetensors(cfg_dir) or hf_params_from_config(cfg)
        results.append(stage_mapping.run_stage(params, tensors, cfg, arch))
    if 3 in stages:
        results.append(stage_sharding.run_stage(tensors, cfg, args.tp, where="cpu: vLLM linear "
                                                "weight loaders"))
    if 4 in stages:
        results.append(stage_layers.run_stage(tensors, cfg, args.tp,
                                              device="cpu" if device == "cpu" else "cuda:0"))
    if 5 in stages:
        dims = MLADims.from_config(cfg).per_rank(args.tp)
        results.append(stage_attention.run_stage(dims, device))
    if 6 in stages:
        results.append(stage_e2e.run_stage(args.server_url, args.model,
                                           api_key_env=args.api_key_env))
    if 7 in stages:
        results.append(stage_sparse.run_stage(Path(args.gguf), selection_fault=args.selection_fault))
    if 8 in stages:
        from glm5_tools.diagnostics import stage_forward

        cfg_dir = Path(args.hf_config)
        cfg_dir = cfg_dir if cfg_dir.is_dir() else cfg_dir.parent
        lengths = [int(n) for n in args.forward_lengths.split(",") if n.strip()]
        if not lengths or min(lengths) < 2:
            raise ValueError(f"--forward-lengths {args.forward_lengths}: prompt lengths of at least 2 tokens")
        for backend in args.forward_backend.split(","):
            results.append(stage_forward.run_stage(Path(args.gguf), cfg_dir, backend=backend.strip(),
                                                   lengths=lengths, kv_cache_dtype=args.kv_cache_dtype))
    if 9 in stages:
        from glm5_tools.diagnostics import stage_mtp

        cfg_dir = Path(args.hf_config)
        cfg_dir = cfg_dir if cfg_dir.is_dir() else cfg_dir.parent
        if not 1 <= args.mtp_tokens <= 3:
            raise ValueError(f"--mtp-tokens {args.mtp_tokens}: 1-3 draft tokens")
        for backend in args.forward_backend.split(","):
            results.append(stage_mtp.run_check(Path(args.gguf), cfg_dir, backend=backend.strip(),
                                               length=args.mtp_length, num_speculative_tokens=args.mtp_tokens))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glm5-diagnose", description=__doc__)
    p.add_argument("--gguf", required=True, help="the GGUF file, first shard, or directory")
    p.add_argument("--hf-config", required=True, help="config.json or the directory with it")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel size deployed")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--stages", default="1,2,3,4,5,6")
    p.add_argument("--per-type", type=int, default=3, help="stage 1: tensors per quant type")
    p.add_argument("--server-url", default="", help="stage 6: the running server")
    p.add_argument("--model", default="glm-5", help="stage 6: served model name")
    p.add_argument("--api-key-env", default="VLLM_API_KEY")
    p.add_argument("--selection-fault", default="none", choices=("none", "shift", "causal", "rope_halves"),
                   help="stage 7: inject a sparse-attention selection fault into the candidate "
                        "(shows the stage failing)")
    p.add_argument("--forward-backend", default="TRITON_MLA_SPARSE",
                   help="stage 8: the attention backend(s) vLLM runs, comma-separated "
                        "(TRITON_MLA_SPARSE, TRITON_MLA)")
    p.add_argument("--forward-lengths", default="24,80",
                   help="stage 8: prompt lengths in tokens, comma-separated (use one longer than index_topk "
                        "and than a 64-row cache page for the sparse path)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"),
                   help="stage 8: vLLM's --kv-cache-dtype (fp8: TRITON_MLA_SPARSE's fp8_ds_mla latent cache, "
                        "the model in bfloat16)")
    p.add_argument("--mtp-tokens", type=int, default=3,
                   help="stage 9: num_speculative_tokens of the MTP drafter (1-3)")
    p.add_argument("--mtp-length", type=int, default=40, help="stage 9: prompt length in tokens")
    args = p.parse_args(argv)
    try:
        results = run(args)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"glm5-diagnose: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(render_table(results))
    if args.json:
        write_json(results, args.json, {"gguf": str(args.gguf), "tp": args.tp,
                                        "device": _device(args.device)})
    return 1 if any(r.verdict.value == "fail" for r in results) else 0
