"""Small building blocks of ``planner.runtime.model``: RMSNorm, rotary tables, the gated FFN, and
the per-family facts a ``ModelSpec`` does not carry (router kind, local-attention kind, RoPE base).

Legend: ``B`` sequences, ``T`` tokens of each on this rank, ``H`` hidden, ``I`` FFN width,
``x_BTH`` activations, ``cos_Tr``/``sin_Tr`` rotary tables (``r`` = rotary width / 2, fp32).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_ROPE_THETA = 10000.0
"""RoPE base when the profile's ``source`` text names none (``rope theta N``)."""


@dataclass(frozen=True)
class Family:
    """Facts of a model family that shape the runtime but not the parameter count."""

    router: str = "softmax"
    """``softmax`` (softmax, top-k) or ``sigmoid_group`` (DeepSeek-V3: sigmoid, group-limited)."""
    norm_topk: bool = True
    """Renormalise the chosen ``k`` weights to sum to 1."""
    num_groups: int = 1
    """Expert groups of the group-limited top-k (``n_group``)."""
    topk_groups: int = 1
    """Groups a token may pick from (``topk_group``)."""
    route_scale: float = 1.0
    """``routed_scaling_factor``."""
    local_kind: str = "sliding"
    """Local layers: ``sliding`` (token i sees i-w < j <= i) or ``chunked`` (the same w-chunk)."""


FAMILIES = {
    "deepseek_v3": Family(router="sigmoid_group", num_groups=8, topk_groups=4, route_scale=2.5),
    "deepseek_v2": Family(norm_topk=False),
    "qwen2_moe": Family(norm_topk=False),
    "olmoe": Family(norm_topk=False),
    "llama4": Family(local_kind="chunked"),
}
"""Per ``model_type`` (Hugging Face configs of the shipped profiles); others use ``Family()``."""


def family(model_type: str) -> Family:
    """The ``Family`` of a ``ModelSpec.model_type``."""
    return FAMILIES.get(model_type, Family())


def rope_theta(source: str) -> float:
    """RoPE base stated in a profile's ``source`` text (``rope theta 150000``), else the default."""
    m = re.search(r"rope theta ([0-9.eE+]+)", source or "")
    return float(m.group(1)) if m else DEFAULT_ROPE_THETA


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, computed in fp32 (``weight`` in the working dtype)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        init_const(self.weight, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def rope_tables(positions_T: torch.Tensor, rot_dim: int, theta: float):
    """``(cos_Tr, sin_Tr)`` fp32 for the given positions (``r = rot_dim/2``)."""
    inv = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, device=positions_T.device, dtype=torch.float32)
                          / rot_dim))
    ang_Tr = positions_T.to(torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang_Tr), torch.sin(ang_Tr)


def apply_rope(x_BThd: torch.Tensor, cos_Tr: torch.Tensor, sin_Tr: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the last dimension of ``x`` (``[B, T, heads, d]``), in fp32."""
    r = x_BThd.shape[-1] // 2
    x32 = x_BThd.float()
    x1, x2 = x32[..., :r], x32[..., r:]
    c, s = cos_Tr[None, :, None, :], sin_Tr[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x_BThd.dtype)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) ⊙ up(x))``: a dense FFN, or the shared experts of a MoE layer."""

    def __init__(self, hidden: int, ffn: int, *, bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.w_gate = nn.Linear(hidden, ffn, **kw)
        self.w_up = nn.Linear(hidden, ffn, **kw)
        self.w_down = nn.Linear(ffn, hidden, **kw)

    def reset_parameters(self) -> None:
        for lin in (self.w_gate, self.w_up, self.w_down):
            init_linear(lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: the local shard of a DTensor (FSDP2), else ``p`` itself."""
    return p.to_local() if hasattr(p, "to_local") else p


@torch.no_grad()
def init_normal(p: torch.Tensor, std: float) -> None:
    """Normal(0, std) into this rank's part of ``p`` (the global RNG; DTensor shards included)."""
    t = local(p)
    t.normal_(0.0, std)


@torch.no_grad()
def init_const(p: torch.Tensor, value: float) -> None:
    """Fill this rank's part of ``p`` with ``value``."""
    local(p).fill_(value)


def init_linear(lin: nn.Linear) -> None:
    """Normal(0, fan_in^-1/2) weight, zero bias."""
    init_normal(lin.weight, lin.in_features ** -0.5)
    if lin.bias is not None:
        init_const(lin.bias, 0.0)
