"""Patch 0008 and config fidelity: what vLLM builds from GLM-5's config.json as shipped.

GLM-5's config.json is in transformers 5's form (docs/patches.md, 0008, says where that
form is documented): the RoPE base only inside ``rope_parameters`` (1,000,000), no
top-level ``rope_theta``, no ``rope_scaling``, ``dtype``, ``qk_head_dim`` and
``indexer_rope_interleave``. Patch 0001 reads it as transformers 4.57.6's
DeepseekV3Config, whose ``rope_theta`` defaults to 10000, and vLLM's
patch_rope_parameters then writes that default into ``rope_parameters``.

Failing test first: test_shipped_rope_base_reaches_the_rotary_embeddings failed on
patches 0001-0007 (every rotary embedding vLLM built, MLA and indexer, had base 10000.0)
and passes with 0008; test_without_0008_the_rope_base_is_10000 keeps that proof.

The fidelity tests list every config key that vLLM 0.20.2's GlmMoeDsaForCausalLM path
reads (deepseek_v2.py, with the patch set) and check that the value the built model uses
equals the file's, and that no read key silently falls back to a default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import overlay
import pytest

from glm5_tools.fixtures import tiny_config

PROBE = Path(__file__).resolve().parent / "model_probe.py"
GLM5_EOS = [154820, 154827, 154829]  # GLM-5's eos_token_id list
SHIPPED_THETA = 1000000

# Every key vLLM 0.20.2's GlmMoeDsaForCausalLM path reads, with where it is read
# (vllm/model_executor/models/deepseek_v2.py unless named otherwise).
READ_KEYS: dict[str, str] = {
    "architectures": "ModelRegistry: picks GlmMoeDsaForCausalLM",
    "model_type": "patch 0004 _glm_dsa_dense; DeepseekV2DecoderLayer use_mha test",
    "vocab_size": "DeepseekV2Model: VocabParallelEmbedding; DeepseekV2ForCausalLM: lm_head",
    "hidden_size": "DeepseekV2Model, DeepseekV2DecoderLayer, DeepseekV2MoE: GateLinear/FusedMoE",
    "num_hidden_layers": "DeepseekV2Model: make_layers",
    "intermediate_size": "DeepseekV2DecoderLayer: the dense DeepseekV2MLP",
    "hidden_act": "DeepseekV2MLP (dense and shared experts): SiluAndMul",
    "first_k_dense_replace": "DeepseekV2DecoderLayer: dense below it, MoE from it",
    "moe_layer_freq": "DeepseekV2DecoderLayer: getattr(config, 'moe_layer_freq', 1)",
    "num_attention_heads": "DeepseekV2DecoderLayer -> DeepseekV2MLAAttention num_heads",
    "q_lora_rank": "DeepseekV2DecoderLayer -> MLA attention (fused q_a/kv_a, q_b)",
    "kv_lora_rank": "DeepseekV2DecoderLayer: getattr(..., 0) -> MLA attention",
    "qk_nope_head_dim": "DeepseekV2DecoderLayer: getattr(..., 0) -> MLA attention",
    "qk_rope_head_dim": "DeepseekV2DecoderLayer: getattr(..., 0) -> MLA get_rope; Indexer rope_dim",
    "v_head_dim": "DeepseekV2DecoderLayer: getattr(..., 0) -> MLA attention",
    "max_position_embeddings": "DeepseekV2DecoderLayer: getattr(..., 8192) -> get_rope max_position",
    "rope_parameters": "DeepseekV2MLAAttention: get_rope (MLA and indexer rope), yarn mscale",
    "rms_norm_eps": "every RMSNorm (layers, q_a/kv_a layernorms, final norm)",
    "n_routed_experts": "DeepseekV2MoE: GateLinear, FusedMoE num_experts",
    "n_shared_experts": "DeepseekV2MoE: shared experts size",
    "moe_intermediate_size": "DeepseekV2MoE: FusedMoE intermediate_size, shared experts",
    "num_experts_per_tok": "DeepseekV2MoE: FusedMoE top_k",
    "norm_topk_prob": "DeepseekV2MoE: FusedMoE renormalize",
    "n_group": "DeepseekV2MoE: getattr(config, 'n_group', 1) -> num_expert_group",
    "topk_group": "DeepseekV2MoE: getattr(config, 'topk_group', 1)",
    "scoring_func": "DeepseekV2MoE: getattr(config, 'scoring_func', 'softmax')",
    "topk_method": "DeepseekV2MoE: noaux_tc -> e_score_correction_bias",
    "routed_scaling_factor": "DeepseekV2MoE/DecoderLayer: getattr(..., 1.0) -> FusedMoE",
    "index_topk": "DeepseekV2Model: is_v32 = hasattr(index_topk); Indexer topk_tokens",
    "index_n_heads": "Indexer: n_head",
    "index_head_dim": "Indexer: head_dim",
    "indexer_rope_interleave": "DeepseekV2MLAAttention: indexer rope is_neox_style = not getattr(..., False)",
    "num_nextn_predict_layers": "DeepseekV2ForCausalLM: get_spec_layer_idx_from_weight_name; deepseek_mtp.py",
    "dtype": "ModelConfig: dtype auto -> the config's dtype",
    "eos_token_id": "vLLM's generation config (stop tokens)",
    "pad_token_id": "config only (vLLM does not pad with it)",
}

# Keys of the shipped file that this path does not read, and why.
NOT_READ_KEYS: dict[str, str] = {
    "attention_bias": "DeepSeek-V2 MLA linears are built bias=False",
    "attention_dropout": "inference has no dropout",
    "ep_size": "vLLM's expert parallelism comes from its parallel config",
    "head_dim": "MLA uses qk_nope_head_dim/qk_rope_head_dim (DeepseekV3Config sets head_dim = qk_rope_head_dim)",
    "qk_head_dim": "derived: vLLM computes qk_nope_head_dim + qk_rope_head_dim",
    "initializer_range": "training only",
    "pretraining_tp": "training only",
    "rope_interleave": "vLLM's MLA rope is built is_neox_style=False (interleaved) unconditionally; "
                       "test_model_uses_the_files_values checks the file agrees",
    "tie_word_embeddings": "DeepseekV2ForCausalLM always has its own lm_head (file: false)",
    "transformers_version": "metadata",
    "use_cache": "Hugging Face generate only",
    "bos_token_id": "tokenizer side",
    "num_key_value_heads": "read only by DeepseekV2Attention (the non-MLA path); MLA has one latent KV",
}


def shipped_config(real: bool) -> dict[str, Any]:
    """A config.json in GLM-5's shipped form: the fixture's (tiny) or GLM-5's own sizes."""
    cfg = tiny_config.tiny_config(bos_token_id=None, eos_token_ids=GLM5_EOS, pad_token_id=GLM5_EOS[0])
    if real:
        for key in (*tiny_config.TINY_SIZES, "num_attention_heads", "num_key_value_heads"):
            cfg[key] = tiny_config.REAL_GLM5[key]
    return cfg


