"""Hugging Face ``config.json`` → ``ModelSpec``, and the generator of the shipped model profiles.

Reads every family of ``reference/hf-configs/NOTES.md`` (qwen2_moe, qwen3_moe, qwen3_next, olmoe,
mixtral, gpt_oss, phimoe, llama4, deepseek_v2/v3, kimi_k2, glm4_moe, dbrx) and multimodal wrappers
that nest the decoder in ``text_config``. Fields are read by their spellings (HF, dbrx, DeepSeek's
inference repo); what a family's modules fix without a config key is in ``_ARCH``. Interpretations
of the shipped files are listed in ``docs/models.md``.

Errors: every bad value or missing field raises ``InvalidPlan`` naming the config path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import InvalidPlan
from planner.schema.documents import read_structured, validate
from planner.schema.model import MLASpec, ModelSpec


@dataclass(frozen=True)
class _Arch:
    """What a family's Hugging Face modules fix without a config key."""

    qkv_bias: bool = False          # q/k/v biases whatever attention_bias says (qwen2_moe)
    qk_norm: bool = False           # q/k norms by architecture (qwen3*, olmoe)
    expert_bias: bool = False       # biases on expert projections (gpt_oss)
    router_bias: bool = False       # a learned router bias (gpt_oss)
    correction_bias: bool = False   # aux-loss-free e_score_correction_bias (DeepSeek-V3 family)
    sinks: bool = False             # one sink logit per head (gpt_oss)
    shared_llama4: bool = False     # one shared expert of width intermediate_size (llama4)
    alternate_sliding: bool = False  # default layer_types: even layers sliding (gpt_oss)
    linear_attention: bool = False  # Gated DeltaNet layers (qwen3_next)


_ARCH = {
    "qwen2_moe": _Arch(qkv_bias=True), "qwen3_moe": _Arch(qk_norm=True),
    "qwen3_next": _Arch(qk_norm=True, linear_attention=True), "olmoe": _Arch(qk_norm=True),
    "mixtral": _Arch(), "phimoe": _Arch(), "dbrx": _Arch(),
    "gpt_oss": _Arch(expert_bias=True, router_bias=True, sinks=True, alternate_sliding=True),
    "llama4": _Arch(shared_llama4=True),
    "deepseek_v2": _Arch(), "deepseek_v3": _Arch(correction_bias=True),
    "kimi_k2": _Arch(correction_bias=True), "glm4_moe": _Arch(correction_bias=True),
}
_TYPE_ALIASES = {"llama4_text": "llama4", "qwen3_vl_moe": "qwen3_moe", "kimi_k25": "kimi_k2"}

_ALIASES = {  # canonical HF key: other spellings (dbrx, DeepSeek's inference repo, torchtitan)
    "hidden_size": ("d_model", "dim"),
    "num_hidden_layers": ("n_layers",),
    "num_attention_heads": ("n_heads",),
    "num_key_value_heads": ("kv_n_heads", "n_kv_heads"),
    "max_position_embeddings": ("max_seq_len",),
    "num_experts_per_tok": ("experts_per_token", "moe_top_k", "n_activated_experts"),
    "moe_intermediate_size": ("moe_inter_dim",),
    "intermediate_size": ("ffn_hidden_size", "inter_dim"),
    "first_k_dense_replace": ("n_dense_layers",),
}
_EXPERT_COUNT = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_NESTED = ("attn_config", "ffn_config")
MAX_LAYERS = 65_536
"""Sanity bound on ``num_hidden_layers`` (real models have < 1000); per-layer lists are built."""


