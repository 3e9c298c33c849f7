"""``ModelSpec``: the architecture of a (MoE) decoder-only language model.

Parameter counts (``param_counts``) follow the Hugging Face modules of each family:
gated (SwiGLU) FFNs of ``3·H·I`` weights, MHA/GQA projections ``H·(n_h + 2·n_kv)·d_h + n_h·d_h·H``,
MLA projections as in DeepSeek-V2 §2.1, two RMSNorms per layer plus a final one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from planner.schema.base import (MAX_EXPERTS, MAX_HEADS, MAX_MTP_LAYERS, MAX_PARAMS, MAX_TOKENS, MAX_VOCAB, MAX_WIDTH,
                                 SCHEMA_VERSION, Frozen, check_name, check_schema_version)


class MLASpec(Frozen):
    """Multi-head latent attention ranks (DeepSeek-V2 §2.1)."""

    q_lora_rank: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """Rank of the query down-projection; ``None`` means a full-rank query projection."""
    kv_lora_rank: int = Field(ge=1, le=MAX_WIDTH)
    """Rank of the joint key/value down-projection (the cached latent)."""
    qk_nope_head_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int = Field(ge=0, le=MAX_WIDTH)
    """Per-head query/key width carrying the decoupled rotary embedding."""
    v_head_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Per-head value width."""