def write(tmp: Path, cfg: dict[str, Any]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    return tmp


def patched_site() -> Path:
    import vllm  # the patched overlay (conftest.py)

    return Path(vllm.__file__).parents[1]  # not resolve(): the overlay links to the installed files


def probe(site: Path, config_dir: Path, mode: str) -> dict[str, Any]:
    proc = overlay.run_in(site, PROBE.read_text(), str(config_dir), mode)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE-JSON ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("PROBE-JSON "):])
    return result


@pytest.fixture(scope="module")
def shipped_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("shipped-tiny"), shipped_config(real=False))


@pytest.fixture(scope="module")
def shipped_real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("shipped-real"), shipped_config(real=True))


@pytest.fixture(scope="module")
def built(shipped_real: Path) -> dict[str, dict[str, Any]]:
    site = patched_site()
    return {mode: probe(site, shipped_real, mode) for mode in ("dense", "sparse")}


def test_shipped_form_has_no_top_level_rope_theta() -> None:
    cfg = shipped_config(real=True)
    assert "rope_theta" not in cfg and "rope_scaling" not in cfg
    assert cfg["rope_parameters"] == {"rope_theta": SHIPPED_THETA, "rope_type": "default"}


def test_shipped_rope_base_reaches_the_rotary_embeddings(shipped_tiny: Path) -> None:
    """Failed before 0008: every base was 10000.0. Sparse mode builds both the MLA
    attention's and the DSA indexer's rotary embedding in every layer."""
    got = probe(patched_site(), shipped_tiny, "sparse")
    assert got["hf"]["rope_parameters"]["rope_theta"] == SHIPPED_THETA
    assert len(got["ropes"]) == 2 * got["num_layers"]
    bases = {r["built_base"] for r in got["ropes"]}
    assert bases == {float(SHIPPED_THETA)}, bases


