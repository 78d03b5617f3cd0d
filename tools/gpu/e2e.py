"""The served model against its oracles: the end-to-end checks of a vLLM server.

One script with options, for every end-to-end run (docs/validation/e2e_serving.md has
what each run measured and its command):

  prompts  seeded prompts of given lengths (the numpy generator the diagnostics funnel
           uses), after the held prompts of --include (tools/gpu/e2e-prompts.json: 128,
           256 and 200 seeded tokens and a 23-token chat prompt) -> PROMPTS.json
  query    on the GPU machine, one server at a time (OpenAI API, token ids in and out):
           each prompt's next-token log-probs at every position (`echo`, the top
           --logprobs, the rest -inf), its greedy continuation with the top-1/top-2
           margin at each generated token, the single-stream decode time (median of
           --repeats), the same prompts sent together (largest |log-prob difference|
           against the sequential ones), and vLLM's speculative-decoding counters
           (/metrics, the MTP acceptance per draft position) -> OUT.json, OUT.npz
  oracles  here, on the CPU: the oracles' logits for the same prompts on the same GGUF:
           llama.cpp, and the CPU reference (glm5_tools.diagnostics.dsa_reference) as
           trained, with vLLM's fp8 rounding of the indexer, dense, and with a wrong
           (off-by-one) selection; on request with the latent kept as a bf16 or as patch
           0013's fp8 cache keeps it -> ORACLES.npz
  compare  here: each server's distributions against each oracle (mean KL(oracle ||
           server) and top-1 agreement, at positions before index_topk and from it on),
           server against server (--pair A:B), greedy equality with a --baseline server,
           and the verdict: a server serves GLM-5's sparse attention when its KL to
           --verdict-oracle past index_topk stays within twice the spread of
           --spread-oracle on every prompt longer than index_topk; the oracles named by
           --must-fail go through the same check and must fail it, or the check could
           not catch a fault -> REPORT.json
  causal   on the GPU machine, no oracle needed: two prompts that differ only in the
           token at position m must give equal log-probs at every position before m
           (the shapes are equal and prompt log-probs skip the prefix cache, so a
           correct server gives equal numbers) -> REPORT.json, exit 1 when not causal
  repeat   here: two query results of the same prompts (two calls, or sequential
           against together), bit for bit, before index_topk and from it on

Only the standard library and numpy, except `oracles` (torch, gguf-py and llama.cpp's
bindings, as the diagnostics funnel uses them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float32]
NEG = np.float32(-np.inf)


# ---- the server ------------------------------------------------------------------------
@dataclass
class Server:
    url: str
    model: str = "glm-5"
    key: str | None = None
    timeout: float = 300.0

    def _request(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url.rstrip("/") + path, data, headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            return bytes(r.read())

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        body = {"model": self.model, "temperature": 0, "return_tokens_as_token_ids": True, **body}
        result: dict[str, Any] = json.loads(self._request("/v1/completions", body))
        return result

    def metrics(self) -> str:
        return self._request("/metrics").decode()


def token_id(s: str) -> int:
    """vLLM's `token_id:N` (return_tokens_as_token_ids) as N."""
    return int(s.split(":", 1)[1])


def prompt_logprobs(server: Server, ids: list[int], k: int, vocab: int) -> Array:
    """[len(ids) - 1, vocab]: row i is the distribution of token i + 1 given tokens <= i
    (the top k the server lists, -inf elsewhere)."""
    r = server.complete({"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": k})
    tops = r["choices"][0]["logprobs"]["top_logprobs"][1 : len(ids)]
    m = np.full((len(ids) - 1, vocab), NEG, dtype=np.float32)
    for i, d in enumerate(tops):
        for s, v in (d or {}).items():
            m[i, token_id(s)] = v
    return m


def greedy(server: Server, ids: list[int], n: int) -> tuple[list[int], list[float], float]:
    """Greedy ids, the top-1 minus top-2 log-prob at each generated token, seconds."""
    t = time.perf_counter()
    r = server.complete({"prompt": ids, "max_tokens": n, "ignore_eos": True, "logprobs": 2})
    took = time.perf_counter() - t
    lp = r["choices"][0]["logprobs"]
    margins = []
    for top in lp["top_logprobs"]:
        values = sorted((float(v) for v in (top or {}).values()), reverse=True)
        margins.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return [token_id(s) for s in lp["tokens"]], margins, took