class _View:
    """A flat view of a config: key → (value, dotted path), nested sections and aliases resolved."""

    def __init__(self, config: Any) -> None:
        if not isinstance(config, dict):
            raise InvalidPlan("config", type(config).__name__, "must be a JSON object", "pass a config.json")
        self.items: dict[str, tuple[Any, str]] = {}
        self._add(config, "config")
        text = config.get("text_config")
        self.types = [t.get("model_type") for t in (text, config) if isinstance(t, dict)]
        if text is not None:
            if not isinstance(text, dict):
                raise InvalidPlan("config.text_config", text, "must be an object", "fix the config")
            self._add(text, "config.text_config")
        for sec in _NESTED:
            v, p = self.items.get(sec, (None, ""))
            if v is not None:
                if not isinstance(v, dict):
                    raise InvalidPlan(p, v, "must be an object", "fix the config")
                self._add(v, p, overwrite=False)
        self.conflicts = []
        for key, spellings in _ALIASES.items():
            for alt in spellings:
                if self.get(key) is None and self.get(alt) is not None:
                    self.items[key] = self.items[alt]
                elif self.get(alt) is not None and self.get(alt) != self.get(key):
                    self.conflicts.append(f"{self.path(alt)} ({self.get(alt)!r}) differs from "
                                          f"{self.path(key)} ({self.get(key)!r}); used the latter")

    def _add(self, d: dict, prefix: str, overwrite: bool = True) -> None:
        for k, v in d.items():
            if overwrite or k not in self.items:
                self.items[str(k)] = (v, f"{prefix}.{k}")

    def get(self, key: str, default: Any = None) -> Any:
        v = self.items.get(key, (None, ""))[0]
        return default if v is None else v

    def path(self, key: str) -> str:
        return self.items.get(key, (None, f"config.{key}"))[1]

    def integer(self, key: str, default: int | None = None, lo: int = 1, hi: int | None = None) -> int:
        """An integer in ``[lo, hi]``; ``default`` when absent (``None`` default: the field is required)."""
        v = self.get(key)
        if v is None:
            if default is None:
                raise InvalidPlan(self.path(key), None, "is missing", f"add {key} to the config")
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidPlan(self.path(key), v, "must be an integer", f"write {key} as a whole number")
        if v < lo:
            raise InvalidPlan(self.path(key), v, f"must be >= {lo}", f"fix {key}")
        if hi is not None and v > hi:
            raise InvalidPlan(self.path(key), v, f"must be <= {hi}", f"fix {key}")
        return v

    def flag(self, key: str, default: bool = False) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise InvalidPlan(self.path(key), v, "must be true or false", f"fix {key}")
        return v

    def layers(self, key: str, n: int, kind: type) -> list | None:
        """A per-layer or layer-index list whose items are ``kind``; ``None`` when absent."""
        v = self.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, kind) for x in v):
            raise InvalidPlan(self.path(key), v, f"must be a list of {kind.__name__}", f"fix {key}")
        if kind is int and any(not 0 <= x < n for x in v) and key not in ("no_rope_layers",):
            raise InvalidPlan(self.path(key), v, f"must hold layer indices in [0, {n})", f"fix {key}")
        return v


def _family(view: _View, warnings: list[str]) -> tuple[str, _Arch]:
    """The family whose architecture facts apply; unknown types read fields by spelling only."""
    for mt in view.types:
        if isinstance(mt, str):
            t = _TYPE_ALIASES.get(mt, mt.removesuffix("_text"))
            t = _TYPE_ALIASES.get(t, t)
            if t in _ARCH:
                return t, _ARCH[t]
    mt = view.get("model_type")
    warnings.append(f"config.model_type ({mt!r}) is not a known family; imported from recognisable field "
                    "names without family-specific facts (check biases, norms, shared experts)")
    return (mt if isinstance(mt, str) else "custom"), _Arch()


def _layer_pattern(v: _View, L: int, E: int) -> list[int]:
    """0-based indices of layers whose FFN is dense (every family's rule of NOTES.md)."""
    if not E:
        return []
    if v.get("first_k_dense_replace") is not None or v.get("moe_layer_freq") is not None:
        k, f = v.integer("first_k_dense_replace", 0, lo=0), v.integer("moe_layer_freq", 1)
        return [i for i in range(L) if not (i >= k and i % f == 0)]
    if v.get("mlp_only_layers") is not None or v.get("decoder_sparse_step") is not None:
        only, step = set(v.layers("mlp_only_layers", L, int) or ()), v.integer("decoder_sparse_step", 1)
        return [i for i in range(L) if i in only or (i + 1) % step]
    if v.get("moe_layers") is not None or v.get("interleave_moe_layer_step") is not None:
        moe = v.layers("moe_layers", L, int)
        if moe is None:
            step = v.integer("interleave_moe_layer_step", 1)
            moe = list(range(step - 1, L, step))
        return [i for i in range(L) if i not in set(moe)]
    return []