def test_without_0008_the_rope_base_is_10000(tmp_path: Path, shipped_tiny: Path) -> None:
    without = [p for p in overlay.patches() if not p.name.startswith("0008-")]
    assert len(without) == len(overlay.patches()) - 1
    site = overlay.make_overlay(tmp_path / "site", without)
    got = probe(site, shipped_tiny, "dense")
    assert {r["built_base"] for r in got["ropes"]} == {10000.0}


CONFIG_ONLY = (
    "import json, sys\n"
    "from vllm.transformers_utils.config import get_config\n"
    "out = {}\n"
    "for d in sys.argv[1:]:\n"
    "    try:\n"
    "        c = get_config(d, trust_remote_code=False)\n"
    "        out[d] = {'rope_parameters': c.rope_parameters,\n"
    "                  'attrs': {k: v for k, v in vars(c).items()\n"
    "                            if isinstance(v, (int, float, str, bool, list, dict, type(None)))}}\n"
    "        out[d]['attrs']['dtype'] = str(c.torch_dtype).removeprefix('torch.')\n"
    "    except Exception as exc:\n"
    "        out[d] = {'error': f'{type(exc).__name__}: {exc}'}\n"
    "print('CONFIG-JSON ' + json.dumps(out, default=str))\n"
)


def configs_through_vllm(dirs: list[Path]) -> dict[str, Any]:
    proc = overlay.run_in(patched_site(), CONFIG_ONLY, *map(str, dirs))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CONFIG-JSON ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("CONFIG-JSON "):])
    return result


def test_top_level_rope_theta_forms_still_read(tmp_path: Path) -> None:
    base = shipped_config(real=False)
    legacy = {k: v for k, v in base.items() if k != "rope_parameters"} | {"rope_theta": 500000}
    both = base | {"rope_theta": SHIPPED_THETA}
    conflict = base | {"rope_theta": 10000}
    dirs = {name: write(tmp_path / name, cfg)
            for name, cfg in (("legacy", legacy), ("both", both), ("conflict", conflict))}
    got = configs_through_vllm(list(dirs.values()))
    assert got[str(dirs["legacy"])]["rope_parameters"]["rope_theta"] == 500000
    assert got[str(dirs["both"])]["rope_parameters"]["rope_theta"] == SHIPPED_THETA
    error = got[str(dirs["conflict"])].get("error", "")
    assert "rope_theta" in error and "rope_parameters" in error, got[str(dirs["conflict"])]


def test_every_key_of_the_shipped_file_is_classified() -> None:
    keys = set(shipped_config(real=True))
    unclassified = keys - set(READ_KEYS) - set(NOT_READ_KEYS)
    assert not unclassified, f"config keys nobody checked where vLLM reads them: {sorted(unclassified)}"
    assert not set(READ_KEYS) & set(NOT_READ_KEYS)
    assert set(READ_KEYS) <= keys, sorted(set(READ_KEYS) - keys)


def _changed(key: str, value: Any) -> Any:
    """A different value of the same kind, for the mutation check."""
    if key == "rope_parameters":
        return {**value, "rope_theta": 1234567}
    if key == "architectures":
        return value
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if key != "first_k_dense_replace" else value + 1
    if isinstance(value, float):
        return value * 3
    if isinstance(value, list):
        return [v + 1 for v in value]
    return {"scoring_func": "softmax", "topk_method": "greedy", "hidden_act": "gelu",
            "model_type": "glm_moe_dsa", "dtype": "float16"}[key]


def _seen(attrs: dict[str, Any], key: str) -> Any:
    return attrs.get(key)