def spec_counters(text: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters (`vllm:spec_decode_*`) from /metrics, summed
    over their labels; the per-position ones as `name[position]`. The `_created` series
    (creation timestamps) are left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name.endswith("_created"):
            continue
        if 'position="' in name_labels:
            name += "[" + name_labels.split('position="', 1)[1].split('"', 1)[0] + "]"
        out[name] = out.get(name, 0.0) + float(value)
    return out


def acceptance(spec: dict[str, float]) -> dict[str, Any]:
    """Drafts, mean acceptance length and the acceptance rate per draft position."""
    drafts = spec.get("vllm:spec_decode_num_drafts_total", 0.0)
    if not drafts:
        return {}
    per_pos = sorted(
        (int(k.split("[", 1)[1].rstrip("]")), v)
        for k, v in spec.items()
        if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos") and "[" in k
    )
    accepted = spec.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    return {
        "drafts": int(drafts),
        "mean_acceptance_length": round(1 + accepted / drafts, 3),
        "acceptance_per_position": [round(v / drafts, 4) for _, v in per_pos],
    }


def query(args: argparse.Namespace) -> int:
    server = Server(args.url, args.model, _key(args))
    prompts: list[dict[str, Any]] = json.loads(Path(args.prompts).read_text())
    k = args.logprobs or args.vocab
    spec_before = _safe_counters(server)
    arrays: dict[str, Array] = {}
    rows: list[dict[str, Any]] = []
    for n, p in enumerate(prompts):
        ids = [int(i) for i in p["ids"]]
        row: dict[str, Any] = {"n_tokens": len(ids)}
        try:
            if args.logprobs >= 0:
                arrays[f"lp{n}"] = prompt_logprobs(server, ids, k, args.vocab)
            runs: list[list[int]] = []
            per_token: list[float] = []
            margins: list[float] = []
            for _ in range(max(1, args.repeats)):
                _, _, t1 = greedy(server, ids, 1) if args.max_tokens > 1 else ([], [], 0.0)
                generated, margins, tn = greedy(server, ids, args.max_tokens)
                runs.append(generated)
                if args.max_tokens > 1:
                    per_token.append((tn - t1) / (args.max_tokens - 1))
            row.update(greedy_ids=runs[-1], greedy_margins=margins, repeats_equal=all(r == runs[0] for r in runs))
            if per_token:
                row["decode_s_per_token"] = statistics.median(per_token)
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        rows.append(row)
        print(
            json.dumps({"prompt": n, **{x: row.get(x) for x in ("n_tokens", "error", "decode_s_per_token")}}),
            flush=True,
        )
    report: dict[str, Any] = {"url": args.url, "logprobs": k, "max_tokens": args.max_tokens, "prompts": rows}
    if args.together and args.logprobs >= 0:
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(
                pool.map(lambda p: prompt_logprobs(server, [int(i) for i in p["ids"]], k, args.vocab), prompts)
            )
        diffs: list[float | None] = []
        for n, m in enumerate(together):
            arrays[f"together{n}"] = m
            diffs.append(max_abs_diff(arrays[f"lp{n}"], m) if f"lp{n}" in arrays else None)
        report["together_vs_sequential_max_abs_diff"] = diffs
    times = [r["decode_s_per_token"] for r in rows if "decode_s_per_token" in r]
    if times:
        report["decode_tokens_per_s"] = round(1.0 / statistics.median(times), 2)
    spec_after = _safe_counters(server)
    if spec_after:
        spec = {name: spec_after[name] - spec_before.get(name, 0.0) for name in sorted(spec_after)}
        report["spec_decode"] = spec
        report["mtp"] = acceptance(spec)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    if arrays:
        np.savez_compressed(out.with_suffix(".npz"), **arrays)  # type: ignore[arg-type]
    errors = sum(1 for r in rows if "error" in r)
    print(f"query: {len(rows)} prompts, {errors} failed -> {out.with_suffix('.json')}")
    return 1 if errors else 0


def _safe_counters(server: Server) -> dict[str, float]:
    try:
        return spec_counters(server.metrics())
    except (urllib.error.URLError, OSError):
        return {}


def _key(args: argparse.Namespace) -> str | None:
    if getattr(args, "key_file", None):
        return Path(args.key_file).read_text().strip()
    return os.environ.get("VLLM_API_KEY") or None


def seeded_prompt(n: int, seed: int, vocab: int) -> list[int]:
    """n token ids below vocab from numpy's default_rng(seed), as the diagnostics funnel's
    prompt_tokens makes them (so the CPU's and the GPU's prompts are the same ids)."""
    if n < 2:
        raise ValueError(f"prompt length {n}: at least 2 tokens")
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def prompts(args: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = json.loads(Path(args.include).read_text()) if args.include else []
    for spec in filter(None, args.seeded.split(",")):
        n, seed = (int(x) for x in spec.split(":", 1))
        out.append({"ids": seeded_prompt(n, seed, args.vocab), "text": f"seeded prompt, {n} tokens, seed {seed}"})
    Path(args.out).write_text(json.dumps(out) + "\n")
    print(f"prompts: {len(out)} ({', '.join(str(len(p['ids'])) for p in out)} tokens) -> {args.out}")
    return 0


# ---- numbers ---------------------------------------------------------------------------------
def log_softmax(x: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    x = np.where(np.isfinite(x), x, -1e30).astype(np.float64)
    m = x.max(-1, keepdims=True)
    return np.asarray(x - m - np.log(np.exp(x - m).sum(-1, keepdims=True)), dtype=np.float64)


def agreement(got: npt.NDArray[Any], ref: npt.NDArray[Any]) -> dict[str, float]:
    """Top-1 agreement and mean/max KL(ref || got) of two [T, V] logit (or log-prob) arrays."""
    g, r = log_softmax(got), log_softmax(ref)
    kl = (np.exp(r) * (r - g)).sum(-1)
    return {
        "positions": int(g.shape[0]),
        "top1": round(float((g.argmax(-1) == r.argmax(-1)).mean()), 4),
        "kl_mean": round(float(kl.mean()), 6),
        "kl_max": round(float(kl.max()), 6),
    }


def max_abs_diff(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    """Largest |a - b| over the entries both list (finite in both); 0.0 when none."""
    both = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[both] - b[both]).max()) if both.any() else 0.0


def split_agreement(got: npt.NDArray[Any], ref: npt.NDArray[Any], topk: int) -> dict[str, dict[str, float]]:
    """agreement() at positions before index_topk and from it on (where sparse and dense
    attention differ), over the rows both have."""
    n = min(len(got), len(ref))
    out = {"before_topk": agreement(got[: min(topk, n)], ref[: min(topk, n)])} if n else {}
    if n > topk:
        out["from_topk"] = agreement(got[topk:n], ref[topk:n])
    return out


# ---- oracles (here, on the CPU) --------------------------------------------------------------
ORACLES = ("llama.cpp", "reference", "reference-fp8-indexer", "reference-dense", "reference-off-by-one")
# on request (--only): the fp8-indexer reference with its MLA latent kept as a bf16 cache
# and as the fp8_ds_mla cache of patch 0013 keep it (everything else float32)
CACHE_ORACLES = {"reference-bf16-cache": "bf16", "reference-fp8-cache": "fp8_ds_mla"}


def oracles(args: argparse.Namespace) -> int:
    only = set(args.only.split(","))
    unknown = only - {*ORACLES, *CACHE_ORACLES}
    if unknown:
        raise SystemExit(f"oracles: unknown {sorted(unknown)}; known: {', '.join([*ORACLES, *CACHE_ORACLES])}")
    from glm5_tools.diagnostics.dsa_reference import GlmDsaReference, latent_cache_rounding
    from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

    gguf = Path(args.gguf)
    prompts: list[dict[str, Any]] = json.loads(Path(args.prompts).read_text())
    model = GlmDsaReference(gguf)
    runs = {
        "reference": {},
        "reference-fp8-indexer": {"attention": "sparse-fp8"},
        "reference-dense": {"attention": "dense"},
        "reference-off-by-one": {"selection_fault": "shift"},
    }
    arrays: dict[str, npt.NDArray[Any]] = {}
    for n, p in enumerate(prompts):
        ids = [int(i) for i in p["ids"]]
        if "llama.cpp" in only:
            arrays[f"llama.cpp/{n}"] = llama_cpp_logits(gguf, ids).numpy()
        for name, kw in runs.items():
            if name in only:
                arrays[f"{name}/{n}"] = model.forward(ids, **kw).logits.float().numpy()
        for name, cache in CACHE_ORACLES.items():
            if name in only:
                model.latent_cache = latent_cache_rounding(cache)
                arrays[f"{name}/{n}"] = model.forward(ids, attention="sparse-fp8").logits.float().numpy()
                model.latent_cache = None
        print(f"oracles: prompt {n} ({len(ids)} tokens)", flush=True)
    arrays["index_topk"] = np.array(model.hp.index_topk)
    np.savez_compressed(args.out, **arrays)  # type: ignore[arg-type]
    return 0


def load_oracles(path: Path) -> tuple[dict[str, dict[int, npt.NDArray[Any]]], int]:
    data = np.load(path)
    out: dict[str, dict[int, npt.NDArray[Any]]] = {}
    for key in data.files:
        if "/" in key:
            name, n = key.rsplit("/", 1)
            out.setdefault(name, {})[int(n)] = data[key]
    return out, int(data["index_topk"])


# ---- compare (here) ----------------------------------------------------------------------------
def compare_report(
    servers: dict[str, dict[int, npt.NDArray[Any]]],
    greedy_ids: dict[str, dict[int, list[int]]],
    oracle: dict[str, dict[int, npt.NDArray[Any]]],
    topk: int,
    *,
    baseline: str | None = None,
    pairs: list[tuple[str, str]] | None = None,
    verdict_oracle: str = "llama.cpp",
    spread_oracle: str | None = "reference-fp8-indexer",
    must_fail: list[str] | None = None,
) -> dict[str, Any]:
    """The comparison as a report (compare's logic without the files)."""
    prompts = sorted({n for o in oracle.values() for n in o})
    report: dict[str, Any] = {"index_topk": topk, "servers": {}, "oracles": {}, "pairs": {}, "verdicts": {}}
    for name, rows in oracle.items():
        if name != verdict_oracle and verdict_oracle in oracle:
            report["oracles"][f"{name} vs {verdict_oracle}"] = {
                n: split_agreement(rows[n], oracle[verdict_oracle][n], topk) for n in prompts if n in rows
            }
    for s, arrays in servers.items():
        per: dict[str, Any] = {}
        for n in prompts:
            if n not in arrays:
                per[str(n)] = {"error": "no result"}
                continue
            per[str(n)] = {
                f"vs {o}": split_agreement(arrays[n], rows[n][: len(arrays[n])], topk)
                for o, rows in oracle.items()
                if n in rows
            }
            if baseline and baseline in greedy_ids and s in greedy_ids and n in greedy_ids[s]:
                per[str(n)]["greedy_equal_to_baseline"] = greedy_ids[s][n] == greedy_ids[baseline].get(n)
        report["servers"][s] = per
    for a, b in pairs or []:
        report["pairs"][f"{a} vs {b}"] = {
            str(n): agreement(servers[a][n], servers[b][n]) for n in prompts if n in servers[a] and n in servers[b]
        }
    # the verdict
    long = [n for n in prompts if verdict_oracle in oracle and len(oracle[verdict_oracle][n]) - 1 > topk]
    if not long:
        report["verdicts"]["note"] = "no prompt longer than index_topk: no verdict"
        return report

    def kls(rows: dict[int, npt.NDArray[Any]]) -> list[float]:
        return [
            agreement(rows[n][topk : len(rows[n])], oracle[verdict_oracle][n][topk : len(rows[n])])["kl_mean"]
            for n in long
        ]

    bound = 2 * max(kls(oracle[spread_oracle])) if spread_oracle and spread_oracle in oracle else None
    report["verdict_kl_max"] = round(bound, 6) if bound is not None else None

    def verdict(values: list[float]) -> str:
        ok = bound is not None and all(v <= bound for v in values)
        return ("PASS" if ok else "FAIL") + " (KL " + ", ".join(f"{v:.4f}" for v in values) + ")"

    for s, arrays in servers.items():
        if any(n not in arrays for n in long):
            report["verdicts"][s] = "NO RESULT"
            continue
        report["verdicts"][s] = verdict(kls(arrays))
    for name in must_fail or []:
        if name in oracle:
            got = verdict(kls(oracle[name]))
            report["verdicts"][name] = got + (
                "" if got.startswith("FAIL") else "  <- the check cannot catch this fault"
            )
    return report


def compare(args: argparse.Namespace) -> int:
    oracle, topk = load_oracles(Path(args.oracles))
    results = Path(args.results)
    servers: dict[str, dict[int, npt.NDArray[Any]]] = {}
    greedy_ids: dict[str, dict[int, list[int]]] = {}
    for s in args.servers.split(","):
        # NAME.npz / NAME.json, or tools/gpu/run's results folder of a server (NAME/e2e.*)
        base = results / s / "e2e" if (results / s).is_dir() else results / s
        npz, meta = base.with_suffix(".npz"), base.with_suffix(".json")
        arrays = np.load(npz) if npz.exists() else None
        servers[s] = {int(k[2:]): arrays[k] for k in arrays.files if k.startswith("lp")} if arrays else {}
        if meta.exists():
            rows = json.loads(meta.read_text())["prompts"]
            greedy_ids[s] = {n: r["greedy_ids"] for n, r in enumerate(rows) if "greedy_ids" in r}
    report = compare_report(
        servers,
        greedy_ids,
        oracle,
        args.index_topk if args.index_topk is not None else topk,
        baseline=args.baseline,
        pairs=[(a, b) for a, b in (p.split(":", 1) for p in args.pair)],
        verdict_oracle=args.verdict_oracle,
        spread_oracle=args.spread_oracle or None,
        must_fail=args.must_fail.split(",") if args.must_fail else [],
    )
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for name, v in report["verdicts"].items():
        print(f"{name}: {v}")
    return (
        1 if any(str(v).startswith(("FAIL", "NO RESULT")) for k, v in report["verdicts"].items() if k in servers) else 0
    )


# ---- causal (no oracle) --------------------------------------------------------------------------
def _top_diff(a: dict[str, float], b: dict[str, float]) -> tuple[float, bool]:
    """Largest |difference| over the tokens both entries list, and whether their best
    tokens agree. (vLLM lists the top-k and the prompt token itself; at position m - 1 the
    latter is the token the two prompts differ in, so only shared tokens are compared.)"""
    shared = set(a) & set(b)
    d = max((abs(a[t] - b[t]) for t in shared), default=0.0)
    return d, max(a, key=a.__getitem__) == max(b, key=b.__getitem__)


def causal_report(server: Server, ids: list[int], cuts: list[int], vocab: int, k: int = 20) -> dict[str, Any]:
    def tops(prompt: list[int]) -> list[dict[str, float]]:
        r = server.complete({"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": k})
        return [d or {} for d in r["choices"][0]["logprobs"]["top_logprobs"][1 : len(prompt)]]

    rows = []
    for m in cuts:
        if not 0 < m < len(ids):
            raise ValueError(f"cut {m} is not inside the prompt (1..{len(ids) - 1})")
        a = tops(ids[: m + 1])
        b = tops([*ids[:m], (ids[m] + 1) % vocab])
        before = [_top_diff(a[i], b[i]) for i in range(m)]
        rows.append(
            {
                "cut": m,
                "max_abs_diff_before_cut": round(max(d for d, _ in before), 6),
                "positions_differing": sum(1 for d, _ in before if d > 0),
                "first_differing_positions": [i for i, (d, _) in enumerate(before) if d > 0][:12],
                "top1_agreement_before_cut": round(sum(1 for _, t in before if t) / m, 4),
            }
        )
    ok = all(r["max_abs_diff_before_cut"] == 0 for r in rows)
    return {"cuts": rows, "verdict": "PASS (causal)" if ok else "FAIL (an output depends on a later token)"}


def causal(args: argparse.Namespace) -> int:
    server = Server(args.url, args.model, _key(args))
    ids = [int(i) for i in json.loads(Path(args.prompts).read_text())[args.prompt]["ids"]]
    report = causal_report(server, ids, [int(c) for c in args.cuts.split(",")], args.vocab)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(report["verdict"])
    return 0 if report["verdict"].startswith("PASS") else 1


# ---- repeat ------------------------------------------------------------------------------------------
def repeat_report(a: npt.NDArray[Any], b: npt.NDArray[Any], topk: int) -> dict[str, Any]:
    both = np.isfinite(a) & np.isfinite(b)
    d = np.where(both, np.abs(np.where(both, a, 0) - np.where(both, b, 0)), 0).max(-1)
    am, bm = np.where(np.isfinite(a), a, -np.inf).argmax(-1), np.where(np.isfinite(b), b, -np.inf).argmax(-1)
    out: dict[str, Any] = {
        "positions": int(a.shape[0]),
        "identical": bool((d == 0).all()),
        "first_differing_position": int(np.argmax(d > 0)) if (d > 0).any() else None,
    }
    for part, sl in (("before_topk", slice(0, topk)), ("from_topk", slice(topk, None))):
        if len(d[sl]):
            out[part] = {
                "top1_agreement": round(float((am[sl] == bm[sl]).mean()), 4),
                "max_abs_diff": round(float(d[sl].max()), 6),
            }
    return out


def repeat(args: argparse.Namespace) -> int:
    report = {}
    for spec in args.pairs:
        name, rest = spec.split("=", 1)
        (fa, ka), (fb, kb) = (x.rsplit(":", 1) for x in rest.split(",", 1))
        report[name] = repeat_report(np.load(fa)[ka], np.load(fb)[kb], args.index_topk)
        print(name, json.dumps(report[name]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["identical"] for r in report.values()) else 1


# ---- the command line --------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/gpu/e2e.py", description=__doc__.split("\n\n", 1)[0])
    sub = p.add_subparsers(dest="command", required=True)

    def server_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
        q.add_argument("--model", default="glm-5", help="served model name (default %(default)s)")
        q.add_argument("--key-file", help="API key file (else $VLLM_API_KEY)")
        q.add_argument("--vocab", type=int, default=2048, help="vocabulary size (default: the tiny fixture's 2048)")

    pr = sub.add_parser("prompts", help="seeded prompts (and the held ones) as one JSON file")
    pr.add_argument("--seeded", default="", help="comma-separated N:SEED, e.g. 4096:10,5120:11")
    pr.add_argument("--include", help="a prompts file to start from (e.g. tools/gpu/e2e-prompts.json)")
    pr.add_argument("--vocab", type=int, default=2048)
    pr.add_argument("--out", required=True)
    pr.set_defaults(func=prompts)

    q = sub.add_parser("query", help="one server's log-probs, greedy output, decode time, MTP counters")
    server_args(q)
    q.add_argument("--prompts", required=True, help="JSON list of {ids: [...]}")
    q.add_argument("--out", required=True, help="OUT prefix: OUT.json, OUT.npz")
    q.add_argument("--logprobs", type=int, default=0, help="top-k per position (0: the whole vocabulary; -1: none)")
    q.add_argument("--max-tokens", type=int, default=16, help="greedy tokens per prompt (default %(default)s)")
    q.add_argument("--repeats", type=int, default=1, help="greedy runs per prompt (decode time: their median)")
    q.add_argument("--together", action="store_true", help="also send the prompts at once and compare")
    q.set_defaults(func=query)

    o = sub.add_parser("oracles", help="the oracles' logits on the CPU (here)")
    o.add_argument("--gguf", required=True)
    o.add_argument("--prompts", required=True)
    o.add_argument("--out", required=True, help="ORACLES.npz")
    o.add_argument(
        "--only", default=",".join(ORACLES), help="comma-separated, of " + ", ".join([*ORACLES, *CACHE_ORACLES])
    )
    o.set_defaults(func=oracles)

    c = sub.add_parser("compare", help="servers against the oracles and each other; the verdict")
    c.add_argument("--results", required=True, help="folder of query's NAME.json / NAME.npz, or of NAME/e2e.*")
    c.add_argument("--servers", required=True, help="comma-separated NAMEs")
    c.add_argument("--oracles", required=True, help="ORACLES.npz (oracles)")
    c.add_argument("--out", required=True)
    c.add_argument("--index-topk", type=int, help="default: the GGUF's, from ORACLES.npz")
    c.add_argument("--baseline", help="greedy equality against this server")
    c.add_argument("--pair", action="append", default=[], help="A:B, server against server (repeatable)")
    c.add_argument("--verdict-oracle", default="llama.cpp")
    c.add_argument("--spread-oracle", default="reference-fp8-indexer", help="bound = 2 x its KL ('' for none)")
    c.add_argument("--must-fail", default="reference-off-by-one,reference-dense")
    c.set_defaults(func=compare)

    k = sub.add_parser("causal", help="no output depends on a later token (no oracle)")
    server_args(k)
    k.add_argument("--prompts", required=True)
    k.add_argument("--prompt", type=int, default=0, help="index into --prompts")
    k.add_argument("--cuts", required=True, help="comma-separated positions m")
    k.add_argument("--out", required=True)
    k.set_defaults(func=causal)

    r = sub.add_parser("repeat", help="two results of the same prompts, bit for bit")
    r.add_argument("pairs", nargs="+", help="NAME=A.npz:KEY,B.npz:KEY (KEY: lp0, together1, ...)")
    r.add_argument("--index-topk", type=int, default=2048)
    r.add_argument("--out")
    r.set_defaults(func=repeat)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
