"""Patch 0015's GGUF weight kernels (gguf_triton), checked in Triton's CPU interpreter
against a float32 matmul of gguf-py's dequantized weights.

usage: TRITON_INTERPRET=1 PYTHONPATH=<patched site> python gguf_triton_check.py [CASE ...]
The kernel module is loaded from its file in the patched site, without importing vLLM
(it imports only torch and Triton): the check costs the interpreter's time, not
vLLM's import. Prints one JSON line: {case: relative L2 error of the output}; CASEs (names below)
run only those. Every type (Q4_K, Q5_K,
Q6_K, Q8_0) in every form the dispatch can pick: the FMA kernels over super-blocks and
over sub-blocks, unsplit and split over K (the deterministic fix-up), the tensor-core
tiles; a merged layer's shards read in place from the padded weight into column slices
of one output; the routed experts pair by pair (gate/up, SiLU, down with the router
weights) and grouped by expert; fp16 and bf16 activations. Shapes are small (the
interpreter runs every program in Python) but every path of the index arithmetic
(several super-blocks, a split that ends inside a super-block, Q8_0 rows that are not
a whole number of super-blocks, a weight whose row stride exceeds its row) is taken.
Weights are valid GGUF blocks with random values (any bit pattern of the quant fields
is a valid block; d and dmin finite and small).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from functools import partial

import gguf
import numpy as np
import torch


def load_kernels():  # type: ignore[no-untyped-def]
    """gguf_triton from the vllm package on the path, loaded as a file (top-level
    find_spec does not run vllm/__init__)."""
    vllm = importlib.util.find_spec("vllm")
    assert vllm is not None and vllm.submodule_search_locations, "no vllm on PYTHONPATH"
    path = f"{next(iter(vllm.submodule_search_locations))}/model_executor/layers/quantization/gguf_triton.py"
    spec = importlib.util.spec_from_file_location("gguf_triton", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gguf_triton"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gt = load_kernels()

RNG = np.random.default_rng(0)
GEN = torch.Generator().manual_seed(0)


def rand_rows(qtype: int, n: int, k: int) -> np.ndarray:
    values, size = gt.BLOCK[qtype]
    nb = k // values
    b = RNG.integers(0, 256, size=(n, nb, size), dtype=np.uint8)

    def halves() -> np.ndarray:
        return RNG.uniform(0.001, 0.02, size=(n, nb)).astype(np.float16).view(np.uint8).reshape(n, nb, 2)

    if qtype in (gt.Q4_K, gt.Q5_K):
        b[..., 0:2] = halves()
        b[..., 2:4] = halves()
    elif qtype == gt.Q6_K:
        b[..., 208:210] = halves()
    else:
        b[..., 0:2] = halves()
    return b.reshape(n, nb * size)


def deq(qtype: int, w: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(w, qtype).astype(np.float32))


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def dense(qtype: int, m: int, n: int, k: int, cfg: gt.Config, dtype: torch.dtype = torch.float32) -> float:
    w = rand_rows(qtype, n, k)
    x = torch.randn(m, k, generator=GEN).to(dtype)
    ref = x.float() @ deq(qtype, w).T
    return rel(gt.gguf_linear(x, torch.from_numpy(w), qtype, config=cfg), ref)


def merged(cfg: gt.Config) -> float:
    """q_a (Q5_K) beside kv_a (Q6_K) in one padded weight, as vLLM pads a merged layer."""
    k = 512
    a, b = rand_rows(gt.Q5_K, 32, k), rand_rows(gt.Q6_K, 16, k)
    padded = torch.zeros((48, max(a.shape[1], b.shape[1])), dtype=torch.uint8)
    padded[:32, : a.shape[1]] = torch.from_numpy(a)
    padded[32:, : b.shape[1]] = torch.from_numpy(b)
    x = torch.randn(3, k, generator=GEN)
    out = torch.empty((3, 48))
    gt.gguf_linear(x, padded[:32, : a.shape[1]], gt.Q5_K, out=out[:, :32], config=cfg)
    gt.gguf_linear(x, padded[32:, : b.shape[1]], gt.Q6_K, out=out[:, 32:], config=cfg)
    ref = torch.cat([x @ deq(gt.Q5_K, a).T, x @ deq(gt.Q6_K, b).T], dim=1)
    return rel(out, ref)


def moe(qt13: int, qt2: int, t: int, cfg: gt.Config, experts: int = 4, hidden: int = 256, inter: int = 256,
        topk: int = 2) -> float:
    w13 = np.stack([rand_rows(qt13, 2 * inter, hidden) for _ in range(experts)])
    w2 = np.stack([rand_rows(qt2, hidden, inter) for _ in range(experts)])
    x = torch.randn(t, hidden, generator=GEN)
    ids = torch.stack([torch.randperm(experts, generator=GEN)[:topk] for _ in range(t)]).to(torch.int32)
    tw = torch.softmax(torch.randn(t, topk, generator=GEN), -1)
    f13 = [deq(qt13, w13[e]) for e in range(experts)]
    f2 = [deq(qt2, w2[e]) for e in range(experts)]
    ref = torch.zeros(t, hidden)
    for i in range(t):
        for j in range(topk):
            e = int(ids[i, j])
            gu = f13[e] @ x[i]
            ref[i] += tw[i, j] * (f2[e] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
    y = gt.gguf_moe(x, torch.from_numpy(w13), torch.from_numpy(w2), tw, ids, qt13, qt2, config=cfg)
    return rel(y, ref)


def cases() -> dict[str, Callable[[], float]]:
    C = gt.Config
    out: dict[str, Callable[[], float]] = {}
    for qt in (gt.Q4_K, gt.Q5_K, gt.Q6_K, gt.Q8_0):
        name = gt.TYPE_NAMES[qt]
        out[f"dense {name} fma256"] = partial(dense, qt, 1, 32, 512, C("fma", block_n=32, split_k=1, grain=256))
        out[f"dense {name} fma256 split"] = partial(dense, qt, 2, 32, 768, C("fma", block_n=32, split_k=2, grain=256))
        out[f"dense {name} fma32 split"] = partial(dense, qt, 2, 32, 768,
                                                   C("fma", block_n=32, split_k=2, grain=32, unroll=4))
        out[f"dense {name} dot"] = partial(dense, qt, 3, 32, 512, C("dot", block_m=16, block_n=32, unroll=2))
        out[f"dense {name} dotq"] = partial(dense, qt, 3, 32, 512, C("dotq", block_m=16, block_n=32))
        out[f"dense {name} dotq fp16"] = partial(dense, qt, 17, 16, 512, C("dotq", block_m=16, block_n=16),
                                                 torch.float16)
    out["dense Q8_0 fma256 partial super-block"] = partial(dense, gt.Q8_0, 2, 16, 320, C("fma", block_n=16))
    out["dense Q8_0 dot partial super-block"] = partial(dense, gt.Q8_0, 2, 16, 320, C("dot", block_m=16, block_n=16))
    out["dense Q4_K dot fp16"] = partial(dense, gt.Q4_K, 3, 32, 512, C("dot", block_m=16, block_n=32), torch.float16)
    out["dense Q6_K fma256 bf16"] = partial(dense, gt.Q6_K, 1, 32, 512, C("fma", block_n=32, split_k=2),
                                            torch.bfloat16)
    out["merged Q5_K+Q6_K fma256"] = partial(merged, C("fma", block_n=16, split_k=2, grain=256))
    out["merged Q5_K+Q6_K dot"] = partial(merged, C("dot", block_m=16, block_n=16))
    out["merged Q5_K+Q6_K dotq"] = partial(merged, C("dotq", block_m=16, block_n=16))
    out["dense Q8_0 dotq partial super-block"] = partial(dense, gt.Q8_0, 2, 16, 320, C("dotq", block_m=16, block_n=16))
    out["moe Q4_K/Q5_K fma256 split"] = partial(moe, gt.Q4_K, gt.Q5_K, 2, C("fma", block_n=64, split_k=2, grain=256),
                                                hidden=512)
    out["moe Q4_K/Q5_K fma32"] = partial(moe, gt.Q4_K, gt.Q5_K, 2, C("fma", block_n=64, grain=32, unroll=4))
    out["moe Q4_K/Q5_K dot"] = partial(moe, gt.Q4_K, gt.Q5_K, 5, C("dot", block_m=16, block_n=64, unroll=2))
    out["moe Q6_K/Q8_0 dot"] = partial(moe, gt.Q6_K, gt.Q8_0, 3, C("dot", block_m=16, block_n=64, unroll=2))
    out["moe Q4_K/Q5_K dotq"] = partial(moe, gt.Q4_K, gt.Q5_K, 5, C("dotq", block_m=16, block_n=64))
    out["moe Q6_K/Q8_0 dotq"] = partial(moe, gt.Q6_K, gt.Q8_0, 3, C("dotq", block_m=16, block_n=64))
    return out


def main(names: list[str]) -> None:
    todo = cases()
    unknown = [n for n in names if n not in todo]
    if unknown:
        raise SystemExit(f"unknown cases: {unknown}")
    print(json.dumps({n: fn() for n, fn in todo.items() if not names or n in names}))


if __name__ == "__main__":
    main(sys.argv[1:])
