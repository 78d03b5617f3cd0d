"""Issue 23 item 3: the served fp8 latent cache (patch 0013) against the bf16 cache.

usage: compare_fp8.py RESULTS_DIR OUT.json [--oracle-gguf GGUF | --oracle-npz NPZ]
RESULTS_DIR holds query5.py's <server>.json/.npz of the servers in ports (whole prompt
log-prob distributions of run 5's held prompts, and 16 greedy tokens). Per prompt:
mean/max KL(bf16 server || fp8 server) and top-1 agreement over all positions, the
same for the fp8 server with CUDA graphs against the eager one, greedy equality.
Numpy only (runs on the GPU machine). With --oracle-gguf (here, with the project's
PYTHONPATH=src and llama.cpp's bindings: scripts/make-tiny-glm5), each server also
against llama.cpp's logits of the fixture, at positions below and from index_topk.
--oracle-npz: the same with llama.cpp's logits computed here beforehand (oracle_npz.py),
numpy only, for the GPU machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
PROMPTS = HERE.parent / "run5" / "prompts.json"
BASE = "sparse"
PAIRS = [("sparse", "sparse-fp8"), ("sparse", "sparse-fp8-graphs"), ("sparse-fp8", "sparse-fp8-graphs")]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def agree(ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    """KL(ref || got) per position (nats) and top-1 agreement of two [T, V] log-prob arrays."""
    r, g = log_softmax(ref), log_softmax(got)
    kl = np.sum(np.exp(r) * (r - g), axis=-1)
    return {
        "positions": int(r.shape[0]),
        "kl_mean": float(kl.mean()) if kl.size else None,
        "kl_max": float(kl.max()) if kl.size else None,
        "top1": float(np.mean(np.argmax(r, -1) == np.argmax(g, -1))) if kl.size else None,
    }


def load(results: Path, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    meta_path, npz = results / f"{name}.json", results / f"{name}.npz"
    if not meta_path.exists() or not npz.exists():
        return {}, {}
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(meta_path.read_text()), arrays


def main() -> int:
    results, out = Path(sys.argv[1]), Path(sys.argv[2])
    gguf = Path(sys.argv[sys.argv.index("--oracle-gguf") + 1]) if "--oracle-gguf" in sys.argv else None
    npz = Path(sys.argv[sys.argv.index("--oracle-npz") + 1]) if "--oracle-npz" in sys.argv else None
    prompts = json.loads(PROMPTS.read_text())
    names = [line.split()[0] for line in (HERE / "ports").read_text().splitlines() if line.strip()]
    served = {n: load(results, n) for n in names}
    report: dict[str, Any] = {"servers": {}, "pairs": {}, "greedy_equal_to_bf16": {}}
    for n, (meta, arrays) in served.items():
        report["servers"][n] = {
            "served": bool(arrays),
            "errors": [p.get("error") for p in meta.get("prompts", []) if p.get("error")],
            "concurrent_vs_sequential_max_abs_logprob_diff": meta.get("concurrent_vs_sequential_max_abs_logprob_diff"),
        }
    for a, b in PAIRS:
        (_, xa), (_, xb) = served[a], served[b]
        report["pairs"][f"KL({a} || {b})"] = [
            agree(xa[f"lp{k}"], xb[f"lp{k}"]) if f"lp{k}" in xa and f"lp{k}" in xb else None
            for k in range(len(prompts))
        ]
    base_greedy = [p.get("greedy_ids") for p in served[BASE][0].get("prompts", [])]
    for n, (meta, _) in served.items():
        report["greedy_equal_to_bf16"][n] = [
            (p.get("greedy_ids") == g) if g is not None and p.get("greedy_ids") is not None else None
            for p, g in zip(meta.get("prompts", []), base_greedy, strict=False)
        ]
    oracle: Any = None
    if gguf is not None:
        import torch

        from glm5_tools.diagnostics.dsa_reference import GlmDsaReference
        from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

        topk = GlmDsaReference(gguf).hp.index_topk
        report["oracle"] = {"gguf": gguf.name, "index_topk": topk, "servers": {}}

        def oracle(k: int, ids: list[int]) -> np.ndarray:
            return np.asarray(llama_cpp_logits(gguf, ids)[: len(ids) - 1].to(torch.float64).numpy())
    elif npz is not None:
        with np.load(npz) as z:
            pre = {f: z[f] for f in z.files}
        topk = int(pre["index_topk"])
        report["oracle"] = {"npz": npz.name, "gguf_sha256": str(pre["gguf_sha256"]), "index_topk": topk,
                            "servers": {}}

        def oracle(k: int, ids: list[int]) -> np.ndarray:
            return np.asarray(pre[f"ll{k}"], dtype=np.float64)
    if oracle is not None:
        for n, (_, arrays) in served.items():
            rows = []
            for k, p in enumerate(prompts):
                if f"lp{k}" not in arrays:
                    rows.append(None)
                    continue
                ids = p["ids"]
                ll = oracle(k, ids)
                lp = arrays[f"lp{k}"]
                lp = np.where(np.isfinite(lp), lp, -1e30)
                row = {"below index_topk": agree(ll[:topk], lp[:topk])}
                if len(ids) - 1 > topk:
                    row["from index_topk"] = agree(ll[topk:], lp[topk:])
                rows.append(row)
            report["oracle"]["servers"][f"KL(llama.cpp || {n})"] = rows
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0 if all(s["served"] for s in report["servers"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
