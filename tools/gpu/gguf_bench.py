#!/usr/bin/env python3
"""GGUF weight kernels at GLM-5's per-rank shapes, side by side on one GPU.

Times, in one run on one card, with baselines from the same run:
- the project's Triton kernels (patch 0014's gguf_triton module), each candidate
  configuration of each step size, and the fastest;
- vLLM 0.20.2's GGUF kernels as vLLM dispatches them, and each of its other
  GGUF kernels at every step size (the crossovers for patch 0014's `tuned` mode);
- vLLM's Marlin 4-bit MoE (uint4 with zero points, group 32) on the same shapes;
- cuBLAS fp16 on the same dense shapes; the read floor at the measured bandwidth.
and checks each kernel's output against a float32 matmul of the dequantized
weights (vLLM's ggml_dequantize to float32, an implementation independent of the
Triton one) at the real shapes.

Only vLLM's compiled ops are loaded (torch.ops.load_library on _C / _moe_C from
SITE), not its Python package. Weights are valid GGUF blocks with random values;
L layers' weights are cycled so that nothing stays in L2; each point is a CUDA
graph of the L calls, the median of --reps replays, per layer.

usage:
  gguf_bench.py run --site DIR --kernels gguf_triton.py --out results.json [--parts moe,dense,check]
  gguf_bench.py summarize results.json [more.json ...] > summary.md
  gguf_bench.py extract PATCH DIR   # the new files of a patch (e.g. 0014's module) into DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

Q8_0, Q4_K, Q5_K, Q6_K = 8, 12, 13, 14
SIZES = {Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}
U4 = 1125899906843648  # vLLM scalar_types.uint4.id
MOE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
DENSE_TOKENS = [1, 2, 4, 8, 16, 64, 256, 2048, 8192]


@dataclass(frozen=True)
class Dims:
    """GLM-5's dims per rank at tensor parallel size tp."""

    tp: int = 8
    hidden: int = 6144
    experts: int = 256
    topk: int = 8
    moe_inter: int = 2048
    shared_inter: int = 2048
    heads: int = 64
    q_lora: int = 2048
    kv_lora: int = 512
    rope: int = 64
    nope: int = 192
    v_head: int = 256
    index_heads: int = 32
    index_dim: int = 128
    vocab: int = 154880

    @property
    def inter(self) -> int:
        return self.moe_inter // self.tp

    def dense_ops(self) -> list[tuple[str, int, int, int | None]]:
        """(name, in, out, GGUF type or None for 16-bit) of one layer's non-expert linears."""
        h = self.heads // self.tp
        return [
            ("q_a", self.hidden, self.q_lora, Q5_K),
            ("kv_a_mqa", self.hidden, self.kv_lora + self.rope, Q6_K),
            ("q_b", self.q_lora, h * (self.nope + self.rope), Q5_K),
            ("o_proj", h * self.v_head, self.hidden, Q5_K),
            ("indexer wq_b", self.q_lora, self.index_heads * self.index_dim, None),
            ("indexer wk", self.hidden, self.index_dim, None),
            ("indexer weights_proj", self.hidden, self.index_heads, None),
            ("router", self.hidden, self.experts, None),
            ("shared gate_up", self.hidden, 2 * self.shared_inter // self.tp, Q6_K),
            ("shared down", self.shared_inter // self.tp, self.hidden, Q6_K),
        ]

    def lm_head(self) -> tuple[str, int, int, int]:
        return ("lm_head", self.hidden, self.vocab // self.tp, Q6_K)


def extract_new_files(patch: Path, dest: Path) -> list[Path]:
    """Write the files a unified diff creates (--- /dev/null or @@ -0,0) into dest."""
    out: list[Path] = []
    lines = patch.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("+++ ") and i + 1 < len(lines) and lines[i + 1].startswith("@@ -0,0 "):
            rel = lines[i][4:].split("\t")[0].split("/", 1)[1]
            body: list[str] = []
            i += 2
            while i < len(lines) and not lines[i].startswith(("diff ", "--- ", "Index: ")):
                if lines[i].startswith("+"):
                    body.append(lines[i][1:])
                elif lines[i].startswith("\\"):
                    pass
                else:
                    break
                i += 1
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(body) + "\n", encoding="utf-8")
            out.append(target)
            continue
        i += 1
    return out


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gguf_triton", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gguf_triton"] = mod
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- candidates


def with_raw_twins(gt: ModuleType, cands: list[Any]) -> list[Any]:
    """Each tensor-core candidate ("dot", dequantized operand) beside its twin on
    the quants themselves ("dotq": same tile, warps and stages; no unroll)."""
    out: list[Any] = []
    for c in cands:
        out.append(c)
        if c.form == "dot":
            out.append(gt.with_config(c, form="dotq", unroll=1))
    return out


def moe_candidates(gt: ModuleType, t: int) -> list[Any]:
    return with_raw_twins(gt, _moe_candidates(gt, t))


def dense_candidates(gt: ModuleType, t: int) -> list[Any]:
    return with_raw_twins(gt, _dense_candidates(gt, t))


def _moe_candidates(gt: ModuleType, t: int) -> list[Any]:
    C = gt.Config
    out: list[Any] = []
    if t <= 16:
        for bn, sk in ((16, 4), (16, 8), (32, 4), (32, 8), (64, 4), (64, 8), (128, 4)):
            out.append(C("fma", block_n=bn, split_k=sk, grain=256, num_warps=4))
        out.append(C("fma", block_n=64, split_k=4, grain=256, num_warps=8))
        for bn, sk, un in ((32, 4, 4), (64, 4, 4), (64, 8, 2)):
            out.append(C("fma", block_n=bn, split_k=sk, unroll=un, grain=32, num_warps=4))
    if 4 <= t <= 256:
        out += [C("dot", block_m=16, block_n=32, unroll=2, num_warps=4), C("dot", block_m=16, block_n=64, unroll=2,
                                                                             num_warps=4),
                C("dot", block_m=16, block_n=64, unroll=4, num_warps=4), C("dot", block_m=16, block_n=128, unroll=2,
                                                                             num_warps=4)]
    if 64 <= t <= 2048:
        out += [C("dot", block_m=32, block_n=64, unroll=2, num_warps=4), C("dot", block_m=32, block_n=128, unroll=2,
                                                                             num_warps=8)]
    if t >= 256:
        out += [C("dot", block_m=64, block_n=64, unroll=2, num_warps=4), C("dot", block_m=64, block_n=128, unroll=2,
                                                                             num_warps=8),
                C("dot", block_m=64, block_n=128, unroll=2, num_warps=8, num_stages=3)]
    if t >= 1024:
        out += [C("dot", block_m=128, block_n=128, unroll=2, num_warps=8), C("dot", block_m=128, block_n=64, unroll=2,
                                                                               num_warps=8)]
    return out


def _dense_candidates(gt: ModuleType, t: int) -> list[Any]:
    C = gt.Config
    out: list[Any] = []
    if t <= 4:
        for bn, sk in ((8, 8), (16, 4), (16, 8), (32, 4), (32, 8), (64, 4)):
            out.append(C("fma", block_n=bn, split_k=sk, grain=256, num_warps=4))
        for bn, sk, un in ((16, 8, 4), (32, 4, 4)):
            out.append(C("fma", block_n=bn, split_k=sk, unroll=un, grain=32, num_warps=4))
    if 2 <= t <= 64:
        out += [C("dot", block_m=16, block_n=32, unroll=2, num_warps=4), C("dot", block_m=16, block_n=64, unroll=2,
                                                                             num_warps=4),
                C("dot", block_m=16, block_n=64, unroll=4, num_warps=4)]
    if 16 <= t <= 512:
        out += [C("dot", block_m=32, block_n=64, unroll=2, num_warps=4), C("dot", block_m=64, block_n=64, unroll=2,
                                                                             num_warps=4)]
    if t >= 128:
        out += [C("dot", block_m=64, block_n=128, unroll=2, num_warps=8), C("dot", block_m=128, block_n=128, unroll=2,
                                                                              num_warps=8),
                C("dot", block_m=128, block_n=64, unroll=2, num_warps=8, num_stages=3)]
    return out


def cfg_name(cfg: Any) -> str:
    if cfg.form == "fma":
        return f"fma{cfg.grain}_n{cfg.block_n}_s{cfg.split_k}_u{cfg.unroll}_w{cfg.num_warps}"
    if cfg.form == "dotq":
        return f"dotq_m{cfg.block_m}_n{cfg.block_n}_w{cfg.num_warps}_st{cfg.num_stages}"
    return f"dot_m{cfg.block_m}_n{cfg.block_n}_u{cfg.unroll}_w{cfg.num_warps}_st{cfg.num_stages}"


# --------------------------------------------------------------------------- summary


def layer_totals(rows: list[dict[str, Any]], ops: Iterable[str]) -> dict[int, dict[str, float]]:
    """Per step size, the sum over a layer's ops of each column present for all of them."""
    wanted = set(ops)
    by_t: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["op"] in wanted:
            by_t.setdefault(r["tokens"], []).append(r)
    totals: dict[int, dict[str, float]] = {}
    for t, rs in sorted(by_t.items()):
        if {r["op"] for r in rs} != wanted:
            continue
        cols = ("vllm", "cublas", "triton", "best", "floor")
        totals[t] = {c: sum(float(r[c]) for r in rs) for c in cols if all(r.get(c) is not None for r in rs)}
    return totals


def _f(v: Any, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _group_checks(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Check rows by (layer, form): 'q_a fma256_n16_s8_u4_w4' -> ('q_a', 'fma256')."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        what, _, cfg = r["what"].rpartition(" ")
        groups.setdefault((what, cfg.split("_")[0]), []).append(r)
    return groups


def summarize(results: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for res in results:
        if "read_bw_is" not in res:  # the first run divided by the bytes read alone: floors twice too long
            res["read_bw_GBps"] *= 2
            for r in res.get("moe", []) + res.get("dense", []):
                if r.get("floor") is not None:
                    r["floor"] /= 2
        out.append(f"## {res.get('label', 'run')}: {res['device']} ({res['sms']} SMs), {res['date']}\n")
        out.append(f"torch {res['torch']}, triton {res['triton']}; "
                   f"copy bandwidth {res['read_bw_GBps']:,.0f} GB/s (read + write); "
                   f"command: `{res['command']}`\n")
        moe = res.get("moe", [])
        if moe:
            out.append("\n### Routed experts, one layer (us)\n")
            out.append("| tokens | experts touched | vLLM GGUF as dispatched | vLLM best GGUF kernel | Marlin 4-bit | "
                       "Triton (best config) | config | Triton / Marlin | Triton / read floor |")
            out.append("|---|---|---|---|---|---|---|---|---|")
            for r in moe:
                tri, mar, fl = r.get("triton"), r.get("marlin"), r.get("floor")
                out.append(
                    f"| {r['tokens']} | {r['unique_experts']:.1f} | {_f(r.get('vllm'))} | {_f(r.get('vllm_best'))} | "
                    f"{_f(mar)} | {_f(tri)} | {r.get('triton_config', '-')} | "
                    f"{_f(tri / mar if tri and mar else None, 2)} | {_f(tri / fl if tri and fl else None, 2)} |")
        dense = res.get("dense", [])
        if dense:
            ops = [r["op"] for r in dense if r["tokens"] == dense[0]["tokens"] and r["op"] != "lm_head"]
            tot = layer_totals(dense, ops)
            out.append("\n### Non-expert linears of one layer, summed (us)\n")
            out.append("| tokens | vLLM as dispatched | cuBLAS fp16 | Triton where GGUF, else as vLLM | "
                       "best per op | read floor | best / cuBLAS |")
            out.append("|---|---|---|---|---|---|---|")
            for t, v in tot.items():
                ratio = v["best"] / v["cublas"] if v.get("best") and v.get("cublas") else None
                out.append(f"| {t} | {_f(v.get('vllm'))} | {_f(v.get('cublas'))} | {_f(v.get('triton'))} | "
                           f"{_f(v.get('best'))} | {_f(v.get('floor'))} | {_f(ratio, 2)} |")
            lm = [r for r in dense if r["op"] == "lm_head"]
            if lm:
                out.append("\n### lm_head (vocab / TP rows, Q6_K) (us)\n")
                out.append("| tokens | vLLM | cuBLAS fp16 | Triton | config | read floor | Triton / floor |")
                out.append("|---|---|---|---|---|---|---|")
                for r in lm:
                    tri, fl = r.get("triton"), r.get("floor")
                    out.append(f"| {r['tokens']} | {_f(r.get('vllm'))} | {_f(r.get('cublas'))} | {_f(tri)} | "
                               f"{r.get('triton_config', '-')} | {_f(fl)} | "
                               f"{_f(tri / fl if tri and fl else None, 2)} |")
        chk = res.get("check", [])
        if chk:
            out.append("\n### Exactness against float32 (relative L2 error of the output, worst over configurations "
                       "and step sizes)\n")
            out.append("| what | form | step sizes | configurations | Triton | vLLM's GGUF kernel | bound |")
            out.append("|---|---|---|---|---|---|---|")
            for (what, form), rs in _group_checks(chk).items():
                vl = [r["vllm_err"] for r in rs if r.get("vllm_err") is not None]
                out.append(f"| {what} | {form} | {', '.join(str(t) for t in sorted({r['tokens'] for r in rs}))} | "
                           f"{len({r['what'] for r in rs})} | {max(r['triton_err'] for r in rs):.2e} | "
                           f"{_f(max(vl) if vl else None, 4)} | {max(r['bound'] for r in rs):.0e} |")
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- GPU run


@dataclass
class Bench:
    site: Path
    gt: ModuleType
    dims: Dims
    layers: int
    reps: int
    dtype: str = "fp16"  # the activations' dtype: fp16 (GGUF's on Blackwell) or bf16
    torch: Any = field(repr=False, default=None)
    read_bw: float = 0.0  # bytes a device-to-device copy moves per second (bandwidth())

    def __post_init__(self) -> None:
        import torch

        self.torch = torch
        torch.ops.load_library(str(self.site / "_C.abi3.so"))
        torch.ops.load_library(str(self.site / "_moe_C.abi3.so"))
        self.C = torch.ops._C
        self.M = torch.ops._moe_C
        self.dev = torch.device("cuda")
        self.dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[self.dtype]
        props = torch.cuda.get_device_properties(0)
        self.sms = props.multi_processor_count
        self.name = props.name
        torch.backends.cuda.matmul.allow_tf32 = False

    # ---- data
    def gguf_rows(self, lead: tuple[int, ...], rows: int, k: int, qt: int, scale: float = 1.0) -> Any:
        """Random blocks; d (and dmin) uniform in [0.001, 0.005] x scale."""
        torch = self.torch
        blk, size = SIZES[qt]
        nb = k // blk
        w = torch.randint(0, 256, (*lead, rows, nb, size), dtype=torch.uint8, device=self.dev)
        d = ((torch.rand((*lead, rows, nb), device=self.dev) * 0.004 + 0.001) * scale).to(torch.float16)
        at = 208 if qt == Q6_K else 0
        w[..., at:at + 2] = d.view(torch.uint8).view(*lead, rows, nb, 2)
        if qt in (Q4_K, Q5_K):
            dm = ((torch.rand((*lead, rows, nb), device=self.dev) * 0.004 + 0.001) * scale).to(torch.float16)
            w[..., 2:4] = dm.view(torch.uint8).view(*lead, rows, nb, 2)
        return w.view(*lead, rows, nb * size)

    def bandwidth(self) -> float:
        torch = self.torch
        a = torch.empty(1 << 31, dtype=torch.uint8, device=self.dev)
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            b.copy_(a)
            e.record()
            e.synchronize()
            ts.append(float(s.elapsed_time(e)) / 1e3)
        del a, b
        # a copy reads and writes each byte: 2 x its size moved; a read-only kernel
        # can move as much, so that is the read floor's bandwidth
        return 2 * (1 << 31) / statistics.median(ts)

    def time_chain(self, fns: list[Callable[[], Any]]) -> float:
        """Median microseconds per call of the chain, CUDA graph (eager if capture fails)."""
        torch = self.torch
        for f in fns:
            f()
        torch.cuda.synchronize()
        run: Callable[[], Any]
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for f in fns:
                    f()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for f in fns:
                    f()
            run = g.replay
        except Exception:  # a capture failure falls back to eager timing
            torch.cuda.synchronize()

            def run() -> None:
                for f in fns:
                    f()
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            ts.append(float(a.elapsed_time(b)) * 1e3 / len(fns))
        return statistics.median(ts)

    def safe_time(self, fns: list[Callable[[], Any]]) -> tuple[float | None, str | None]:
        try:
            return self.time_chain(fns), None
        except Exception as ex:  # recorded in the results
            self.torch.cuda.synchronize()
            return None, repr(ex)[:300]

    # ---- vLLM calls
    def align(self, ids: Any, block: int) -> tuple[Any, Any, Any]:
        torch = self.torch
        e = self.dims.experts
        numel = ids.numel()
        maxp = numel + e * (block - 1)
        if numel < e:
            maxp = min(numel * block, maxp)
        s = torch.empty((maxp,), dtype=torch.int32, device=self.dev)
        x = torch.empty(((maxp + block - 1) // block,), dtype=torch.int32, device=self.dev)
        n = torch.empty((1,), dtype=torch.int32, device=self.dev)
        self.M.moe_align_block_size(ids, e, block, s, x, n, None)
        return s, x, n

    def vllm_moe(self, x: Any, w13: Any, w2: Any, ids: Any, tw: Any, form: str) -> Any:
        torch, C, d = self.torch, self.C, self.dims
        t = x.shape[0]
        if form == "mmq":
            s, e, n = self.align(ids, C.ggml_moe_get_block_size(Q4_K))
            g = C.ggml_moe_a8(x, w13, s, e, n, Q4_K, 2 * d.inter, d.topk, t)
            a = torch.empty((g.shape[0], d.inter), dtype=self.dt, device=self.dev)
            C.silu_and_mul(a, g)
            o = C.ggml_moe_a8(a, w2, s, e, n, Q5_K, d.hidden, 1, t * d.topk)
        else:
            g = C.ggml_moe_a8_vec(x, w13, ids, d.topk, Q4_K, 2 * d.inter, t)
            a = torch.empty((g.shape[0], d.inter), dtype=self.dt, device=self.dev)
            C.silu_and_mul(a, g)
            o = C.ggml_moe_a8_vec(a, w2, ids, 1, Q5_K, d.hidden, t * d.topk)
        o = o.reshape(t, d.topk, d.hidden).mul_(tw.view(t, d.topk, 1).to(self.dt))
        out = torch.empty_like(x)
        self.M.moe_sum(o, out)
        return out

    def marlin_moe(self, x: Any, w: dict[str, Any], ids: Any, tw: Any, ws: Any) -> Any:
        torch, d = self.torch, self.dims
        t = x.shape[0]
        bm = 8
        for bm in (8, 16, 32, 48, 64):
            if t * d.topk / d.experts / bm < 0.9:
                break
        s, e, n = self.align(ids, bm)
        c1 = torch.empty((t * d.topk, 2 * d.inter), dtype=self.dt, device=self.dev)
        c1 = self.M.moe_wna16_marlin_gemm(x, c1, w["w1"], None, w["s1"], None, None, w["z1"], None, None, ws, s, e, n,
                                          tw, bm, d.topk, False, U4, t, 2 * d.inter, d.hidden,
                                          True, False, True, False, -1, -1, -1)
        a = torch.empty((t * d.topk, d.inter), dtype=self.dt, device=self.dev)
        self.C.silu_and_mul(a, c1)
        c3 = torch.empty((t * d.topk, d.hidden), dtype=self.dt, device=self.dev)
        c3 = self.M.moe_wna16_marlin_gemm(a, c3, w["w2"], None, w["s2"], None, None, w["z2"], None, None, ws, s, e, n,
                                          tw, bm, 1, True, U4, t * d.topk, d.hidden, d.inter,
                                          True, False, True, False, -1, -1, -1)
        out = torch.empty_like(x)
        self.M.moe_sum(c3.view(t, d.topk, d.hidden), out)
        return out

    def vllm_linear(self, x: Any, w: Any, qt: int, form: str) -> Any:
        rows = w.shape[0]
        if form == "dispatch":
            safe = 2 if rows > 5120 else 6
            form = "mmvq" if x.shape[0] <= safe else "mmq"
        if form == "mmvq":
            return self.C.ggml_mul_mat_vec_a8(w, x, qt, rows)
        if form == "mmq":
            return self.C.ggml_mul_mat_a8(w, x, qt, rows)
        blk, size = SIZES[qt]
        wd = self.C.ggml_dequantize(w, qt, rows, w.shape[1] // size * blk, self.dt)
        return x @ wd.T

    def triton_align(self, ids: Any, block: int, experts: int) -> tuple[Any, Any, Any]:
        return self.align(ids, block)

    # ---- parts
    def moe(self, tokens: list[int]) -> list[dict[str, Any]]:
        torch, d, gt = self.torch, self.dims, self.gt
        L = self.layers
        w = [(self.gguf_rows((d.experts,), 2 * d.inter, d.hidden, Q4_K),
              self.gguf_rows((d.experts,), d.hidden, d.inter, Q5_K)) for _ in range(L)]
        group = 32
        mw = [dict(
            w1=torch.randint(-2**31, 2**31 - 1, (d.experts, d.hidden // 16, 2 * d.inter * 2), dtype=torch.int32,
                             device=self.dev),
            s1=(torch.rand((d.experts, d.hidden // group, 2 * d.inter), device=self.dev) * 0.01).to(self.dt),
            z1=torch.randint(-2**31, 2**31 - 1, (d.experts, d.hidden // group, 2 * d.inter // 8), dtype=torch.int32,
                             device=self.dev),
            w2=torch.randint(-2**31, 2**31 - 1, (d.experts, d.inter // 16, d.hidden * 2), dtype=torch.int32,
                             device=self.dev),
            s2=(torch.rand((d.experts, d.inter // group, d.hidden), device=self.dev) * 0.01).to(self.dt),
            z2=torch.randint(-2**31, 2**31 - 1, (d.experts, d.inter // group, d.hidden // 8), dtype=torch.int32,
                             device=self.dev),
        ) for _ in range(L)]
        ws = torch.zeros(self.sms * 4, dtype=torch.int32, device=self.dev)
        expert_bytes = w[0][0][0].numel() + w[0][1][0].numel()
        rows: list[dict[str, Any]] = []
        for t in tokens:
            torch.manual_seed(t)
            xs = [torch.randn((t, d.hidden), dtype=self.dt, device=self.dev) * 0.1 for _ in range(L)]
            ids = [torch.rand((t, d.experts), device=self.dev).topk(d.topk, dim=1).indices.to(torch.int32)
                   for _ in range(L)]
            tws = [torch.softmax(torch.randn((t, d.topk), device=self.dev), -1).float() for _ in range(L)]
            uniq = statistics.mean(len(torch.unique(i)) for i in ids)
            row: dict[str, Any] = {"tokens": t, "unique_experts": uniq,
                                   "floor": uniq * expert_bytes / self.read_bw * 1e6}
            forms = ["vec", "mmq"] if t <= 128 else ["mmq"]
            for form in forms:
                us, err = self.safe_time([partial(self.vllm_moe, xs[j], w[j][0], w[j][1], ids[j], tws[j], form)
                                          for j in range(L)])
                row[f"vllm_{form}"] = us
                if err:
                    row[f"vllm_{form}_err"] = err
            row["vllm"] = row.get("vllm_vec" if t <= 64 else "vllm_mmq")
            cands = [v for k, v in row.items() if k.startswith("vllm_") and not k.endswith("_err") and v]
            row["vllm_best"] = min(cands) if cands else None
            us, err = self.safe_time([partial(self.marlin_moe, xs[j], mw[j], ids[j], tws[j], ws) for j in range(L)])
            row["marlin"] = us
            if err:
                row["marlin_err"] = err
            per: dict[str, float | None] = {}
            for cfg in moe_candidates(gt, t):
                us, err = self.safe_time([partial(gt.gguf_moe, xs[j], w[j][0], w[j][1], tws[j], ids[j], Q4_K, Q5_K,
                                                   align=self.triton_align, config=cfg) for j in range(L)])
                per[cfg_name(cfg)] = us
                if err:
                    row.setdefault("triton_errors", {})[cfg_name(cfg)] = err
            ok = {k: v for k, v in per.items() if v is not None}
            row["triton_configs"] = per
            if ok:
                best = min(ok, key=lambda k: ok[k])
                row["triton"], row["triton_config"] = ok[best], best
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "triton_configs"}), flush=True)
            del xs, ids, tws
            torch.cuda.empty_cache()
        return rows

    def dense(self, tokens: list[int]) -> list[dict[str, Any]]:
        torch, d, gt = self.torch, self.dims, self.gt
        L = self.layers
        rows: list[dict[str, Any]] = []
        ops = [*d.dense_ops(), d.lm_head()]
        for name, k, n, qt in ops:
            nl = 2 if name == "lm_head" else L
            if qt is None:
                ws16 = [torch.randn((n, k), dtype=self.dt, device=self.dev) * 0.01 for _ in range(nl)]
                wq = None
            else:
                wq = [self.gguf_rows((), n, k, qt) for _ in range(nl)]
                ws16 = [torch.randn((n, k), dtype=self.dt, device=self.dev) * 0.01 for _ in range(nl)]
            for t in tokens:
                if name == "lm_head" and t > 64:
                    continue
                xs = [torch.randn((t, k), dtype=self.dt, device=self.dev) * 0.1 for _ in range(nl)]
                row: dict[str, Any] = {"tokens": t, "op": name, "k": k, "n": n, "type": qt}
                row["cublas"], _ = self.safe_time([partial(torch.matmul, xs[j], ws16[j].T) for j in range(nl)])
                if wq is None:
                    row["vllm"] = row["triton"] = row["best"] = row["cublas"]
                    row["floor"] = n * k * 2 / self.read_bw * 1e6
                else:
                    row["floor"] = wq[0].numel() / self.read_bw * 1e6
                    assert qt is not None
                    gq = qt
                    for form in ("dispatch", "mmvq", "mmq", "dequant"):
                        if form == "mmvq" and t > 8:
                            continue
                        us, err = self.safe_time([partial(self.vllm_linear, xs[j], wq[j], gq, form) for j in range(nl)])
                        row["vllm" if form == "dispatch" else f"vllm_{form}"] = us
                        if err:
                            row[f"vllm_{form}_err"] = err
                    per: dict[str, float | None] = {}
                    for cfg in dense_candidates(gt, t):
                        us, err = self.safe_time([partial(gt.gguf_linear, xs[j], wq[j], qt, config=cfg)
                                                  for j in range(nl)])
                        per[cfg_name(cfg)] = us
                        if err:
                            row.setdefault("triton_errors", {})[cfg_name(cfg)] = err
                    ok = {kk: v for kk, v in per.items() if v is not None}
                    row["triton_configs"] = per
                    if ok:
                        best = min(ok, key=lambda kk: ok[kk])
                        row["triton"], row["triton_config"] = ok[best], best
                    cands = [v for kk, v in row.items()
                             if kk in ("triton", "vllm", "vllm_mmvq", "vllm_mmq", "vllm_dequant") and v]
                    row["best"] = min(cands) if cands else None
                rows.append(row)
                print(json.dumps({kk: v for kk, v in row.items() if kk != "triton_configs"}), flush=True)
            del wq, ws16
            torch.cuda.empty_cache()
        return rows

    def check(self, tokens: list[int]) -> list[dict[str, Any]]:
        """Each form at the real shapes against float32 over vLLM's dequantized weights."""
        torch, d, gt = self.torch, self.dims, self.gt
        out: list[dict[str, Any]] = []
        # the bounds are fp16's (outputs rounded to 2^-11); bf16 rounds to 2^-8: 3x them
        # (measured on the H100: every form within 2.6e-3 in bf16, vLLM's kernels 4-7e-3)
        widen = 1.0 if self.dt == torch.float16 else 3.0

        def rel(a: Any, b: Any) -> float:
            return float((a.float() - b).norm() / b.norm())

        def deq(w: Any, qt: int) -> Any:
            blk, size = SIZES[qt]
            return self.C.ggml_dequantize(w, qt, w.shape[0], w.shape[1] // size * blk, torch.float32)

        for name, k, n, qt in [*d.dense_ops(), d.lm_head()]:
            if qt is None:
                continue
            w = self.gguf_rows((), n, k, qt)
            wf = deq(w, qt)
            for t in tokens:
                x = torch.randn((t, k), dtype=self.dt, device=self.dev)
                ref = x.float() @ wf.T
                for cfg in {cfg_name(c): c for c in dense_candidates(gt, t)}.values():
                    y = gt.gguf_linear(x, w, qt, config=cfg)
                    out.append({"what": f"{name} {cfg_name(cfg)}", "tokens": t, "triton_err": rel(y, ref),
                                "vllm_err": rel(self.vllm_linear(x, w, qt, "dispatch"), ref),
                                "bound": widen * (1e-3 if cfg.form == "fma" else 2e-3)})
        # small scales: the MoE's fp16 outputs stay finite
        w13 = self.gguf_rows((d.experts,), 2 * d.inter, d.hidden, Q4_K, scale=0.01)
        w2 = self.gguf_rows((d.experts,), d.hidden, d.inter, Q5_K, scale=0.01)
        f13 = torch.stack([deq(w13[e], Q4_K) for e in range(d.experts)])
        f2 = torch.stack([deq(w2[e], Q5_K) for e in range(d.experts)])
        for t in tokens:
            x = torch.randn((t, d.hidden), dtype=self.dt, device=self.dev) * 0.1
            ids = torch.rand((t, d.experts), device=self.dev).topk(d.topk, dim=1).indices.to(torch.int32)
            tw = torch.softmax(torch.randn((t, d.topk), device=self.dev), -1).float()
            flat = ids.reshape(-1).long()
            pair = torch.empty((flat.numel(), d.hidden), dtype=torch.float32, device=self.dev)
            xf = x.float()
            for e in torch.unique(flat).tolist():
                sel = (flat == e).nonzero().squeeze(1)
                gu = xf[sel // d.topk] @ f13[e].T
                pair[sel] = (torch.nn.functional.silu(gu[:, :d.inter]) * gu[:, d.inter:]) @ f2[e].T
            ref = (pair.view(t, d.topk, d.hidden) * tw[:, :, None]).sum(1)
            vl = self.vllm_moe(x, w13, w2, ids, tw, "vec" if t <= 64 else "mmq")
            for cfg in {cfg_name(c): c for c in moe_candidates(gt, t)}.values():
                y = gt.gguf_moe(x, w13, w2, tw, ids, Q4_K, Q5_K, align=self.triton_align, config=cfg)
                out.append({"what": f"moe {cfg_name(cfg)}", "tokens": t, "triton_err": rel(y, ref),
                            "vllm_err": rel(vl, ref), "bound": widen * (2e-3 if cfg.form == "fma" else 3e-3)})
        bad = [r for r in out if not r["triton_err"] <= r["bound"]]
        for r in bad:
            print("CHECK FAILED", json.dumps(r), flush=True)
        return out


def _tokens(arg: str | None, default: list[int]) -> list[int]:
    return [int(v) for v in arg.split(",")] if arg else default


def cmd_run(ns: argparse.Namespace) -> int:
    import torch
    import triton

    gt = load_module(Path(ns.kernels))
    b = Bench(Path(ns.site), gt, Dims(tp=ns.tp), ns.layers, ns.reps, ns.dtype)
    b.read_bw = b.bandwidth()
    res: dict[str, Any] = {
        "label": ns.label, "device": b.name, "sms": b.sms, "torch": torch.__version__, "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
        "dims": asdict(b.dims), "layers": ns.layers, "reps": ns.reps, "dtype": ns.dtype,
        "read_bw_GBps": b.read_bw / 1e9,
        "read_bw_is": "bytes a device-to-device copy moves (read + write) per second",
    }
    print(f"{b.name}: read bandwidth {b.read_bw / 1e9:,.0f} GB/s", flush=True)
    out = Path(ns.out)

    def save() -> None:
        out.write_text(json.dumps(res, indent=1), encoding="utf-8")

    for part in ns.parts.split(","):
        t0 = time.time()
        if part == "check":
            res["check"] = b.check(_tokens(ns.check_tokens, [1, 3, 16, 256]))
        elif part == "moe":
            res["moe"] = b.moe(_tokens(ns.tokens, MOE_TOKENS))
        elif part == "dense":
            res["dense"] = b.dense(_tokens(ns.dense_tokens, DENSE_TOKENS))
        else:
            raise SystemExit(f"unknown part {part}")
        res.setdefault("seconds", {})[part] = round(time.time() - t0, 1)
        save()
    bad = [r for r in res.get("check", []) if not r["triton_err"] <= r["bound"]]
    return 1 if bad else 0


def cmd_precompile(ns: argparse.Namespace) -> int:
    """Compile every candidate in N processes at once (Triton's disk cache is shared), by
    running each candidate once at the real shapes; the timing run then finds them compiled."""
    procs = [subprocess.Popen([sys.executable, __file__, "run", "--site", ns.site, "--kernels", ns.kernels,
                               "--out", os.devnull, "--parts", "check", "--layers", "1", "--reps", "1",
                               "--tp", str(ns.tp), "--check-tokens", tok])
             for tok in ns.groups.split(";")]
    return max(p.wait() for p in procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--site", required=True, help="directory holding vLLM's _C.abi3.so and _moe_C.abi3.so")
    r.add_argument("--kernels", required=True, help="the gguf_triton module (extract it from patch 0014)")
    r.add_argument("--out", required=True)
    r.add_argument("--parts", default="check,moe,dense")
    r.add_argument("--tokens", help="MoE step sizes, comma-separated")
    r.add_argument("--dense-tokens")
    r.add_argument("--check-tokens")
    r.add_argument("--tp", type=int, default=8)
    r.add_argument("--layers", type=int, default=8)
    r.add_argument("--reps", type=int, default=20)
    r.add_argument("--label", default="run")
    r.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="the activations' dtype")
    p = sub.add_parser("precompile")
    p.add_argument("--site", required=True)
    p.add_argument("--kernels", required=True)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--groups", default="1;2,4;8,16;32,64;128,256,512;1024,2048,4096")
    s = sub.add_parser("summarize")
    s.add_argument("results", nargs="+")
    e = sub.add_parser("extract")
    e.add_argument("patch")
    e.add_argument("dest")
    ns = ap.parse_args(argv)
    if ns.cmd == "run":
        return cmd_run(ns)
    if ns.cmd == "precompile":
        return cmd_precompile(ns)
    if ns.cmd == "summarize":
        print(summarize([json.loads(Path(f).read_text(encoding="utf-8")) for f in ns.results]))
        return 0
    for f in extract_new_files(Path(ns.patch), Path(ns.dest)):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
