"""GLM-5's sparse decode attention on the GPU: one layer's step, and the indexer's score kernel.

One script with options for the kernel work of patch 0011 (docs/validation/sparse-speed
has what it measured and the commands). It takes the kernel file of patch 0011 twice,
`vllm/v1/attention/backends/mla/sparse_utils.py` of two patched vLLM trees: NEW (the
change) and OLD (what it replaces; the same file twice measures one version), with
vLLM 0.20.2's package importable (its `_C` for the top-k kernels, `_flashmla_C` for
FLASHMLA_SPARSE, its vendored DeepGEMM); tools/gpu/run's setup leaves such a tree in
GPU_ROOT/site (PYTHONPATH=GPU_ROOT/site).

  step       one layer's decode step at GLM-5's per-rank dims (8 heads = TP 8 and 16 =
             TP 4; kv_lora 512 + rope 64; indexer 32 heads x 128 on the fp8 cache with
             per-row fp32 scales; index_topk 2048; page 64), contexts 4k-128k, batch
             1/16/64, random data, each step in a CUDA graph (median of replays), the score
             width GLM-5's max_model_len (as under the unit's FULL decode graphs), four ways:
             (a) NEW, (b) OLD, (c) dense TRITON_MLA (vLLM's decode_attention_fwd over the
             whole context), (d) vLLM's FLASHMLA_SPARSE (FlashMLA's sparse kernel on its fp8
             cache, DeepGEMM's indexer scores); parts: indexer scores / top-k / MLA. Also the
             top-k kernels against the float32 top-k (exact sets, ties, rows shorter than k)
             and the score kernel's settings (SWEEP). --mode quick: fewer shapes; goals: 8
             heads, the large shapes first, no dense, no top-k checks (a short device call)
  indexer    the score kernel alone: OLD, NEW, DeepGEMM's paged indexer and NEW's settings
             (ORDER), each against a float32 reference of the same math
  summarize  Markdown tables of either's results.json

Outputs results.json in --out, written after every shape (a call cut short keeps what ran).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

try:
    import torch
except ImportError:  # `summarize` needs no torch; `step` and `indexer` do
    torch = None  # type: ignore[assignment]

KV_LORA, ROPE, IDX_HEADS, IDX_DIM, TOPK, PAGE = 512, 64, 32, 128, 2048, 64
SCALE = (192 + 64) ** -0.5
MML = 202752  # GLM-5's max_model_len: the score width under CUDA graphs


def load(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph_time(fn: Callable[[], torch.Tensor], target_ms: float = 15.0) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    est = max(1e-3, (time.perf_counter() - t0) * 1e3)
    reps = int(min(100, max(5, target_ms / est)))
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    del g
    return sorted(times)[2]


def fp8_bytes(n: int, dev: torch.device) -> torch.Tensor:
    return torch.randn(n, device=dev).to(torch.float8_e4m3fn).view(torch.uint8)


def build(batch: int, ctx: int, dev: torch.device) -> dict[str, torch.Tensor]:
    per = math.ceil(ctx / PAGE)
    nb = batch * per
    bt = torch.randperm(nb, device=dev).to(torch.int32).view(batch, per)
    idx = torch.empty(nb, PAGE * (IDX_DIM + 4), dtype=torch.uint8, device=dev)
    flash = torch.empty(nb, PAGE, 656, dtype=torch.uint8, device=dev)
    for lo in range(0, nb, 4096):  # bounded temporaries
        hi = min(nb, lo + 4096)
        n = hi - lo
        idx[lo:hi, : PAGE * IDX_DIM] = fp8_bytes(n * PAGE * IDX_DIM, dev).view(n, -1)
        sc = torch.rand(n, PAGE, device=dev) * 0.01 + 0.001
        idx[lo:hi, PAGE * IDX_DIM :] = sc.view(torch.uint8).view(n, -1)
        flash[lo:hi, :, :512] = fp8_bytes(n * PAGE * 512, dev).view(n, PAGE, 512)
        fs = torch.rand(n, PAGE, 4, device=dev) * 0.01 + 0.001
        flash[lo:hi, :, 512:528] = fs.view(torch.uint8).view(n, PAGE, 16)
        rope = (torch.randn(n, PAGE, 64, device=dev) * 0.5).to(torch.bfloat16)
        flash[lo:hi, :, 528:] = rope.view(torch.uint8).view(n, PAGE, 128)
    mla = torch.randn(nb, PAGE, KV_LORA + ROPE, device=dev, dtype=torch.bfloat16) * 0.5
    qi = torch.randn(batch, IDX_HEADS, IDX_DIM, device=dev)
    qs = qi.abs().amax(-1).clamp(min=1e-4) / 448.0
    qq = (qi / qs[..., None]).to(torch.float8_e4m3fn)
    w = torch.randn(batch, IDX_HEADS, device=dev) * qs * IDX_DIM**-0.5 * IDX_HEADS**-0.5
    return {"bt": bt, "idx": idx.view(nb, PAGE, IDX_DIM + 4), "flash": flash, "mla": mla, "qq": qq, "w": w}


def exact_topk_agreement(logits: torch.Tensor, ctx: torch.Tensor, sel: torch.Tensor) -> float:
    """Fraction of rows whose selected set equals the float32 top-k's set."""
    ok = 0
    for r in range(logits.shape[0]):
        n = int(ctx[r])
        k = min(TOPK, n)
        want = torch.topk(logits[r, :n], k).indices.sort().values
        got = sel[r][sel[r] >= 0].sort().values.long()
        ok += int(got.numel() == k and torch.equal(got, want))
    return ok / logits.shape[0]


