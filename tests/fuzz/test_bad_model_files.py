"""Fuzz: bad Hugging Face configs and bad model files give ``InvalidPlan``, never another crash.

Mutations start from the real reference configs and the shipped profiles: a required key removed,
a size made zero or negative, any key set to a value of the wrong type, top-k above the expert
count, unknown profile keys, garbled YAML/JSON text. Profiles go through ``planner.schema.io`` (what
the CLI uses); bare ``ModelSpec.model_validate`` raises pydantic's ``ValidationError`` instead.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner.errors import InvalidPlan
from planner.schema.hf_import import import_hf
from planner.schema.shipped_models import HF_PROFILES, PROFILE_DIR, REFERENCE_DIR
from planner.schema.io import load_model, validate
from planner.schema.model import ModelSpec

EXAMPLES = 150
"""Hypothesis examples per property (the whole module runs in a few seconds)."""
CONFIGS = {f: json.loads((REFERENCE_DIR / f).read_text()) for f, _ in HF_PROFILES.values()}
PROFILES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(PROFILE_DIR.glob("*.yaml"))}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
SIZE_FIELDS = ("num_layers", "hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim")
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

junk = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
                 st.text(max_size=8), st.lists(st.integers(-3, 100), max_size=4),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6))
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12)


def _section(cfg: dict) -> dict:
    """The dict holding the decoder's fields (``text_config`` for wrappers)."""
    return cfg.get("text_config", cfg)


def load_model_profile(data) -> ModelSpec:
    return validate(ModelSpec, data, "model")


def _import_or_invalid(cfg) -> None:
    try:
        spec, warnings = import_hf(cfg, "fuzz")
    except InvalidPlan as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(spec, ModelSpec) and all(isinstance(w, str) for w in warnings)
    spec.param_counts()


@SETTINGS
@given(file=st.sampled_from(sorted(CONFIGS)), key=st.sampled_from(REQUIRED))
def test_missing_required_key(file, key):
    cfg = copy.deepcopy(CONFIGS[file])
    del _section(cfg)[key]
    with pytest.raises(InvalidPlan, match=rf"config\.{key} \(none given\) is missing"):
        import_hf(cfg, "fuzz")


@SETTINGS
@given(file=st.sampled_from(sorted(CONFIGS)), key=st.sampled_from(REQUIRED), value=st.integers(-(2**31), 0))
def test_non_positive_size(file, key, value):
    cfg = copy.deepcopy(CONFIGS[file])
    _section(cfg)[key] = value
    with pytest.raises(InvalidPlan, match=rf"{key} \({value}\) must be >= 1"):
        import_hf(cfg, "fuzz")


@SETTINGS
@given(file=st.sampled_from(sorted(CONFIGS)), extra=st.integers(1, 10**6))
def test_top_k_above_expert_count(file, extra):
    cfg = copy.deepcopy(CONFIGS[file])
    sec = _section(cfg)
    n = next(sec[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in sec)
    sec["num_experts_per_tok"] = n + extra
    sec.pop("experts_per_token", None)
    with pytest.raises(InvalidPlan, match=r"num_experts_per_tok .* must be <= "):
        import_hf(cfg, "fuzz")


@SETTINGS
@given(file=st.sampled_from(sorted(CONFIGS)), data=st.data(), value=junk)
def test_any_key_set_to_junk(file, data, value):
    cfg = copy.deepcopy(CONFIGS[file])
    sec = _section(cfg)
    sec[data.draw(st.sampled_from(sorted(sec)))] = value
    _import_or_invalid(cfg)


@SETTINGS
@given(cfg=st.dictionaries(st.sampled_from(sorted({k for c in CONFIGS.values() for k in _section(c)}
                                                  | {"text_config", "attn_config", "ffn_config", "d_model"})),
                           json_values, max_size=12))
def test_random_configs(cfg):
    _import_or_invalid(cfg)


@SETTINGS
@given(name=st.sampled_from(sorted(PROFILES)), field=st.sampled_from(SIZE_FIELDS), value=st.integers(-99, 0))
def test_profile_non_positive_size(name, field, value):
    data = dict(PROFILES[name], **{field: value})
    with pytest.raises(InvalidPlan, match=rf"^model\.{field} \({value}\) "):
        load_model_profile(data)
    with pytest.raises(ValidationError):  # what a caller of the schema gets from pydantic directly
        ModelSpec.model_validate(data)


@SETTINGS
@given(name=st.sampled_from(sorted(PROFILES)), data=st.data(), value=junk)
def test_profile_field_set_to_junk(name, data, value):
    prof = dict(PROFILES[name])
    field = data.draw(st.sampled_from(sorted(prof) + ["unknown_key"]))
    prof[field] = value
    try:
        spec = load_model_profile(prof)
    except InvalidPlan as exc:
        assert "\n" not in str(exc)
        return
    assert field != "unknown_key" and isinstance(spec, ModelSpec)


@SETTINGS
@given(name=st.sampled_from(sorted(PROFILES)), cut=st.integers(0, 2000), noise=st.text(max_size=10),
       suffix=st.sampled_from([".yaml", ".json"]))
def test_garbled_model_file(name, cut, noise, suffix):
    """A garbled profile YAML, or a garbled config.json, loaded as the CLI's MODEL argument."""
    src = (PROFILE_DIR / f"{name}.yaml") if suffix == ".yaml" else (REFERENCE_DIR / sorted(CONFIGS)[cut % 11])
    text = src.read_text()
    garbled = text[:cut] + noise + text[cut + len(noise):]
    with tempfile.TemporaryDirectory() as d:
        (path := Path(d) / f"m{suffix}").write_text(garbled, encoding="utf-8")
        try:
            assert isinstance(load_model(str(path)), ModelSpec)
        except InvalidPlan as exc:
            assert "\n" not in str(exc)


def test_profile_top_k_above_expert_count_and_missing_key():
    data = dict(PROFILES["gpt-oss-20b"], top_k=33)
    with pytest.raises(InvalidPlan, match=r"^model\.top_k \(33\) must be <= model\.num_experts \(32\)"):
        load_model_profile(data)
    data = {k: v for k, v in PROFILES["gpt-oss-20b"].items() if k != "hidden_size"}
    with pytest.raises(InvalidPlan, match=r"^model\.hidden_size \(none given\) is missing"):
        load_model_profile(data)
