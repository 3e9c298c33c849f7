"""Hugging Face import: published totals, each family's special rows, errors, shipped profiles.

Published totals come from ``reference/hf-configs/INDEX.md`` and ``reference/paper-figures.md``;
the known differences (MTP layer, vision tower) are tabulated in ``docs/models.md``.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from planner.errors import InvalidPlan
from planner.schema.hf_import import import_hf, import_hf_file, profile_yaml
from planner.schema.shipped_models import (HF_PROFILES, PAPER_MODELS, PROFILE_DIR, REFERENCE_DIR, paper_model,
                                           shipped_profiles)
from planner.schema.io import load_model
from planner.schema.model import ModelSpec

PARAM_TOL = 0.02
"""Imported total parameters vs a published total (within 2%)."""
PUBLISHED_EXCLUDES_MTP = {"deepseek-v3.json"}
"""Files whose published total counts the main model only (DeepSeek-V3: 671B main + 14B MTP module)."""
DBRX_PUBLISHED_TOTAL, DBRX_PUBLISHED_ACTIVE = 132e9, 36e9
"""databricks/dbrx-base model card."""


def _index() -> dict[str, float]:
    text = (REFERENCE_DIR / "INDEX.md").read_text()
    rows = re.findall(r"^\| (\S+\.json) \| \S+ \| ([\d,]+) \|", text, flags=re.M)
    return {f: float(n.replace(",", "")) for f, n in rows}


def _cfg(file: str) -> dict:
    return json.loads((REFERENCE_DIR / file).read_text())


def _spec(file: str, **edits) -> tuple[ModelSpec, list[str]]:
    cfg = _cfg(file)
    cfg.update(edits)
    return import_hf(cfg, "t")


def _main_params(spec: ModelSpec) -> int:
    """Total without the MTP modules (their dense part and their routed experts)."""
    c = spec.param_counts()
    return c["total"] - c["mtp"] - spec.mtp_layers * spec.num_experts * spec.expert_params()


def test_reference_folder_is_present_and_fully_shipped():
    assert REFERENCE_DIR.is_dir(), f"no reference configs at {REFERENCE_DIR} (set MOE_PLANNER_REFERENCE)"
    files = {p.name for p in REFERENCE_DIR.glob("*.json")}
    assert files == set(_index()) == {f for f, _ in HF_PROFILES.values()}


@pytest.mark.parametrize("file", sorted(f for f, _ in HF_PROFILES.values()))
def test_total_params_within_tolerance_of_published(file):
    spec, _ = import_hf_file(REFERENCE_DIR / file)
    published = _index()[file]
    computed = _main_params(spec) if file in PUBLISHED_EXCLUDES_MTP else spec.param_counts()["total"]
    assert abs(computed - published) <= PARAM_TOL * published, (file, computed, published)


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_paper_models_within_tolerance(name):
    spec, (layers, published) = paper_model(name), PAPER_MODELS[name]
    assert spec.num_layers == layers and spec.num_moe_layers == layers and spec.num_shared_experts == 0
    assert abs(spec.param_counts()["total"] - published) <= PARAM_TOL * published
    assert "every layer MoE" in spec.source and f"{published / 1e9:.0f}B" in spec.source


# ---- each family's special rows ------------------------------------------------------------------
def test_deepseek_shared_width_is_count_times_moe_width_and_mla():
    s, _ = _spec("deepseek-v2-lite.json")
    assert (s.num_shared_experts, s.shared_expert_ffn) == (2, 2 * 1408)  # not 2 x intermediate_size
    assert s.dense_layers == (0,) and s.dense_ffn == 10944 and s.attention == "mla"
    assert s.mla.q_lora_rank is None and s.num_kv_heads == s.num_heads == 16
    assert (s.head_dim, s.v_dim) == (128 + 64, 128) and not s.router_bias
    v3, _ = _spec("deepseek-v3.json")
    assert v3.dense_layers == (0, 1, 2) and v3.mtp_layers == 1 and v3.mla.q_lora_rank == 1536
    assert v3.router_bias  # aux-loss-free e_score_correction_bias of noaux_tc routing
    freq, _ = _spec("deepseek-v2-lite.json", moe_layer_freq=2)
    assert freq.moe_layer_indices == tuple(range(2, 27, 2))


def test_llama4_implicit_shared_expert_and_chunked_layers():
    s, warnings = _spec("llama-4-scout-17b-16e.json")
    assert (s.num_shared_experts, s.shared_expert_ffn, s.expert_ffn) == (1, 8192, 8192)
    assert s.dense_layers == () and s.dense_ffn == 16384 and s.head_dim == 128
    assert s.sliding_window == 8192 and s.local_layers == tuple(i for i in range(48) if (i + 1) % 4)
    assert any("vision" in w for w in warnings)
    cfg = _cfg("llama-4-scout-17b-16e.json")
    del cfg["text_config"]["moe_layers"]
    cfg["text_config"]["interleave_moe_layer_step"] = 2  # Maverick's interleaving
    mav, _ = import_hf(cfg, "t")
    assert mav.moe_layer_indices == tuple(range(1, 48, 2)) and mav.dense_layers == tuple(range(0, 48, 2))


def test_gpt_oss_head_dim_sinks_biases_and_sliding_layers():
    s, warnings = _spec("gpt-oss-20b.json")
    assert s.head_dim == 64 and 2880 // 64 != 64 and s.top_k == 4 and warnings == []
    assert s.attention_sinks and s.expert_bias and s.router_bias and s.attention_bias
    assert s.sliding_window == 128 and s.local_layers == tuple(range(0, 24, 2))
    cfg = _cfg("gpt-oss-20b.json")
    del cfg["layer_types"]  # older config: the family's default alternation
    assert import_hf(cfg, "t")[0].local_layers == s.local_layers
    _, w = _spec("gpt-oss-20b.json", experts_per_token=2)
    assert any("experts_per_token" in x for x in w)


def test_qwen3_head_dim_qk_norm_and_sparse_step():
    s, _ = _spec("qwen3-30b-a3b.json")
    assert s.head_dim == 128 and 2048 // 32 == 64 and s.qk_norm and s.local_layers == ()
    assert not s.attention_bias and s.num_shared_experts == 0
    sparse, _ = _spec("qwen3-30b-a3b.json", mlp_only_layers=[0, 5], decoder_sparse_step=2)
    assert sparse.dense_layers == tuple(i for i in range(48) if i in (0, 5) or (i + 1) % 2)
    win, _ = _spec("qwen3-30b-a3b.json", use_sliding_window=True, sliding_window=4096, max_window_layers=40)
    assert win.local_layers == tuple(range(40, 48)) and win.sliding_window == 4096


def test_qwen2_moe_shared_gate_and_qkv_bias_by_architecture():
    s, _ = _spec("qwen1.5-moe-a2.7b-chat.json")
    assert (s.num_shared_experts, s.shared_expert_ffn, s.shared_expert_gate) == (1, 5632, True)
    assert s.attention_bias and "attention_bias" not in _cfg("qwen1.5-moe-a2.7b-chat.json")
    assert s.local_layers == () and s.head_dim == 2048 // 16


def test_mixtral_olmoe_phimoe_rows():
    m, _ = _spec("mixtral-8x7b-v0.1.json")
    assert m.head_dim == 128 and m.expert_ffn == 14336 and m.dense_ffn == 0 and m.local_layers == ()
    mw, _ = _spec("mixtral-8x7b-v0.1.json", sliding_window=4096)
    assert mw.local_layers == tuple(range(32)) and mw.sliding_window == 4096
    o, _ = _spec("olmoe-1b-7b-0924.json")
    assert o.qk_norm and o.expert_ffn == 1024 and o.attention == "mha"
    phi, _ = _spec("mixtral-8x7b-v0.1.json", model_type="phimoe", sliding_window=131072,
                   max_position_embeddings=131072, attention_bias=True)
    assert phi.local_layers == () and phi.sliding_window is None and phi.attention_bias


def test_dbrx_nested_sections():
    cfg = {  # databricks/dbrx-base config.json, transcribed
        "model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40, "max_seq_len": 32768,
        "vocab_size": 100352, "tie_word_embeddings": False,
        "attn_config": {"kv_n_heads": 8, "rope_theta": 500000, "clip_qkv": 8},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4,
                       "moe_loss_weight": 0.05}}
    s, warnings = import_hf(cfg, "dbrx")
    assert warnings == [] and s.model_type == "dbrx"
    assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim) == (6144, 40, 48, 8, 128)
    assert (s.num_experts, s.top_k, s.expert_ffn, s.max_position_embeddings) == (16, 4, 10752, 32768)
    assert abs(s.param_counts()["total"] - DBRX_PUBLISHED_TOTAL) <= PARAM_TOL * DBRX_PUBLISHED_TOTAL
    assert abs(s.active_params() - DBRX_PUBLISHED_ACTIVE) <= 2 * PARAM_TOL * DBRX_PUBLISHED_ACTIVE
    bad = copy.deepcopy(cfg)
    bad["ffn_config"]["moe_top_k"] = 17
    with pytest.raises(InvalidPlan, match=r"config\.ffn_config\.moe_top_k \(17\) must be <= "):
        import_hf(bad, "dbrx")


def test_kimi_glm_qwen3_next_and_wrappers():
    kimi, w = _spec("deepseek-v3.json", model_type="kimi_k2", n_routed_experts=384,
                    num_nextn_predict_layers=0, first_k_dense_replace=1, n_group=1, topk_group=1)
    assert w == [] and kimi.mtp_layers == 0 and kimi.num_experts == 384 and kimi.router_bias
    glm, w = _spec("deepseek-v3.json", model_type="glm4_moe", kv_lora_rank=None, hidden_size=5120,
                   num_attention_heads=96, num_key_value_heads=8, head_dim=128, attention_bias=True,
                   use_qk_norm=True, partial_rotary_factor=0.5)
    assert (glm.attention, glm.head_dim, glm.qk_norm, glm.attention_bias) == ("gqa", 128, True, True)
    assert glm.mtp_layers == 1 and glm.shared_expert_ffn == 2048 and glm.dense_layers == (0, 1, 2)
    nxt, w = _spec("qwen1.5-moe-a2.7b-chat.json", model_type="qwen3_next", head_dim=256,
                   full_attention_interval=4)
    assert nxt.shared_expert_gate and nxt.qk_norm and any("linear-attention" in x for x in w)
    inner = _cfg("qwen3-30b-a3b.json") | {"model_type": "qwen3_vl_moe_text"}
    wrapped, w = import_hf({"model_type": "qwen3_vl_moe", "text_config": inner,
                            "vision_config": {"depth": 27}, "tie_word_embeddings": False}, "t")
    assert wrapped.param_counts() == _spec("qwen3-30b-a3b.json")[0].param_counts()
    assert any("vision" in x for x in w)


def test_transformers_v5_rope_parameters():
    cfg = _cfg("gpt-oss-20b.json")
    old, _ = import_hf(cfg, "t")
    cfg["rope_parameters"] = {**cfg.pop("rope_scaling"), "rope_theta": cfg.pop("rope_theta")}
    new, warnings = import_hf(cfg, "t")
    assert new == old and warnings == [] and "yarn x32 from 4096" in new.source
    cfg["rope_parameters"] = {"full_attention": cfg["rope_parameters"],
                              "sliding_attention": {"rope_theta": 1}}
    del cfg["max_position_embeddings"]
    per_type, _ = import_hf(cfg, "t")
    assert per_type == old  # context from the full-attention rope: 4096 x 32


def test_unknown_model_type_with_recognisable_fields_imports_with_warning():
    s, warnings = _spec("mixtral-8x7b-v0.1.json", model_type="my_new_moe")
    assert any("my_new_moe" in w and "not a known family" in w for w in warnings)
    assert s.param_counts() == _spec("mixtral-8x7b-v0.1.json")[0].param_counts()
    official = {  # deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json spellings, no model_type
        "vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048, "n_layers": 61,
        "n_dense_layers": 3, "n_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
        "n_activated_experts": 8, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128}
    o, warnings = import_hf(official, "t")
    v3, _ = _spec("deepseek-v3.json")
    assert warnings and (o.dense_layers, o.expert_ffn, o.dense_ffn, o.top_k, o.mla) == (
        v3.dense_layers, v3.expert_ffn, v3.dense_ffn, v3.top_k, v3.mla)


# ---- errors --------------------------------------------------------------------------------------
def test_missing_field_names_it():
    cfg = _cfg("mixtral-8x7b-v0.1.json")
    del cfg["hidden_size"]
    with pytest.raises(InvalidPlan, match=r"^config\.hidden_size \(none given\) is missing"):
        import_hf(cfg, "t")
    with pytest.raises(InvalidPlan, match=r"^config\.hidden_size \(none given\) is missing"):
        import_hf({"model_type": "foo"}, "t")
    cfg = _cfg("deepseek-v3.json")
    del cfg["moe_intermediate_size"], cfg["intermediate_size"]
    with pytest.raises(InvalidPlan, match=r"config\.intermediate_size .* is missing"):
        import_hf(cfg, "t")


@pytest.mark.parametrize("edit, match", [
    ({"hidden_size": -4096}, r"^config\.hidden_size \(-4096\) must be >= 1"),
    ({"num_hidden_layers": 0}, r"^config\.num_hidden_layers \(0\) must be >= 1"),
    ({"num_experts_per_tok": 9}, r"^config\.num_experts_per_tok \(9\) must be <= num_local_experts \(8\)"),
    ({"vocab_size": "32k"}, r"^config\.vocab_size \('32k'\) must be an integer"),
    ({"num_key_value_heads": 7}, r"^config\.num_key_value_heads \(7\) must divide"),
    ({"tie_word_embeddings": "no"}, r"^config\.tie_word_embeddings \('no'\) must be true or false"),
    ({"layer_types": ["full_attention"] * 3}, r"^config\.layer_types .* must list num_hidden_layers \(32\)"),
])
def test_malformed_values_are_one_line_invalid_plan(edit, match):
    with pytest.raises(InvalidPlan, match=match) as exc:
        _spec("mixtral-8x7b-v0.1.json", **edit)
    assert "\n" not in str(exc.value)


def test_bad_files(tmp_path):
    with pytest.raises(InvalidPlan, match="does not exist"):
        import_hf_file(tmp_path / "nope.json")
    (bad := tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidPlan, match="is not valid JSON"):
        import_hf_file(bad)
    with pytest.raises(InvalidPlan, match="must be a JSON object"):
        import_hf([1, 2], "t")


# ---- shipped profiles ----------------------------------------------------------------------------
def test_shipped_profiles_round_trip_and_equal_a_fresh_import():
    fresh = shipped_profiles()
    files = {p.stem: p for p in PROFILE_DIR.glob("*.yaml")}
    assert set(files) == set(fresh) and len(files) == 14
    for name, path in files.items():
        text = path.read_text()
        assert ModelSpec.model_validate(yaml.safe_load(text)) == load_model(name) == fresh[name], name
        assert text == profile_yaml(fresh[name]), f"{path} is stale: run python -m planner.schema.hf_import"