def topk_checks(new: types.ModuleType, dev: torch.device) -> dict[str, object]:
    """vLLM's kernels through indexer_topk: exact sets, short rows, ties, k=32."""
    out: dict[str, object] = {}
    ws = torch.empty(new.TOPK_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    gen = torch.Generator(device=dev).manual_seed(1)
    for rows in (4, 64):  # <= 32 rows: radix path; > 32: FilteredTopK (>= 128 KiB smem)
        base = [0, 1, 100, 2047, 2048, 2049, 5000, 65536, MML]
        lens = torch.tensor((base * (rows // 9 + 1))[:rows], dtype=torch.int32, device=dev)
        lg = torch.randn(rows, MML, device=dev, generator=gen)
        for k in (2048, 512, 32):  # 32: the torch path (the small fixture's k)
            path = new.topk_path(dev, k)
            try:
                # the kernel's own writes past a short row (sentinel 7 before)
                raw = torch.full((rows, k), 7, dtype=torch.int32, device=dev)
                new.indexer_topk(lg, k, raw, lens, ws)
                # as the op calls it: the buffer set to -1 first
                sel = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
                new.indexer_topk(lg, k, sel, lens, ws)
                torch.cuda.synchronize()
            except Exception as e:
                out[f"rows{rows}_k{k}"] = {"path": path, "error": repr(e)[:500]}
                continue
            agree, pad_ok = 0, True
            for r in range(rows):
                n = int(lens[r])
                kk = min(k, n)
                want = torch.topk(lg[r, :n], kk).indices.sort().values
                got = sel[r][sel[r] >= 0].sort().values.long()
                agree += int(got.numel() == kk and torch.equal(got, want))
                pad_ok &= bool((raw[r] >= 0).sum() == kk) and bool((raw[r][raw[r] < 0] == -1).all())
            out[f"rows{rows}_k{k}"] = {
                "path": path,
                "exact_rows": agree / rows,
                "kernel_writes_minus1_past_short_rows": pad_ok,
            }
    # ties: scores in 8 levels (thousands equal at the k-th place)
    rows = 16
    lens = torch.full((rows,), 20000, dtype=torch.int32, device=dev)
    lg = torch.randint(0, 8, (rows, MML), device=dev, generator=gen).float()
    for k in (2048, 32):
        sels = []
        try:
            for _ in range(3):
                sel = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
                new.indexer_topk(lg, k, sel, lens, ws)
                sels.append(sel.sort(dim=1).values)
            torch.cuda.synchronize()
        except Exception as e:
            out[f"ties_k{k}"] = {"error": repr(e)[:500]}
            continue
        ref = torch.topk(lg[:, :20000], k, dim=1).values.sort(dim=1).values
        vals = lg.gather(1, sels[0].long().clamp(min=0)).sort(dim=1).values
        kth = ref[:, :1]
        above_all = bool(((lg[:, :20000] > kth).sum(1) <= (sels[0] >= 0).sum(1)).all())
        got_above = (lg.gather(1, sels[0].long().clamp(min=0)) > kth).sum(1)
        cpu_sel = torch.empty(rows, k, dtype=torch.int32)
        new.indexer_topk(lg[:, :20000].cpu().contiguous(), k, cpu_sel, lens.cpu())
        earliest = cpu_sel.to(dev).sort(dim=1).values
        out[f"ties_k{k}"] = {
            "path": new.topk_path(dev, k),
            "value_multiset_equals_float32_topk": bool(torch.equal(vals, ref)),
            "all_strictly_above_kth_kept": above_all and bool((got_above == (lg[:, :20000] > kth).sum(1)).all()),
            "same_positions_in_3_runs": all(torch.equal(sels[0], s) for s in sels[1:]),
            "positions_equal_torch_path_earliest_first": bool(torch.equal(sels[0], earliest)),
        }
    return out


def step(new_path: str, old_path: str, out_dir: Path, mode: str = "full") -> None:
    """One layer's decode step, four ways (module docstring): results.json in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    quick = mode == "quick"
    goals = mode == "goals"
    c_error = None
    try:
        import vllm._C  # noqa: F401  (registers torch.ops._C: persistent_topk, top_k_per_row_decode)
    except Exception as e:
        c_error = repr(e)[:500]
        print("vllm._C did not load:", c_error, flush=True)
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    new = load(new_path, "su_new")
    old = load(old_path, "su_old")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(dev),
        "capability": list(torch.cuda.get_device_capability(dev)),
        "sms": sms,
        "max_model_len_width": MML,
        "runs": [],
    }
    if c_error:
        res["vllm_C_error"] = c_error
    try:
        from vllm.third_party.flashmla.flash_mla_interface import flash_mla_with_kvcache, get_mla_metadata

        have_flashmla = True
    except Exception as e:
        have_flashmla = False
        res["flashmla_error"] = repr(e)
    dg = None
    try:  # vLLM's vendored DeepGEMM, called as vllm.utils.deep_gemm calls it
        import vllm.third_party.deep_gemm as dg_mod

        dg = types.SimpleNamespace(
            fp8_fp4_paged_mqa_logits=lambda q, kv, w, lens, bt, sched, max_model_len, clean_logits: (
                dg_mod.fp8_fp4_paged_mqa_logits(q, kv, w, lens, bt, sched, max_model_len, clean_logits)
            ),
            get_paged_mqa_logits_metadata=dg_mod.get_paged_mqa_logits_metadata,
        )
    except Exception as e:
        res["deepgemm_error"] = repr(e)

    def save() -> None:
        (out_dir / "results.json").write_text(json.dumps(res, indent=1) + "\n")

    # memory bandwidth this GPU reaches reading (a 4 GiB sum), for the byte counts
    res["read_bandwidth_GBps_measured"] = read_bandwidth(dev)
    if not goals:
        res["topk_checks"] = topk_checks(new, dev)
        print(json.dumps(res["topk_checks"]), flush=True)
    res["mode"] = mode
    save()

    res["a_defaults"] = a_defaults(new, dev)
    print(json.dumps(res["a_defaults"]), flush=True)
    env = {
        "new": new,
        "old": old,
        "dev": dev,
        "sms": sms,
        "res": res,
        "save": save,
        "dense": None if goals else decode_attention_fwd,
        "heads": (8,) if goals else (8, 16),
        "dg": dg,
        "flashmla": (flash_mla_with_kvcache, get_mla_metadata) if have_flashmla else None,
    }
    ctxs = (4096, 65536) if quick else (4096, 16384, 65536, 131072)
    batches = (1, 16) if quick else (1, 16, 64)
    shapes = [(c, b) for c in ctxs for b in batches]
    if goals:  # the goals' shapes (batch >= 16 from 64k) first
        shapes.sort(key=lambda cb: (not (cb[0] >= 65536 and cb[1] >= 16), cb))
    for ctx, batch in shapes:
        try:
            shape_runs(env, ctx, batch)
        except Exception as e:
            traceback.print_exc()
            res.setdefault("errors", []).append(f"ctx {ctx} batch {batch}: {e!r}"[:800])
            save()
        torch.cuda.empty_cache()
    save()


def shape_runs(env: dict, ctx: int, batch: int) -> None:
    """All four ways at one context and batch, for 8 and 16 heads."""
    new, dev, res, save = (env[k] for k in ("new", "dev", "res", "save"))
    d = build(batch, ctx, dev)
    ws = torch.empty(new.TOPK_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    seq_lens2d = seq_lens.unsqueeze(-1)
    req_buf = torch.zeros(8192, dtype=torch.int32, device=dev)
    ctx_buf = torch.zeros_like(req_buf)
    t0 = time.perf_counter()
    for _ in range(20):
        new.token_request_and_context(qsl, seq_lens, batch, batch, req_buf, ctx_buf)
    torch.cuda.synchronize()
    t_meta = (time.perf_counter() - t0) / 20 * 1e3
    req, ctxl = req_buf[:batch], ctx_buf[:batch]
    d["sel"] = torch.empty(batch, TOPK, dtype=torch.int32, device=dev)
    d["sel_old"] = torch.empty_like(d["sel"])
    d["logits"] = torch.empty(batch, MML, dtype=torch.float32, device=dev)
    d["logits_old"] = torch.empty_like(d["logits"])
    for heads in env["heads"]:
        res["runs"].append(heads_run(env, ctx, batch, heads, d, (req, ctxl, ws, seq_lens, seq_lens2d, t_meta)))
        save()


def heads_run(env: dict, ctx: int, batch: int, heads: int, d: dict, per: tuple) -> dict:
    new, old, dev, sms, res, dg = (env[k] for k in ("new", "old", "dev", "sms", "res", "dg"))
    decode_attention_fwd = env["dense"]
    req, ctxl, ws, seq_lens, seq_lens2d, t_meta = per
    bt, idx, mla, qq, w = d["bt"], d["idx"], d["mla"], d["qq"], d["w"]
    sel, sel_old, logits, logits_old = d["sel"], d["sel_old"], d["logits"], d["logits_old"]
    q = (torch.randn(batch, heads, KV_LORA + ROPE, device=dev) * 0.5).to(torch.bfloat16)
    run: dict[str, object] = {"ctx": ctx, "batch": batch, "heads": heads}

    def conv(mod: types.ModuleType, s: torch.Tensor) -> torch.Tensor:
        return mod.triton_convert_req_index_to_global_index(
            req, bt, s, BLOCK_SIZE=PAGE, NUM_TOPK_TOKENS=TOPK, BLOCK_N=128
        )

    def steps(
        mod: types.ModuleType, scores: torch.Tensor, chosen: torch.Tensor
    ) -> dict[str, Callable[[], torch.Tensor]]:
        """indexer, top-k, MLA and the three together, through mod's kernels into its own buffers."""

        def idx_step() -> torch.Tensor:
            return mod.indexer_logits(qq, w, idx, bt, req, ctxl, MML, out=scores, tail=False)

        def topk_step() -> torch.Tensor:
            chosen.fill_(-1)
            return mod.indexer_topk(scores, TOPK, chosen, ctxl, ws)

        def mla_step() -> torch.Tensor:
            return mod.sparse_mla(q, mla, conv(mod, chosen), SCALE, KV_LORA, sms)[0]

        def total() -> torch.Tensor:
            idx_step()
            topk_step()
            return mla_step()

        return {"indexer": idx_step, "topk": topk_step, "mla": mla_step, "total": total}

    # (a) new; (b) old: the 0011 this run replaces, called as (a) is
    a_steps, b_steps = steps(new, logits, sel), steps(old, logits_old, sel_old)

    o_a = a_steps["total"]().clone()
    o_b = b_steps["total"]().clone()
    torch.cuda.synchronize()
    run["topk_exact_rows_new"] = exact_topk_agreement(logits, ctxl, sel)
    run["topk_exact_rows_old"] = exact_topk_agreement(logits_old, ctxl, sel_old)
    run["new_vs_old_out_rel_diff"] = float((o_a.float() - o_b.float()).abs().max() / o_b.float().abs().max())
    run["new_sel_equals_old_sel"] = bool(torch.equal(sel, sel_old))
    ref = ref_scores(qq, w, idx, bt, min(ctx, 4096))
    run["scores_rel_err_vs_f32_first4k_new"] = rel_err(logits, ref)
    run["scores_rel_err_vs_f32_first4k_old"] = rel_err(logits_old, ref)
    run["scores_new_vs_old_rel"] = rel_err(logits[:, :ctx], logits_old[:, :ctx])
    parts = {}
    for prefix, step_fns in (("a", a_steps), ("b", b_steps)):
        for step, fn in step_fns.items():
            parts[f"{prefix}_{step}"] = graph_time(fn)
    # the score kernel's settings (SWEEP), at 8 heads only (the indexer has none)
    if heads == 8:
        scratch = torch.empty_like(logits)
        errs = run.setdefault("sweep_rel_err_vs_f32_first4k", {})
        for name, kw in SWEEP:
            fn = lambda kw=kw: new.indexer_logits(qq, w, idx, bt, req, ctxl, MML, out=scratch, tail=False, **kw)  # noqa: E731
            try:
                fn()
                torch.cuda.synchronize()
                errs[name] = rel_err(scratch, ref)
                parts[f"a_indexer_{name}"] = graph_time(fn)
            except Exception as e:
                run.setdefault("sweep_errors", {})[name] = repr(e)[:300]
    # (c) dense TRITON_MLA (vLLM's kernel, the split count of the earlier run)
    splits = min(triton_next_pow2(max(1, ctx // 512)), 2 * sms)
    o_dense = torch.empty(batch, heads, KV_LORA, dtype=torch.bfloat16, device=dev)
    lse_dense = torch.empty(batch, heads, dtype=torch.float32, device=dev)
    attn_logits = torch.empty(batch, heads, splits, KV_LORA + 1, dtype=torch.float32, device=dev)
    cache4 = mla.unsqueeze(2)
    one = torch.ones((), dtype=torch.float32, device=dev)

    def c_all() -> torch.Tensor:
        decode_attention_fwd(
            q,
            cache4,
            cache4[..., :KV_LORA],
            o_dense,
            lse_dense,
            bt,
            seq_lens,
            attn_logits,
            splits,
            SCALE,
            PAGE,
            k_scale=one,
            v_scale=one,
            is_mla=True,
        )
        return o_dense

    if decode_attention_fwd is None:
        run["c_skipped"] = "goals mode"
    elif mla.numel() < 2**31:
        parts["c_total"] = graph_time(c_all)
    else:  # its offsets overflow int32 there (an illegal address on the H100 run)
        run["c_skipped"] = "cache of >= 2**31 elements: vLLM's dense decode kernel faults"
    # (d) FLASHMLA_SPARSE
    if env["flashmla"] is not None:
        flash_mla_with_kvcache, get_mla_metadata = env["flashmla"]
        try:
            fcache = d["flash"].view(-1, PAGE, 1, 656)
            sched = get_mla_metadata()[0]
            qpad = torch.zeros(batch, 1, 64, KV_LORA + ROPE, dtype=torch.bfloat16, device=dev)

            def d_mla() -> torch.Tensor:
                slots = conv(new, sel).view(batch, 1, TOPK)
                qpad[:, 0, :heads] = q
                o, _ = flash_mla_with_kvcache(
                    q=qpad,
                    k_cache=fcache,
                    block_table=None,
                    cache_seqlens=None,
                    head_dim_v=512,
                    tile_scheduler_metadata=sched,
                    softmax_scale=SCALE,
                    is_fp8_kvcache=True,
                    indices=slots,
                )
                return o[:, :, :heads]

            parts["d_mla"] = graph_time(d_mla)
        except Exception as e:
            run["flashmla_error"] = repr(e)[:500]
    if dg is not None and "deepgemm_error" not in res:
        try:
            sched_dg = dg.get_paged_mqa_logits_metadata(seq_lens2d, PAGE, sms)
            kv4 = idx.unsqueeze(-2)

            def d_idx() -> torch.Tensor:
                return dg.fp8_fp4_paged_mqa_logits(
                    (qq.view(batch, 1, IDX_HEADS, IDX_DIM), None),
                    kv4,
                    w,
                    seq_lens2d,
                    bt,
                    sched_dg,
                    max_model_len=MML,
                    clean_logits=False,
                )

            lg_dg = d_idx()
            torch.cuda.synchronize()
            run["deepgemm_vs_triton_scores_rel"] = float(
                (lg_dg[:, :ctx] - logits[:, :ctx]).abs().max() / logits[:, :ctx].abs().max()
            )
            parts["d_indexer"] = graph_time(d_idx)
        except Exception as e:
            res["deepgemm_error"] = repr(e)[:800]
    if "d_mla" in parts:
        d_idx_t = parts.get("d_indexer", parts["a_indexer"])
        parts["d_total_parts_sum"] = d_idx_t + parts["a_topk"] + parts["d_mla"]
        run["d_indexer_from"] = "deepgemm" if "d_indexer" in parts else "triton (a) - DeepGEMM did not run"
    run["ms"] = parts
    run["token_meta_once_per_step_ms_eager"] = t_meta
    # bytes a decode step must read: the indexer cache (132 B/token) and the
    # selected latent rows (1152 B bf16 each; 656 B in (d)'s fp8 cache)
    sel_rows = batch * min(ctx, TOPK)
    run["bytes_must_read_a"] = batch * ctx * (IDX_DIM + 4) + sel_rows * (KV_LORA + ROPE) * 2
    run["bytes_must_read_d"] = batch * ctx * (IDX_DIM + 4) + sel_rows * 656
    run["bytes_dense_reads"] = batch * ctx * (KV_LORA + ROPE) * 2
    run["a_GBps"] = run["bytes_must_read_a"] / parts["a_total"] / 1e6
    print(json.dumps(run), flush=True)
    return run


# the score kernel's settings `step` times beside (a)'s defaults
SWEEP: list[tuple[str, dict[str, object]]] = [
    ("heads_m_bf16_s3", {"rows_m": False, "dot_dtype": "bf16", "num_stages": 3}),
    ("rows_m_bf16_s1", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 1}),
    ("rows_m_bf16_s2", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 2}),
    ("rows_m_bf16_s4", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 4}),
    ("rows_m_fp16_s3", {"rows_m": True, "dot_dtype": "fp16", "num_stages": 3}),
    ("rows_m_fp8_s3", {"rows_m": True, "dot_dtype": "fp8", "num_stages": 3}),
    ("heads_m_fp8_s3", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3}),
    ("rows_m_bf16_s3_pps2", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3, "programs_per_sm": 2}),
    ("rows_m_bf16_s3_pps8", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3, "programs_per_sm": 8}),
    ("rows_m_bf16_s3_pps16", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3, "programs_per_sm": 16}),
    ("rows_m_bf16_s3_bn64", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3, "block_n": 64}),
    ("rows_m_bf16_s3_w8", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3, "num_warps": 8}),
    ("rows_m_bf16_s3_bn256_w8", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3, "block_n": 256, "num_warps": 8}),
    # second sweep: the fp8 dot with M = the 32 heads (mma.sync, as on SM 12.0) around its settings
    ("rows_m_bf16_s3", {"rows_m": True, "dot_dtype": "bf16", "num_stages": 3}),
    ("heads_m_fp16_s3", {"rows_m": False, "dot_dtype": "fp16", "num_stages": 3}),
    ("heads_m_fp8_s2", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 2}),
    ("heads_m_fp8_s4", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 4}),
    ("heads_m_fp8_s3_pps2", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "programs_per_sm": 2}),
    ("heads_m_fp8_s3_pps8", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "programs_per_sm": 8}),
    ("heads_m_fp8_s3_pps16", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "programs_per_sm": 16}),
    ("heads_m_fp8_s3_bn64", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "block_n": 64}),
    ("heads_m_fp8_s3_bn256", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "block_n": 256}),
    ("heads_m_fp8_s3_bn256_w8", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "block_n": 256, "num_warps": 8}),
    ("heads_m_fp8_s3_w8", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 3, "num_warps": 8}),
    ("heads_m_fp8_s4_pps8", {"rows_m": False, "dot_dtype": "fp8", "num_stages": 4, "programs_per_sm": 8}),
]


