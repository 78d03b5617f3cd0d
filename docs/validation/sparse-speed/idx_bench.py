"""The indexer score kernel alone: 0011's (before) against the looping kernel (after), one short device call.

usage: idx_bench.py NEW_SPARSE_UTILS OLD_SPARSE_UTILS OUT_DIR
(vLLM 0.20.2's package importable: vllm.triton_utils for the kernel files, its
vendored DeepGEMM for (d)). The goals' shapes first; at each shape, on the same
data: old, new, DeepGEMM's paged indexer (d), then the variants (ORDER);
results.json is written after every kernel (a call cut short keeps what ran).
Scores: each kernel's against a float32 reference of the same math on the
first 4,096 positions, and the new kernel's against the old one's.
"""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import IDX_DIM, IDX_HEADS, MML, PAGE, SWEEP, fp8_bytes, graph_time, load, read_bandwidth, ref_scores, rel_err

SHAPES = [(65536, 64), (65536, 16), (131072, 64), (131072, 16), (4096, 1), (131072, 1), (4096, 64), (16384, 16)]


def build_idx(batch: int, ctx: int, dev: torch.device) -> dict[str, torch.Tensor]:
    per = math.ceil(ctx / PAGE)
    nb = batch * per
    bt = torch.randperm(nb, device=dev).to(torch.int32).view(batch, per)
    idx = torch.empty(nb, PAGE * (IDX_DIM + 4), dtype=torch.uint8, device=dev)
    idx[:, : PAGE * IDX_DIM] = fp8_bytes(nb * PAGE * IDX_DIM, dev).view(nb, -1)
    idx[:, PAGE * IDX_DIM :] = (torch.rand(nb, PAGE, device=dev) * 0.01 + 0.001).view(torch.uint8).view(nb, -1)
    qi = torch.randn(batch, IDX_HEADS, IDX_DIM, device=dev)
    qs = qi.abs().amax(-1).clamp(min=1e-4) / 448.0
    qq = (qi / qs[..., None]).to(torch.float8_e4m3fn)
    w = torch.randn(batch, IDX_HEADS, device=dev) * qs * IDX_DIM**-0.5 * IDX_HEADS**-0.5
    return {"bt": bt, "idx": idx.view(nb, PAGE, IDX_DIM + 4), "qq": qq, "w": w}


# the variants in the order they are timed (a short call times the first ones)
ORDER = [
    "rows_m_bf16_s1",
    "heads_m_bf16_s3",
    "rows_m_fp8_s3",
    "rows_m_bf16_s3_pps8",
    "rows_m_bf16_s3_pps16",
    "rows_m_bf16_s3_w8",
    "rows_m_bf16_s2",
    "rows_m_bf16_s4",
    "rows_m_fp16_s3",
    "rows_m_bf16_s3_bn64",
    "rows_m_bf16_s3_bn256_w8",
    "rows_m_bf16_s3_pps2",
    "heads_m_fp8_s3",
    # second sweep (run 4b)
    "rows_m_bf16_s3",
    "heads_m_fp16_s3",
    "heads_m_fp8_s2",
    "heads_m_fp8_s4",
    "heads_m_fp8_s3_pps2",
    "heads_m_fp8_s3_pps8",
    "heads_m_fp8_s3_pps16",
    "heads_m_fp8_s3_bn64",
    "heads_m_fp8_s3_bn256",
    "heads_m_fp8_s3_bn256_w8",
    "heads_m_fp8_s3_w8",
    "heads_m_fp8_s4_pps8",
]


def triton_shape(
    new: types.ModuleType,
    old: types.ModuleType,
    dg: types.ModuleType | None,
    shape: tuple[int, int],
    dev: torch.device,
    run: dict,
    save: Callable[[], None],
) -> None:
    """old, new, DeepGEMM (d), then the variants (ORDER) at one shape, on the same data."""
    ctx, batch = shape
    d = build_idx(batch, ctx, dev)
    req = torch.arange(batch, dtype=torch.int32, device=dev)
    ctxl = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    ref = ref_scores(d["qq"], d["w"], d["idx"], d["bt"], min(ctx, 4096))
    lo, ln = (torch.empty(batch, MML, device=dev) for _ in range(2))
    args = (d["qq"], d["w"], d["idx"], d["bt"], req, ctxl, MML)
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "old": lambda: old.indexer_logits(*args, out=lo, tail=False),
        "new": lambda: new.indexer_logits(*args, out=ln, tail=False),
    }
    if dg is not None:  # as vLLM's FLASHMLA_SPARSE path calls it
        lens = ctxl.view(batch, 1)
        sched = dg.get_paged_mqa_logits_metadata(
            lens, PAGE, torch.cuda.get_device_properties(dev).multi_processor_count
        )
        kv4, q4 = d["idx"].unsqueeze(-2), d["qq"].view(batch, 1, IDX_HEADS, IDX_DIM)
        fns["deepgemm"] = lambda: dg.fp8_fp4_paged_mqa_logits((q4, None), kv4, d["w"], lens, d["bt"], sched, MML, False)
    sweep = dict(SWEEP)
    for name in ORDER:
        fns[name] = lambda kw=sweep[name]: new.indexer_logits(*args, out=ln, tail=False, **kw)
    for name, fn in fns.items():
        try:
            got = fn()
            torch.cuda.synchronize()
            run["rel"][name] = rel_err(got, ref)
            if name == "new":
                run["new_vs_old_rel"] = rel_err(ln[:, :ctx], lo[:, :ctx])
            run["ms"][name] = graph_time(fn, 10.0)
        except Exception as e:
            run.setdefault("errors", {})[name] = repr(e)[:300]
        save()


def main() -> None:
    new, old = load(sys.argv[1], "su_new"), load(sys.argv[2], "su_old")
    out_dir = Path(sys.argv[3])
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(dev),
        "capability": list(torch.cuda.get_device_capability(dev)),
        "sms": sms,
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
        "read_bandwidth_GBps_measured": read_bandwidth(dev),
        "new_defaults": {k: getattr(new, k) for k in dir(new) if k.startswith("INDEXER_")},
        "runs": [],
    }

    def save() -> None:
        (out_dir / "results.json").write_text(json.dumps(res, indent=1) + "\n")

    save()
    dg = None
    try:
        import vllm.third_party.deep_gemm as dg
    except Exception as e:
        res["deepgemm_error"] = repr(e)[:800]
    for ctx, batch in SHAPES:
        run: dict = {"ctx": ctx, "batch": batch, "bytes": batch * ctx * (IDX_DIM + 4), "ms": {}, "rel": {}}
        res["runs"].append(run)
        triton_shape(new, old, dg, (ctx, batch), dev, run, save)
        print(json.dumps(run), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
