"""Round trip of the tiny GLM-5 fixture through vLLM's GGUF mapping and weight iteration.

Runs against whichever vllm is importable (patched overlay in-process, or a pristine
or partly patched overlay in a subprocess: `python roundtrip.py GGUF HF_DIR [...]`
prints the report as JSON). The GGUF comes from llama.cpp's own converter and
quantizer (scripts/make-tiny-glm5), never from a writer of ours.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[3]
FIXTURE = Path(os.environ.get("GLM5_TINY_FIXTURE", REPO / ".cache" / "fixtures" / "tiny-glm5"))
BF16_GGUF = FIXTURE / "gguf" / "tiny-glm5-BF16.gguf"
QUANT_GGUF = FIXTURE / "gguf" / "tiny-glm5-UD-Q4_K_XL.gguf"
SPLIT_GGUF = sorted((FIXTURE / "gguf" / "split").glob("*.gguf"))
HF_DIR = FIXTURE / "hf"

# Relative L2 error bound per GGUF type (dequantized vs the original).
QUANT_TOL = {"Q8_0": 0.01, "Q6_K": 0.03, "Q5_K": 0.06, "Q4_K": 0.12}


def hf_tensors(hf_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def roundtrip(gguf_files: list[Path], hf_dir: Path, force_model_type: str = "", mtp: bool = False
              ) -> dict[str, Any]:
    """Map and iterate; return {stage, error, missing, duplicates, extra, mismatch, ...}.

    mtp: map as for the MTP drafter of speculative decoding (the config as vLLM's
    SpeculativeConfig rewrites it for method mtp); "main" is then the MTP layers'
    parameters."""
    import gguf
    import torch

    report: dict[str, Any] = {"stage": "config", "error": None}
    try:
        from vllm.transformers_utils.config import get_config

        if force_model_type:
            raw = json.loads((hf_dir / "config.json").read_text())
            from transformers import AutoConfig

            raw["model_type"] = force_model_type
            raw.pop("architectures", None)
            config = AutoConfig.for_model(**raw)
        else:
            config = get_config(str(hf_dir), trust_remote_code=False)
        if mtp:
            from vllm.config.speculative import SpeculativeConfig

            config = SpeculativeConfig.hf_config_override(config)
        report["stage"] = "mapping"
        from vllm.config.load import LoadConfig
        from vllm.model_executor.model_loader import weight_utils
        from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

        loader = GGUFModelLoader(LoadConfig(load_format="gguf"))
        name_map = loader._get_gguf_weights_map(SimpleNamespace(
            hf_config=config, trust_remote_code=False, model=str(gguf_files[0]), revision=None))
        report["stage"] = "iteration"
        files = [str(f) for f in gguf_files]
        weights = (
            weight_utils.gguf_quant_weights_iterator_multi(files, name_map)
            if len(files) > 1
            else weight_utils.gguf_quant_weights_iterator(files[0], name_map)
        )
        yielded: dict[str, list[Any]] = {}
        qtypes: dict[str, int] = {}
        for name, tensor in weights:
            if name.endswith("qweight_type"):
                qtypes[name.replace("qweight_type", "weight")] = int(tensor.item())
                continue
            yielded.setdefault(name.replace("qweight", "weight"), []).append(tensor)
        report["stage"] = "compare"
    except Exception as exc:  # reported, the test decides
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        return report

    original = hf_tensors(hf_dir)
    n_layers = config.num_hidden_layers
    covered: dict[str, int] = {}
    mismatch: dict[str, str] = {}
    max_err: dict[str, float] = {}
    n_experts = config.n_routed_experts

    def compare(hf_name: str, got: Any, want: Any, qtype: str) -> None:
        if tuple(got.shape) != tuple(want.shape):
            mismatch[hf_name] = f"shape {tuple(got.shape)} != {tuple(want.shape)}"
            return
        got32, want32 = got.to(torch.float32), want.to(torch.float32)
        if qtype in QUANT_TOL:
            err = float((got32 - want32).norm() / want32.norm().clamp_min(1e-12))
            max_err[qtype] = max(max_err.get(qtype, 0.0), err)
            if err > QUANT_TOL[qtype]:
                mismatch[hf_name] = f"{qtype} relative error {err:.4f}"
        elif not torch.equal(got32, want32):
            diff = float((got32 - want32).abs().max())
            mismatch[hf_name] = f"{qtype} not exact (max abs diff {diff:.3g})"

    reader_types: dict[str, str] = {}
    for f in gguf_files:
        for t in gguf.GGUFReader(f).tensors:
            if t.name in name_map:
                reader_types.setdefault(name_map[t.name], t.tensor_type.name)

    def dequant(name: str, tensor: Any) -> Any:
        if name not in qtypes:
            return tensor
        qtype = gguf.GGMLQuantizationType(qtypes[name])
        data = gguf.quants.dequantize(tensor.numpy(), qtype)
        return torch.from_numpy(data)

    for name, tensors in yielded.items():
        if len(tensors) != 1:
            mismatch[name] = f"yielded {len(tensors)} times"
        got = dequant(name, tensors[-1])
        qtype = reader_types.get(name, "?")
        # Quantized experts stay merged ([n_experts, out, in] under expert 0's name);
        # unquantized ones arrive one expert at a time (patch 0006).
        expert = ".mlp.experts.0." in name and got.dim() == 3
        if expert:
            for e in range(n_experts):
                hf_name = name.replace(".experts.0.", f".experts.{e}.")
                covered[hf_name] = covered.get(hf_name, 0) + 1
                if hf_name in original:
                    compare(hf_name, got.reshape(n_experts, *original[hf_name].shape)[e], original[hf_name], qtype)
            continue
        covered[name] = covered.get(name, 0) + 1
        if name in original:
            compare(
                name,
                got.reshape(original[name].shape)
                if got.numel() == original[name].numel() and got.dim() != original[name].dim()
                else got,
                original[name],
                qtype,
            )

    spec = tuple(f"model.layers.{i}." for i in range(n_layers, n_layers + 4))
    main = {n for n in original if n.startswith(spec) == mtp}
    report.update(
        missing=sorted(main - covered.keys()),
        duplicates=sorted(n for n, c in covered.items() if c > 1),
        extra=sorted(n for n in covered if n not in original),
        mismatch=mismatch,
        max_rel_err=max_err,
        n_main=len(main),
        n_found=len(main & covered.keys()),
        quantized=sorted(qtypes),
    )
    return report


if __name__ == "__main__":
    args = sys.argv[1:]
    force = ""
    if args and args[0].startswith("--force-model-type="):
        force = args.pop(0).split("=", 1)[1]
    mtp = bool(args) and args[0] == "--mtp"
    if mtp:
        args.pop(0)
    hf = Path(args.pop())
    print("GLM5-REPORT " + json.dumps(roundtrip([Path(a) for a in args], hf, force, mtp)))
