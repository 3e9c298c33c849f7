"""Per-tensor FSDP2 shard sizes (torch-free), for the host bytes of ``CPUOffloadPolicy`` (DESIGN §2).

``CPUOffloadPolicy(pin_memory=True)`` pins every sharded parameter (and the fp32 gradient that
the reduce-scatter copies down) through PyTorch's caching host allocator, which rounds each block
up to a power of two. The host bytes therefore depend on the size of every shard, not only on the
total: ``Σ_tensors pow2ceil(shard_numel · 4)``.

Tensor inventory (torchtitan-style modules; ``H`` hidden, ``V`` vocabulary):

    embedding, output          [V, H]                      FSDP over dim 0 (vocab-parallel /tp when tp>1)
    attention_norm, ffn_norm   [H] per layer, norm [H]     replicated over tp
    GQA/MHA: wq [n_h·d, H], wk, wv [n_kv·d, H] column-parallel; wo [H, n_h·d_v] row-parallel;
             biases, q/k norms [d], sinks [n_h]
    MTP modules (DeepSeek-V3 §2.2): a full MoE layer each, plus enorm, hnorm [H], eh_proj [H, 2H], norm [H]
    MLA:     wq_a [q_lora, H], q_norm [q_lora], wq_b [n_h·d_qk, q_lora] (column), wkv_a
             [kv_lora + d_rope, H], kv_norm [kv_lora], wkv_b [n_h·(d_nope+d_v), kv_lora] (column),
             wo [H, n_h·d_v] (row)
    router gate [E, H]; experts w1, w3 [E, I, H], w2 [E, H, I] (grouped, EP over dim 0, then
             FSDP over the ``efsdp·tp = (dp_shard·cp/ep)·tp`` ranks holding them (experts are
             replicated over tp in planner/runtime/fsdp2.py) on dim 0, or on dim 1 when fewer
             local experts than shard ranks); shared experts and dense FFN w1, w3 [I, H] (column),
             w2 [H, I] (row)

FSDP shards dim 0 over ``dp_shard·cp`` ranks with padding: a shard holds
``ceil(dim0/F)·rest`` elements. Expert tensor parallelism is not modelled (``etp = 1``).
Works on ints and numpy arrays (``tp``, ``fsdp``, ``ep`` may be candidate arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.schema import ModelSpec
from planner.units import ceil_div


@dataclass(frozen=True)
class ParamTensor:
    """One kind of parameter tensor: ``count`` copies of ``[dim0, rest]`` (``rest`` = other dims)."""

    name: str
    dim0: int
    rest: int
    count: int
    split: str
    """``col`` (tp splits dim 0), ``row`` (tp splits ``rest``), ``rep`` (replicated), ``expert``."""


def param_tensors(m: ModelSpec) -> list[ParamTensor]:
    """The model's parameter tensors by kind (``count`` = how many layers hold one)."""
    H, V, mtp = m.hidden_size, m.vocab_size, (m.mtp_layers if m.mtp_trained else 0)
    L = m.num_layers + mtp  # an MTP module is a full MoE decoder layer plus its own norms and projection
    nh, nkv, d, dv = m.num_heads, m.num_kv_heads, m.head_dim, m.v_dim
    out = [ParamTensor("embedding", V, H, 1, "col"), ParamTensor("norm", H, 1, 1, "rep"),
           ParamTensor("attention_norm", H, 1, L, "rep"), ParamTensor("ffn_norm", H, 1, L, "rep"),
           ParamTensor("mtp.enorm_hnorm", 2 * H, 1, mtp, "rep"), ParamTensor("mtp.eh_proj", H, 2 * H, mtp, "col"),
           ParamTensor("mtp.norm", H, 1, mtp, "rep")]
    if not m.tie_embeddings:
        out.append(ParamTensor("output", V, H, 1, "col"))
    if m.attention == "mla" and m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            out += [ParamTensor("wq_a", a.q_lora_rank, H, L, "rep"), ParamTensor("q_norm", a.q_lora_rank, 1, L, "rep"),
                    ParamTensor("wq_b", nh * qk, a.q_lora_rank, L, "col")]
        else:
            out.append(ParamTensor("wq", nh * qk, H, L, "col"))
        out += [ParamTensor("wkv_a", a.kv_lora_rank + a.qk_rope_head_dim, H, L, "rep"),
                ParamTensor("kv_norm", a.kv_lora_rank, 1, L, "rep"),
                ParamTensor("wkv_b", nh * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, L, "col"),
                ParamTensor("wo", H, nh * a.v_head_dim, L, "row")]
    else:
        out += [ParamTensor("wq", nh * d, H, L, "col"), ParamTensor("wk", nkv * d, H, L, "col"),
                ParamTensor("wv", nkv * dv, H, L, "col"), ParamTensor("wo", H, nh * dv, L, "row")]
        if m.attention_bias:
            out += [ParamTensor("bq", nh * d, 1, L, "col"), ParamTensor("bk", nkv * d, 1, L, "col"),
                    ParamTensor("bv", nkv * dv, 1, L, "col"), ParamTensor("bo", H, 1, L, "rep")]
        if m.qk_norm:
            out += [ParamTensor("q_norm", d, 1, L, "rep"), ParamTensor("k_norm", d, 1, L, "rep")]
        if m.attention_sinks:
            out.append(ParamTensor("sinks", nh, 1, L, "col"))
    n_moe, n_dense = m.num_moe_layers + (mtp if m.num_experts else 0), m.num_dense_layers
    if n_moe:
        E, I = m.num_experts, m.expert_ffn
        out += [ParamTensor("router", E, H, n_moe, "rep"), ParamTensor("experts.w1", E, I * H, n_moe, "expert"),
                ParamTensor("experts.w3", E, I * H, n_moe, "expert"),
                ParamTensor("experts.w2", E, H * I, n_moe, "expert")]
        if m.router_bias:
            out.append(ParamTensor("router_bias", E, 1, n_moe, "rep"))
        if m.expert_bias:
            out += [ParamTensor("experts.b13", E, 2 * I, n_moe, "expert"), ParamTensor("experts.b2", E, H, n_moe, "expert")]
        if m.shared_expert_ffn:
            Is = m.shared_expert_ffn
            out += [ParamTensor("shared.w1", Is, H, n_moe, "col"), ParamTensor("shared.w3", Is, H, n_moe, "col"),
                    ParamTensor("shared.w2", H, Is, n_moe, "row")]
        if m.shared_expert_gate:
            out.append(ParamTensor("shared.gate", 1, H, n_moe, "rep"))
    if n_dense:
        Id = m.dense_ffn
        out += [ParamTensor("ffn.w1", Id, H, n_dense, "col"), ParamTensor("ffn.w3", Id, H, n_dense, "col"),
                ParamTensor("ffn.w2", H, Id, n_dense, "row")]
    return [t for t in out if t.count > 0]