class ModelSpec(Frozen):
    """Architecture of one model. Shapes only: no weights, no training dtype.

    Symbols (DESIGN §1): ``L`` = num_layers, ``H`` = hidden_size, ``E`` = num_experts,
    ``k`` = top_k, ``I`` = expert_ffn, ``I_d`` = dense_ffn, ``V`` = vocab_size.
    """

    schema_version: int = SCHEMA_VERSION
    """Schema version of this profile."""
    name: str
    """Short profile name, e.g. ``gpt-oss-20b``."""
    source: str = ""
    """Where the numbers came from (a Hugging Face repo, a paper table) and stated assumptions."""
    model_type: str = "custom"
    """The family (Hugging Face ``model_type``) the spec was imported from."""
    num_layers: int = Field(ge=1, le=65536)
    """``L``: decoder layers (MTP layers not included)."""
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    """``H``: hidden width."""
    vocab_size: int = Field(ge=1, le=MAX_VOCAB)
    """``V``: vocabulary size (rows of the embedding and of the head)."""
    tie_embeddings: bool = False
    """Whether the head shares the input embedding's weight."""
    attention: Literal["mha", "gqa", "mla"] = "gqa"
    """Attention kind: MHA/GQA with ``head_dim`` or MLA with its ranks in ``mla``."""
    num_heads: int = Field(ge=1, le=MAX_HEADS)
    """Query heads."""
    num_kv_heads: int = Field(ge=1, le=MAX_HEADS)
    """Key/value heads (GQA); equal to ``num_heads`` for MHA and MLA."""
    head_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Query/key head width (MLA: ``qk_nope_head_dim + qk_rope_head_dim``)."""
    v_head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """Value head width when it differs from ``head_dim`` (MLA); ``None`` means ``head_dim``."""
    mla: MLASpec | None = None
    """MLA ranks; required when ``attention == "mla"``."""
    attention_bias: bool = False
    """Whether q/k/v/o projections carry biases."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3, OLMoE)."""
    attention_sinks: bool = False
    """One learned sink logit per head and layer (gpt-oss)."""
    sliding_window: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Window of the local (sliding or chunked) attention layers; changes no memory under Ulysses."""
    local_layers: tuple[int, ...] = ()
    """0-based indices of layers that use local attention."""
    num_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    """``E``: routed experts per MoE layer (0 for a dense model)."""
    top_k: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    """``k``: routed experts per token."""
    expert_ffn: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """``I``: width of one routed expert's gated FFN."""
    expert_bias: bool = False
    """Whether expert projections carry biases (gpt-oss)."""
    router_bias: bool = False
    """Whether the router carries a bias."""
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    """Shared experts per MoE layer (every token goes through them)."""
    shared_expert_ffn: int = Field(default=0, ge=0, le=MAX_WIDTH * 64)
    """Total width of the shared experts' gated FFN (count × width already applied)."""
    shared_expert_gate: bool = False
    """A sigmoid gate ``H → 1`` on the shared expert output (Qwen2-MoE)."""
    dense_ffn: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """``I_d``: width of the gated FFN of dense layers."""
    dense_layers: tuple[int, ...] = ()
    """0-based indices of layers whose FFN is dense instead of MoE."""
    mtp_layers: int = Field(default=0, ge=0, le=MAX_MTP_LAYERS)
    """Multi-token-prediction layers beyond ``num_layers`` (DeepSeek-V3: 1)."""
    mtp_trained: bool = True
    """Whether the MTP layers are trained with the model (default: yes, as DeepSeek-V3 was). When
    ``True`` their parameters count in ``Θ`` and in every parameter-sized term; a model card's total
    counts the main model only (``param_counts(mtp=False)``)."""
    max_position_embeddings: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Context length the model was released with (informational)."""

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        return check_schema_version(v, "model.schema_version")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "model.name")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        from planner.errors import InvalidPlan

        self._check_attention()
        if self.num_heads % self.num_kv_heads:
            raise InvalidPlan("model.num_kv_heads", self.num_kv_heads,
                              f"must divide model.num_heads ({self.num_heads})", "fix the head counts")
        if self.num_experts:
            if self.top_k < 1:
                raise InvalidPlan("model.top_k", self.top_k, "must be >= 1 for a MoE model",
                                  "set top_k (num_experts_per_tok)")
            if self.top_k > self.num_experts:
                raise InvalidPlan("model.top_k", self.top_k,
                                  f"must be <= model.num_experts ({self.num_experts})",
                                  "lower top_k or raise num_experts")
            if self.expert_ffn < 1:
                raise InvalidPlan("model.expert_ffn", self.expert_ffn, "must be >= 1 for a MoE model",
                                  "set expert_ffn (moe_intermediate_size)")
        bad = [i for i in (*self.dense_layers, *self.local_layers) if not 0 <= i < self.num_layers]
        if bad:
            raise InvalidPlan("model.dense_layers/local_layers", bad[0],
                              f"must be a layer index in [0, {self.num_layers})", "fix the layer list")
        for field, layers in (("dense_layers", self.dense_layers), ("local_layers", self.local_layers)):
            if len(set(layers)) != len(layers):
                again = next(i for i in layers if layers.count(i) > 1)
                raise InvalidPlan(f"model.{field}", again, "is listed twice", "list each layer index once")
        if bool(self.num_shared_experts) != bool(self.shared_expert_ffn):
            raise InvalidPlan("model.shared_expert_ffn", self.shared_expert_ffn,
                              f"contradicts model.num_shared_experts ({self.num_shared_experts}): both are 0 or "
                              "neither is", "set both (the shared experts' total width), or neither")
        if self.dense_layers and self.dense_ffn < 1:
            raise InvalidPlan("model.dense_ffn", self.dense_ffn, "must be >= 1 when dense_layers is set",
                              "set dense_ffn (intermediate_size)")
        if not self.num_experts and self.dense_ffn < 1:
            raise InvalidPlan("model.dense_ffn", self.dense_ffn, "must be >= 1 for a dense model",
                              "set dense_ffn")
        self._check_size()
        return self

    def _check_attention(self) -> None:
        """The cross-field rules of each attention kind: MHA has as many KV heads as heads; GQA and
        MHA carry no ``mla`` block (it would be ignored); MLA's ``head_dim``/``v_head_dim`` are its
        ranks' (``qk_nope + qk_rope``, ``v_head_dim``) and it has as many KV heads as heads."""
        from planner.errors import InvalidPlan

        kind = self.attention
        if kind != "mla" and self.mla is not None:
            raise InvalidPlan("model.mla", "{...}", f"is set but model.attention is {kind!r}, which ignores it",
                              "set attention: mla, or remove the mla block")
        if kind in ("mha", "mla") and self.num_kv_heads != self.num_heads:
            raise InvalidPlan("model.num_kv_heads", self.num_kv_heads,
                              f"must equal model.num_heads ({self.num_heads}) under {kind} attention",
                              "set num_kv_heads = num_heads, or attention: gqa")
        if kind != "mla":
            return
        a = self.mla
        if a is None:
            raise InvalidPlan("model.mla", None, "is required when model.attention is 'mla'",
                              "add kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim")
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if self.head_dim != qk:
            raise InvalidPlan("model.head_dim", self.head_dim,
                              f"must equal mla.qk_nope_head_dim + mla.qk_rope_head_dim ({qk}) under MLA",
                              f"set head_dim: {qk}")
        if self.v_dim != a.v_head_dim:
            raise InvalidPlan("model.v_head_dim", self.v_head_dim,
                              f"must equal mla.v_head_dim ({a.v_head_dim}) under MLA",
                              f"set v_head_dim: {a.v_head_dim}")

    def _check_size(self) -> None:
        """``Θ`` at most ``MAX_PARAMS``, blamed on the field that contributes most."""
        from planner.errors import InvalidPlan

        c = self.param_counts()
        if c["total"] <= MAX_PARAMS:
            return
        widths = {"hidden_size": self.hidden_size, "expert_ffn": self.expert_ffn, "num_experts": self.num_experts,
                  "vocab_size": self.vocab_size, "num_layers": self.num_layers, "dense_ffn": self.dense_ffn}
        owner = max(("experts", "embedding", "attention", "dense_ffn", "shared_experts"), key=lambda k: c[k])
        field = {"experts": "num_experts" if self.num_experts > self.expert_ffn else "expert_ffn",
                 "embedding": "vocab_size", "attention": "num_heads", "dense_ffn": "dense_ffn",
                 "shared_experts": "shared_expert_ffn"}[owner]
        value = widths.get(field, getattr(self, field))
        raise InvalidPlan(f"model.{field}", value,
                          f"gives Θ = {c['total']:.3g} parameters ({owner} {c[owner]:.3g}), above the "
                          f"2^50 = {MAX_PARAMS:.3g} the planner evaluates exactly", f"lower model.{field}")

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        """Whether any layer routes tokens to experts."""
        return self.num_experts > 0

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        """0-based indices of MoE layers."""
        if not self.is_moe:
            return ()
        dense = set(self.dense_layers)
        return tuple(i for i in range(self.num_layers) if i not in dense)

    @property
    def num_moe_layers(self) -> int:
        """MoE layers among the ``L`` decoder layers."""
        return len(self.moe_layer_indices)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense FFN."""
        return self.num_layers - self.num_moe_layers

    @property
    def v_dim(self) -> int:
        """Value head width."""
        return self.v_head_dim or self.head_dim

    @property
    def seq_parallel_heads(self) -> int:
        """Heads a Ulysses degree ``D`` must divide: KV heads under GQA, heads under MHA/MLA."""
        return self.num_kv_heads if self.attention == "gqa" else self.num_heads

    # ---- parameter counts ------------------------------------------------------------------
    def attention_params(self) -> int:
        """Weights of one attention block (projections, biases, q/k norms, sinks), norm excluded."""
        H, nh, nkv, dh, dv = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.v_dim
        if self.attention == "mla":
            a = self.mla
            assert a is not None
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            if a.q_lora_rank:
                q = H * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * nh * qk
            else:
                q = H * nh * qk
            kv = H * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
            kv += a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim)
            o = nh * a.v_head_dim * H
            return q + kv + o
        n = H * nh * dh + 2 * H * nkv * dh + nh * dv * H
        if self.attention_bias:
            n += nh * dh + 2 * nkv * dh + H
        if self.qk_norm:
            n += 2 * dh
        if self.attention_sinks:
            n += nh
        return n

    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down; biases if any): ``3·H·I``."""
        H, I = self.hidden_size, self.expert_ffn
        return 3 * H * I + ((2 * I + H) if self.expert_bias else 0)

    def router_params(self) -> int:
        """Router of one MoE layer: ``H·E`` (+ bias)."""
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def shared_expert_params(self) -> int:
        """Shared experts of one MoE layer (+ their gate)."""
        H = self.hidden_size
        return 3 * H * self.shared_expert_ffn + (H if self.shared_expert_gate else 0)

    def dense_ffn_params(self) -> int:
        """Gated dense FFN of one dense layer: ``3·H·I_d``."""
        return 3 * self.hidden_size * self.dense_ffn

    def param_counts(self, mtp: bool | None = None) -> dict[str, int]:
        """Trainable parameters by owner (DESIGN §3.2); ``mtp`` (default ``mtp_trained``) says whether
        the MTP layers count.

        Keys: ``embedding``, ``head`` (0 when tied), ``attention``, ``norms``, ``router``,
        ``shared_experts``, ``dense_ffn``, ``experts`` (routed, MTP layers' included), ``mtp`` (the
        dense part of the MTP layers), and the totals ``dense`` (everything ZeRO-3 sharded over
        ``W`` except the head), ``total``.
        """
        H, V, L = self.hidden_size, self.vocab_size, self.num_layers
        n_moe = self.num_moe_layers
        c = {
            "embedding": V * H,
            "head": 0 if self.tie_embeddings else V * H,
            "attention": L * self.attention_params(),
            "norms": (2 * L + 1) * H,
            "router": n_moe * self.router_params(),
            "shared_experts": n_moe * self.shared_expert_params(),
            "dense_ffn": self.num_dense_layers * self.dense_ffn_params(),
            "experts": n_moe * self.num_experts * self.expert_params(),
        }
        # An MTP module (DeepSeek-V3 §2.2): a full MoE decoder layer, 2 input norms, a 2H->H
        # projection and a final norm. Its routed experts are experts; the rest is dense.
        mtp_dense = (self.attention_params() + 2 * H + self.router_params() + self.shared_expert_params()
                     + 2 * H + 2 * H * H + H)
        n_mtp = self.mtp_layers if (self.mtp_trained if mtp is None else mtp) else 0
        c["mtp"] = n_mtp * mtp_dense
        c["experts"] += n_mtp * self.num_experts * self.expert_params()
        c["dense"] = (c["embedding"] + c["attention"] + c["norms"] + c["router"] + c["shared_experts"]
                      + c["dense_ffn"] + c["mtp"])
        c["total"] = c["dense"] + c["head"] + c["experts"]
        return c

    def active_params(self) -> int:
        """Parameters touched by one token (all dense weights, ``k`` routed experts per MoE layer)."""
        c = self.param_counts()
        per_layer_active = self.top_k * self.expert_params()
        return c["dense"] + c["head"] + self.num_moe_layers * per_layer_active
