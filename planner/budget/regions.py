"""Dense parameters of one checkpointed region, as ZeRO-3 gathers them (DESIGN §2).

Legend: region = the attention block or the MLP/MoE block of one layer (``L_b = 2L``). The dense
part of a MoE region is its router, shared experts and norm; routed experts are never gathered in
the composed stack (they live whole per expert shard).
"""

from __future__ import annotations

from planner.schema import ModelSpec


def attention_region_params(m: ModelSpec) -> int:
    """Attention block + its input RMSNorm."""
    return m.attention_params() + m.hidden_size


def moe_region_dense_params(m: ModelSpec) -> int:
    """Router + shared experts + the MLP input RMSNorm of one MoE layer."""
    return m.router_params() + m.shared_expert_params() + m.hidden_size


def dense_region_params(m: ModelSpec) -> int:
    """Dense gated FFN + its input RMSNorm."""
    return m.dense_ffn_params() + m.hidden_size


def mlp_region_dense_params(m: ModelSpec) -> int:
    """Largest dense part of an MLP-side region (MoE or dense layer)."""
    sizes = []
    if m.num_moe_layers:
        sizes.append(moe_region_dense_params(m))
    if m.num_dense_layers:
        sizes.append(dense_region_params(m))
    return max(sizes)


def layer_params_local(m: ModelSpec, *, tp, ep, moe: bool):
    """Parameters of one decoder layer one FSDP2 rank gathers: dense part over ``tp``, and for a MoE
    layer its ``E/ep`` local experts whole (replicated over ``tp``, FSDP-sharded over ``efsdp·tp``:
    ``planner/runtime/fsdp2_layout.py``; gpt-oss W8 tp8 forward[1]: ``moe_block.py`` experts call,
    the all-gather output 1518.8 and the unsharded experts 1012.5 + 506.2 MiB)."""
    dense = attention_region_params(m) + (moe_region_dense_params(m) if moe else dense_region_params(m))
    experts = (m.num_experts // ep) * m.expert_params() if moe else 0
    return -(-dense // tp) + experts  # ints or numpy arrays; experts replicated over tp