def a_defaults(new: types.ModuleType, dev: torch.device) -> dict[str, object]:
    """(a)'s default settings; if they fail here, the first of two fallbacks that runs."""
    d = build(2, 1000, dev)
    req = torch.arange(2, dtype=torch.int32, device=dev)
    ctxl = torch.full((2,), 1000, dtype=torch.int32, device=dev)
    ref = ref_scores(d["qq"], d["w"], d["idx"], d["bt"], 1000)
    names = ("INDEXER_ROWS_M", "INDEXER_NUM_STAGES", "INDEXER_DOT_DTYPE")
    out: dict[str, object] = {"as_shipped": {n: getattr(new, n) for n in names}}
    for fallback in (None, (False, 3, "bf16"), (False, 1, "bf16")):
        if fallback is not None:
            for n, v in zip(names, fallback, strict=True):
                setattr(new, n, v)
        try:
            lg = new.indexer_logits(d["qq"], d["w"], d["idx"], d["bt"], req, ctxl, 4096, tail=False)
            torch.cuda.synchronize()
            out["used"] = {n: getattr(new, n) for n in names}
            out["rel_err_vs_f32"] = rel_err(lg, ref)
            return out
        except Exception as e:
            out.setdefault("errors", []).append(repr(e)[:500])
    raise RuntimeError(f"no setting of the new score kernel ran: {out}")