def _local_layers(v: _View, fam: _Arch, L: int, max_pos: int | None, warnings: list[str]):
    """(window, local layer indices): sliding or chunked attention layers."""
    chunk = v.integer("attention_chunk_size", 0, lo=0)
    window = v.integer("sliding_window", 0, lo=0) or chunk
    types, key = v.layers("layer_types", L, str), "layer_types"
    if types is None and fam.alternate_sliding and window:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if types is None and chunk:
        rope, key = v.layers("no_rope_layers", L, int), "no_rope_layers"
        rope = [int((i + 1) % 4 != 0) for i in range(L)] if rope is None else rope
        types = ["chunked_attention" if r else "full_attention" for r in rope]
    if types is None and fam.linear_attention:
        every = v.integer("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]
    if types is not None:
        if len(types) != L:
            raise InvalidPlan(v.path(key), f"{len(types)} entries",
                              f"must list num_hidden_layers ({L}) layers", f"fix {key}")
        linear = [i for i, t in enumerate(types) if t == "linear_attention"]
        if linear:
            warnings.append(f"{len(linear)} linear-attention (Gated DeltaNet) layers are modeled as full "
                            "attention layers: their parameters and memory are approximate")
        local = [i for i, t in enumerate(types) if t in ("sliding_attention", "chunked_attention")]
        if local and not window:
            raise InvalidPlan(v.path("sliding_window"), None, "is missing for sliding layers",
                              "add sliding_window")
        return (window, local) if local else (None, [])
    if not window or not v.flag("use_sliding_window", True):
        return None, []
    if max_pos and window >= max_pos:
        return None, []  # a window as long as the context is full attention (phimoe)
    start = v.integer("max_window_layers", 0, lo=0) if v.get("use_sliding_window") else 0
    return window, list(range(min(start, L), L))


def _rope(v: _View) -> dict:
    """The rotary settings: ``rope_parameters`` (transformers v5; per layer type or flat) or the older
    ``rope_scaling`` plus ``rope_theta``. Informational: ModelSpec holds no rope field."""
    rp = v.get("rope_parameters") or v.get("rope_scaling") or {}
    if isinstance(rp, dict) and rp and all(isinstance(x, dict) for x in rp.values()):
        rp = rp.get("full_attention") or next(iter(rp.values()))
    return {"rope_theta": v.get("rope_theta"), **rp} if isinstance(rp, dict) else {}


def _rope_note(rp: dict) -> str:
    kind, factor = rp.get("rope_type", rp.get("type")), rp.get("factor")
    note = f"rope theta {_num(rp.get('rope_theta'))}" if _num(rp.get("rope_theta")) else ""
    if kind and kind != "default" and _num(factor):
        note += f", {kind} x{_num(factor)} from {_num(rp.get('original_max_position_embeddings'))}"
    return note


def _num(x: Any) -> str:
    """A number as short text (``1000000``, ``0.5``); ``""`` for anything else."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _context(v: _View, rp: dict) -> int | None:
    """Released context: max_position_embeddings, max_seq_len (dbrx), rope original × factor, or
    initial_context_length (gpt_oss pre-YaRN)."""
    if v.get("max_position_embeddings") is not None:
        return v.integer("max_position_embeddings")
    orig, factor = rp.get("original_max_position_embeddings"), rp.get("factor") or 1
    if _num(orig) and _num(factor) and 1 <= orig * factor < 2**63:
        return int(orig * factor)
    return v.integer("initial_context_length", 0) or None


def import_hf(config: dict, name: str) -> tuple[ModelSpec, list[str]]:
    """Read a Hugging Face ``config.json`` (already parsed) into a ``ModelSpec``.

    Returns:
        ``(spec, warnings)``; warnings name what was assumed or could not be represented.
    Raises:
        InvalidPlan: a field is missing, of the wrong type or out of range (named by config path).
    """
    v = _View(config)
    warnings: list[str] = list(v.conflicts)
    mtype, fam = _family(v, warnings)
    H, nh, V = (v.integer(k) for k in ("hidden_size", "num_attention_heads", "vocab_size"))
    L = v.integer("num_hidden_layers", hi=MAX_LAYERS)
    nkv = v.integer("num_key_value_heads", nh)
    if nh % nkv:
        raise InvalidPlan(v.path("num_key_value_heads"), nkv, f"must divide num_attention_heads ({nh})",
                          "fix the head counts")
    e_key = next((k for k in _EXPERT_COUNT if v.get(k) is not None), _EXPERT_COUNT[0])
    E = v.integer(e_key, 0, lo=0)
    k = v.integer("num_experts_per_tok", 0 if not E else None, lo=0 if not E else 1)
    if E and k > E:
        raise InvalidPlan(v.path("num_experts_per_tok"), k, f"must be <= {e_key} ({E})",
                          "lower the top-k or raise the expert count")
    wide = "moe_intermediate_size" if v.get("moe_intermediate_size") is not None else "intermediate_size"
    I = v.integer(wide) if E else 0
    dense_key = "intermediate_size_mlp" if fam.shared_llama4 or v.get("intermediate_size_mlp") else (
        "intermediate_size" if (wide == "moe_intermediate_size" or not E) else None)
    dense = _layer_pattern(v, L, E)
    I_d = v.integer(dense_key, None if (dense or not E) else 0) if dense_key else 0
    if dense and not I_d:
        raise InvalidPlan("config.intermediate_size", None, "is missing for the dense layers",
                          "add the dense FFN width")
    n_sh = v.integer("n_shared_experts", 0, lo=0)
    sh_ffn, gate = n_sh * I, False
    if v.get("shared_expert_intermediate_size") is not None:
        sh_ffn = v.integer("shared_expert_intermediate_size", lo=0)
        n_sh, gate = int(sh_ffn > 0), sh_ffn > 0
    elif fam.shared_llama4 and E:
        n_sh, sh_ffn = 1, I
    rope = _rope(v)
    max_pos = _context(v, rope)
    window, local = _local_layers(v, fam, L, max_pos, warnings)

    mla = None
    if v.get("kv_lora_rank") is not None:
        mla = validate(MLASpec, dict(q_lora_rank=v.integer("q_lora_rank", 0, lo=0) or None,
                                     kv_lora_rank=v.integer("kv_lora_rank"),
                                     qk_nope_head_dim=v.integer("qk_nope_head_dim"),
                                     qk_rope_head_dim=v.integer("qk_rope_head_dim", lo=0),
                                     v_head_dim=v.integer("v_head_dim")), "config")
        head_dim, v_dim, nkv, kind = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim, nh, "mla"
        if v.flag("attention_bias"):
            warnings.append("attention_bias on MLA projections is not counted (a few parameters per layer)")
    else:
        if v.get("head_dim") is None and H % nh:
            raise InvalidPlan("config.head_dim", None, f"is missing and hidden_size ({H}) is not a multiple "
                              f"of num_attention_heads ({nh})", "add head_dim")
        head_dim, v_dim, kind = v.integer("head_dim", H // nh), None, ("mha" if nkv == nh else "gqa")
    if v.get("text_config") is not None and (v.get("vision_config") is not None or "ForConditional" in
                                             str(v.get("architectures"))):
        warnings.append("the vision tower (vision_config) is not counted: only the text decoder is imported")
    tie = v.get("tie_word_embeddings")
    if tie is None:
        warnings.append("config.tie_word_embeddings is missing: assumed false (untied)")
    if not E:
        warnings.append(f"config.{e_key} is 0: imported as a dense model" if v.get(e_key) is not None
                        else "no routed-expert count in the config: imported as a dense model")
    correction = fam.correction_bias and v.get("topk_method") in (None, "noaux_tc")
    fields = dict(
        name=name, source=_rope_note(rope), model_type=mtype, num_layers=L, hidden_size=H, vocab_size=V,
        tie_embeddings=v.flag("tie_word_embeddings"), attention=kind, num_heads=nh, num_kv_heads=nkv,
        head_dim=head_dim, v_head_dim=v_dim, mla=mla,
        attention_bias=mla is None and (fam.qkv_bias or v.flag("attention_bias")),
        qk_norm=fam.qk_norm or v.flag("use_qk_norm") or v.flag("qk_norm"), attention_sinks=fam.sinks,
        sliding_window=window, local_layers=tuple(local), num_experts=E, top_k=k if E else 0,
        expert_ffn=I, expert_bias=fam.expert_bias and bool(E),
        router_bias=bool(E) and (fam.router_bias or correction), num_shared_experts=n_sh if E else 0,
        shared_expert_ffn=sh_ffn if E else 0, shared_expert_gate=gate and bool(E),
        dense_ffn=I_d, dense_layers=tuple(dense), mtp_layers=v.integer("num_nextn_predict_layers", 0, lo=0),
        max_position_embeddings=max_pos)
    return validate(ModelSpec, fields, "config"), warnings


def default_profile_name(path: str | os.PathLike) -> str:
    """The name a config file's profile gets when none is given: the folder's name for a
    ``config.json`` (Hugging Face's layout, ``Qwen3-30B-A3B/config.json``; ``./config.json`` names
    the current folder), else the file's stem. A name the schema refuses (no folder name, over
    ``MAX_NAME_CHARS`` characters, a control character) falls back to the stem, then ``model``."""
    from planner.schema.base import MAX_NAME_CHARS

    p = Path(path)
    tries = ([Path(os.path.abspath(p)).parent.name] if p.name == "config.json" else []) + [p.stem, "model"]
    return next(n for n in tries if 1 <= len(n) <= MAX_NAME_CHARS and n.isprintable())


def import_hf_file(path: str | os.PathLike, name: str | None = None) -> tuple[ModelSpec, list[str]]:
    """Read a ``config.json`` file; the profile name defaults to ``default_profile_name``."""
    p = Path(path)
    config = read_structured(p)          # bounded: size, depth, integer size; one-line errors
    if not isinstance(config, dict):
        raise InvalidPlan("config", str(p), "must hold a JSON object", "pass a config.json")
    return import_hf(config, name or default_profile_name(p))


def profile_doc(spec: ModelSpec) -> dict:
    """The profile document of a spec: ``ModelSpec.model_dump(mode="json")``."""
    doc = spec.model_dump(mode="json")
    if not spec.mtp_layers:
        doc.pop("mtp_trained")  # meaningless without MTP layers
    return doc


def profile_yaml(spec: ModelSpec) -> str:
    """The profile text of a spec: ``profile_doc`` as YAML."""
    import yaml

    return yaml.safe_dump(profile_doc(spec), sort_keys=False, default_flow_style=None, width=100)