def shard_numel(t: ParamTensor, *, tp, fsdp, ep):
    """Elements of one rank's FSDP2 shard of ``t`` (padded: ``ceil(dim0/F)·rest``)."""
    tp, fsdp, ep = (np.asarray(x, dtype=np.int64) for x in (tp, fsdp, ep))
    if t.split == "expert":   # replicated over tp and sharded over the efsdp·tp ranks holding them
        local, efsdp = t.dim0 // ep, np.maximum(fsdp // ep, 1) * tp
        return np.where(local >= efsdp, ceil_div(local, efsdp) * t.rest, local * ceil_div(t.rest, efsdp))
    dim0 = ceil_div(t.dim0, tp) if t.split == "col" else t.dim0
    rest = ceil_div(t.rest, tp) if t.split == "row" else t.rest
    return ceil_div(dim0, fsdp) * rest


def pow2_ceil(x):
    """Smallest power of two ``≥ x`` (``x ≥ 1``; ints or numpy int64 arrays; 0 stays 0)."""
    x = np.asarray(x, dtype=np.int64)
    p = np.left_shift(np.int64(1), np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64))
    p = np.where(p < x, p * 2, p)
    p = np.where((p // 2) >= x, p // 2, p)
    return np.where(x == 0, 0, p)


def pinned_shard_bytes(m: ModelSpec, *, tp, fsdp, ep, elem_bytes: int = 4):
    """``Σ_tensors count · pow2ceil(shard_numel · elem_bytes)``: one pinned copy of every shard."""
    total = np.int64(0)
    for t in param_tensors(m):
        total = total + t.count * pow2_ceil(shard_numel(t, tp=tp, fsdp=fsdp, ep=ep) * elem_bytes)
    return total


def shard_params(m: ModelSpec, *, tp, fsdp, ep):
    """``Σ_tensors count · shard_numel``: one rank's sharded parameters (padded)."""
    total = np.int64(0)
    for t in param_tensors(m):
        total = total + t.count * shard_numel(t, tp=tp, fsdp=fsdp, ep=ep)
    return total


def layer_kind(t: ParamTensor) -> str:
    """``all`` (every decoder layer), ``moe``, ``dense_mlp`` or ``outer`` (embedding, head, norm, MTP)."""
    if t.name.startswith(("router", "experts.", "shared.")):
        return "moe"
    if t.name.startswith("ffn."):
        return "dense_mlp"
    if t.name in ("embedding", "output", "norm") or t.name.startswith("mtp."):
        return "outer"
    return "all"


def shard_params_by_unit(m: ModelSpec, *, tp, fsdp, ep) -> dict:
    """One rank's padded shard elements per FSDP unit: ``embedding``, ``head`` (output + final
    norm), ``mtp``, and one ``moe`` / ``dense_mlp`` layer."""
    out = {"embedding": np.int64(0), "head": np.int64(0), "mtp": np.int64(0), "moe": np.int64(0),
           "dense_mlp": np.int64(0)}
    for t in param_tensors(m):
        n = shard_numel(t, tp=tp, fsdp=fsdp, ep=ep)
        kind = layer_kind(t)
        if t.name == "embedding":
            out["embedding"] = out["embedding"] + n
        elif t.name in ("output", "norm"):
            out["head"] = out["head"] + n
        elif kind == "outer":
            out["mtp"] = out["mtp"] + t.count * n
        elif kind == "all":
            out["moe"] = out["moe"] + n
            out["dense_mlp"] = out["dense_mlp"] + n
        else:
            out[kind] = out[kind] + n
    if m.tie_embeddings:
        out["head"] = out["head"]
    return out