def ref_scores(qq: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, bt: torch.Tensor, n: int) -> torch.Tensor:
    """float32 scores of the first n positions of each row (the dequantized cache)."""
    pages = math.ceil(n / PAGE)
    flat = idx.view(idx.shape[0], -1)[bt[:, :pages].long()]  # [B, pages, PAGE * 132]
    k = flat[..., : PAGE * IDX_DIM].contiguous().view(torch.float8_e4m3fn).float()
    k = k.view(bt.shape[0], pages * PAGE, IDX_DIM)[:, :n]
    sc = flat[..., PAGE * IDX_DIM :].contiguous().view(torch.float32).reshape(bt.shape[0], -1)[:, :n]
    s = torch.einsum("bhd,bnd->bhn", qq.float(), k) * sc[:, None, :]
    return (s.relu() * w[:, :, None]).sum(1)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    n = ref.shape[1]
    return float((x[:, :n] - ref).abs().max() / ref.abs().max())


def read_bandwidth(dev: torch.device) -> float:
    """GB/s this GPU reaches reading 4 GiB (a bf16 sum under graph replay)."""
    big = torch.empty(2 << 30, dtype=torch.bfloat16, device=dev).fill_(1)
    acc = torch.empty((), dtype=torch.float32, device=dev)
    t = graph_time(lambda: torch.sum(big, dim=(0,), dtype=torch.float32, out=acc))
    return big.numel() * 2 / t / 1e6


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# ---- the score kernel alone ----
INDEXER_SHAPES = [(65536, 64), (65536, 16), (131072, 64), (131072, 16), (4096, 1), (131072, 1), (4096, 64), (16384, 16)]


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
    # the second sweep's
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