def test_no_read_key_falls_back_to_a_default(tmp_path: Path) -> None:
    """Each read key, changed in the file, arrives changed in the config vLLM builds from."""
    base = shipped_config(real=True)
    dirs: dict[str, Path] = {"base": write(tmp_path / "base", base)}
    for key in READ_KEYS:
        if key in ("architectures", "model_type"):
            continue
        dirs[key] = write(tmp_path / key, base | {key: _changed(key, base[key])})
    got = configs_through_vllm(list(dirs.values()))
    unchanged = got[str(dirs["base"])]
    assert "error" not in unchanged, unchanged
    for key in READ_KEYS:
        want = base[key]
        assert _seen(unchanged["attrs"], key) == want, (key, _seen(unchanged["attrs"], key), want)
    for key, d in dirs.items():
        if key == "base":
            continue
        entry = got[str(d)]
        assert "error" not in entry, (key, entry)
        mutated = _changed(key, base[key])
        assert _seen(entry["attrs"], key) == mutated, (key, _seen(entry["attrs"], key), mutated)


def test_model_uses_the_files_values(built: dict[str, dict[str, Any]]) -> None:
    """GLM-5's real sizes, shipped form: what the built model's modules were given."""
    cfg = shipped_config(real=True)
    for mode, got in built.items():
        n = cfg["num_hidden_layers"]
        assert got["hf_class"] == "DeepseekV3Config"
        assert got["num_layers"] == n
        k = cfg["first_k_dense_replace"]
        assert got["layer_kinds"] == ["dense"] * k + ["moe"] * (n - k), mode
        assert got["vocab"] == cfg["vocab_size"] and got["hidden"] == cfg["hidden_size"]
        assert got["lm_head_tied"] is cfg["tie_word_embeddings"]
        assert got["rms_norm_eps"] == [cfg["rms_norm_eps"]], mode
        att = got["attention"]
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                    "max_position_embeddings"):
            assert att[key] == cfg[key], (mode, key, att[key])
        assert att["num_heads"] == cfg["num_attention_heads"]
        # default rope: no yarn mscale on the softmax scale
        assert att["scaling"] == pytest.approx((cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5)
        for r in got["ropes"]:
            assert r["built_class"] == "RotaryEmbedding", r  # rope_type default
            assert r["built_base"] == cfg["rope_parameters"]["rope_theta"], r
            assert r["built_rotary_dim"] == r["head_size"] == cfg["qk_rope_head_dim"], r
            assert r["built_max_position"] == cfg["max_position_embeddings"], r
        # each layer: the MLA rope (vLLM: always interleaved; the file's rope_interleave
        # agrees), then in sparse mode the indexer's (indexer_rope_interleave)
        per_layer = 1 if mode == "dense" else 2
        for i, r in enumerate(got["ropes"]):
            interleave = cfg["rope_interleave"] if i % per_layer == 0 else cfg["indexer_rope_interleave"]
            assert r["built_is_neox_style"] is (not interleave), (mode, i, r)
        assert len(got["mlas"]) == n
        moe = got["moe"]
        assert moe["routed_scaling_factor"] == cfg["routed_scaling_factor"]
        assert moe["n_shared_experts"] == cfg["n_shared_experts"]
        assert moe["has_e_score_correction_bias"] is (cfg["topk_method"] == "noaux_tc")
        assert moe["gate_out"] == cfg["n_routed_experts"]
        assert moe["shared_intermediate"] == cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
        assert got["dense_intermediate"] == cfg["intermediate_size"]
        assert got["dense_act"] == "SiluAndMul" and cfg["hidden_act"] == "silu"
        assert len(got["moes"]) == n - k
        for fm in got["moes"]:
            assert fm["num_experts"] == cfg["n_routed_experts"]
            assert fm["top_k"] == cfg["num_experts_per_tok"]
            assert fm["hidden_size"] == cfg["hidden_size"]
            assert fm["intermediate_size"] == cfg["moe_intermediate_size"]
            assert fm["renormalize"] is cfg["norm_topk_prob"]
            assert fm["num_expert_group"] == cfg["n_group"] and fm["topk_group"] == cfg["topk_group"]
            assert fm["scoring_func"] == cfg["scoring_func"]
            assert fm["routed_scaling_factor"] == cfg["routed_scaling_factor"]
    dense, sparse = built["dense"], built["sparse"]
    assert dense["indexer"] is None and len(dense["ropes"]) == cfg["num_hidden_layers"]
    assert sparse["indexer"] == {"topk_tokens": cfg["index_topk"], "n_head": cfg["index_n_heads"],
                                 "head_dim": cfg["index_head_dim"]}
    assert len(sparse["ropes"]) == 2 * cfg["num_hidden_layers"]