def indexer(new_path: str, old_path: str, out_dir: Path) -> None:
    """The score kernel alone (module docstring): results.json in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    new, old = load(new_path, "su_new"), load(old_path, "su_old")
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
    for ctx, batch in INDEXER_SHAPES:
        run: dict = {"ctx": ctx, "batch": batch, "bytes": batch * ctx * (IDX_DIM + 4), "ms": {}, "rel": {}}
        res["runs"].append(run)
        triton_shape(new, old, dg, (ctx, batch), dev, run, save)
        print(json.dumps(run), flush=True)
        torch.cuda.empty_cache()


# ---- tables ----
def fmt(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def idx_tables(res: dict) -> None:
    """`indexer`'s results: the score kernel alone, old / new / DeepGEMM, then the variants."""
    bw = res["read_bandwidth_GBps_measured"]
    print(f"{res['device']} (SM {res['capability'][0]}.{res['capability'][1]}), read bandwidth measured {bw:.0f} GB/s")
    print()
    print("| ctx | batch | MB | old ms | new ms | DeepGEMM ms | old/new | new/DeepGEMM | new GB/s (% of measured) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        m = r["ms"]
        o, n, d = m.get("old"), m.get("new"), m.get("deepgemm")
        g = r["bytes"] / n / 1e6 if n else None
        print(
            f"| {r['ctx'] // 1024}k | {r['batch']} | {r['bytes'] / 1e6:.1f} | {fmt(o)} | **{fmt(n)}** | {fmt(d)} "
            f"| {fmt(o / n if o and n else None, 2)} | {fmt(n / d if n and d else None, 2)} "
            f"| {fmt(g, 0)} ({fmt(100 * g / bw if g else None, 0)} %) |"
        )
    names = list(dict.fromkeys(k for r in res["runs"] for k in r["ms"] if k not in ("old", "new", "deepgemm")))
    if names:
        print()
        print("| ctx | batch | new | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---|" * len(names))
        for r in res["runs"]:
            m = r["ms"]
            print(
                f"| {r['ctx'] // 1024}k | {r['batch']} | {fmt(m.get('new'))} | "
                + " | ".join(fmt(m.get(k)) for k in names)
                + " |"
            )
    errs = {f"{r['ctx'] // 1024}k/{r['batch']}": r["errors"] for r in res["runs"] if r.get("errors")}
    if errs:
        print()
        print("errors:", json.dumps(errs))


def summarize(path: Path) -> None:
    """Markdown tables of a results.json of `step` or `indexer` (medians in ms)."""
    res = json.loads(path.read_text())
    if res["runs"] and "old" in res["runs"][0]["ms"]:
        idx_tables(res)
        return
    bw = res["read_bandwidth_GBps_measured"]
    print(f"{res['device']} (SM {res['capability'][0]}.{res['capability'][1]}), read bandwidth measured {bw:.0f} GB/s")
    print()
    print(
        "| ctx | batch | heads | (a) new ms: idx / top-k / MLA = total | (b) before ms: idx / top-k / MLA = total "
        "| (c) dense ms | (d) FlashMLA sparse ms (MLA; sum) | b/a | c/a | a/d | (a) GB/s (% of measured) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        m = r["ms"]
        a, b, c, d = m["a_total"], m["b_total"], m.get("c_total"), m.get("d_total_parts_sum")
        print(
            f"| {r['ctx'] // 1024}k | {r['batch']} | {r['heads']} "
            f"| {fmt(m['a_indexer'])} / {fmt(m['a_topk'])} / {fmt(m['a_mla'])} = **{fmt(a)}** "
            f"| {fmt(m['b_indexer'])} / {fmt(m['b_topk'])} / {fmt(m['b_mla'])} = {fmt(b)} "
            f"| {fmt(c)} | {fmt(m.get('d_mla'))}; {fmt(d)} "
            f"| {b / a:.2f} | {fmt(c / a if c else None, 2)} | {fmt(a / d if d else None, 2)} "
            f"| {r['a_GBps']:.0f} ({100 * r['a_GBps'] / bw:.0f} %) |"
        )
    print()
    print(
        "| ctx | batch | indexer MB | (b) ms | (a) ms | (d) DeepGEMM ms | b/a | a/d "
        "| (a) GB/s (% of measured) | (d) GB/s (% of measured) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        if r["heads"] != 8:
            continue
        m = r["ms"]
        nbytes = r["batch"] * r["ctx"] * 132  # fp8 row + fp32 scale per position
        a, b, d = m["a_indexer"], m["b_indexer"], m.get("d_indexer")
        ga, gd = nbytes / a / 1e6, (nbytes / d / 1e6 if d else None)
        print(
            f"| {r['ctx'] // 1024}k | {r['batch']} | {nbytes / 1e6:.1f} | {fmt(b)} | **{fmt(a)}** | {fmt(d)} "
            f"| {b / a:.2f} | {fmt(a / d if d else None, 2)} | {ga:.0f} ({100 * ga / bw:.0f} %) "
            f"| {fmt(gd, 0)} ({fmt(100 * gd / bw if gd else None, 0)} %) |"
        )
    sweep = sorted(
        {k for r in res["runs"] for k in r["ms"] if k.startswith("a_indexer_")},
        key=list(dict.fromkeys(k for r in res["runs"] for k in r["ms"])).index,
    )
    if sweep:
        print()
        print("Score kernel variants, ms (8 heads; the indexer does not depend on them):")
        print()
        print("| ctx | batch | (a) as run | " + " | ".join(k.removeprefix("a_indexer_") for k in sweep) + " |")
        print("|---|---|---|" + "---|" * len(sweep))
        for r in res["runs"]:
            m = r["ms"]
            if not any(k in m for k in sweep):
                continue
            cells = " | ".join(fmt(m.get(k)) for k in sweep)
            print(f"| {r['ctx'] // 1024}k | {r['batch']} | {fmt(m['a_indexer'])} | {cells} |")


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/gpu/sparse_bench.py", description=__doc__.split("\n\n", 1)[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("step", "indexer"):
        q = sub.add_parser(name)
        q.add_argument("--new", required=True, help="NEW sparse_utils.py")
        q.add_argument("--old", required=True, help="OLD sparse_utils.py (NEW again: one version)")
        q.add_argument("--out", required=True, type=Path, help="folder for results.json")
        if name == "step":
            q.add_argument("--mode", choices=("full", "quick", "goals"), default="full")
    q = sub.add_parser("summarize")
    q.add_argument("results", type=Path)
    args = p.parse_args(argv)
    if args.command == "summarize":
        summarize(args.results)
    elif args.command == "step":
        step(args.new, args.old, args.out, args.mode)
    else:
        indexer(args.new, args.old, args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(cli())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
