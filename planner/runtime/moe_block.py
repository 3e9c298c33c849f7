"""The MoE block of the decoder: the family's router, the routed experts behind a pluggable
dispatcher, and the shared experts (DESIGN §2, §7).

Legend: ``N`` tokens of this rank (``B·T``), ``H`` hidden, ``E`` routed experts, ``k`` top-k,
``x_NH`` tokens, ``logits_NE`` router logits (fp32 math), ``ids_Nk`` chosen experts,
``weights_Nk`` fp32 route weights (they carry the router's gradient).

Routers (``model_layers.Family``):

- ``softmax``: ``softmax(x·wᵀ + b)``, top-k, renormalised over the ``k`` when ``norm_topk``
  (gpt-oss's softmax over the top-k logits is the same thing), times ``route_scale``;
- ``sigmoid_group`` (DeepSeek-V3): ``s = sigmoid(x·wᵀ)``; the choice uses ``s + bias`` (a
  buffer, the load-balancing correction, no gradient), keeps the ``topk_groups`` groups with the
  largest sum of their two best scores, takes the top-k there; weights are ``s`` of the chosen,
  renormalised, times ``route_scale``.

Dispatchers (``forward(x_NH, ids_Nk, weights_Nk) -> out_NH``): ``DenseExperts`` (the single-process
reference, every expert local) or one of ``planner.runtime`` EP / LLEP / PipelinedLLEP over the
expert group, holding this rank's ``E/E_p`` experts whole (never FSDP-sharded).
Expert biases (gpt-oss ``expert_bias``) are not modelled by the dispatch operators and are left out
(``2I + H`` parameters per expert, < 0.1% of an expert).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from planner.runtime.expert_mlp import ExpertShard, mlp
from planner.runtime.model_layers import GatedMLP, family, init_const, init_normal, local


class Router(nn.Module):
    """The family's top-k router (module docstring)."""

    def __init__(self, spec, *, device=None, dtype=None) -> None:
        super().__init__()
        fam = family(spec.model_type)
        E, H = spec.num_experts, spec.hidden_size
        self.kind, self.top_k, self.norm_topk, self.scale = fam.router, spec.top_k, fam.norm_topk, fam.route_scale
        g = fam.num_groups if E % fam.num_groups == 0 and fam.topk_groups * (E // fam.num_groups) >= spec.top_k else 1
        self.groups, self.topk_groups = g, (fam.topk_groups if g > 1 else 1)
        self.weight = nn.Parameter(torch.empty(E, H, device=device, dtype=dtype))
        sel_bias = self.kind == "sigmoid_group" and spec.router_bias
        self.bias = (nn.Parameter(torch.empty(E, device=device, dtype=dtype))
                     if spec.router_bias and not sel_bias else None)
        if sel_bias:
            self.register_buffer("correction", torch.zeros(E, device=device, dtype=torch.float32))
        else:
            self.correction = None

    def reset_parameters(self) -> None:
        init_normal(self.weight, self.weight.shape[1] ** -0.5)
        if self.bias is not None:
            init_const(self.bias, 0.0)
        if self.correction is not None:
            local(self.correction).zero_()

    def forward(self, x_NH: torch.Tensor):
        logits_NE = F.linear(x_NH, self.weight, self.bias).float()
        if self.kind == "softmax":
            probs_NE = torch.softmax(logits_NE, -1)
            vals_Nk, ids_Nk = torch.topk(probs_NE, self.top_k, dim=-1)
        else:
            s_NE = torch.sigmoid(logits_NE)
            choose_NE = s_NE.detach() + (self.correction if self.correction is not None else 0.0)
            if self.groups > 1:
                n = choose_NE.shape[0]
                grp_NG = choose_NE.view(n, self.groups, -1).topk(2, dim=-1).values.sum(-1)
                keep_NG = torch.zeros_like(grp_NG, dtype=torch.bool).scatter_(
                    1, grp_NG.topk(self.topk_groups, dim=-1).indices, True)
                mask_NE = keep_NG.repeat_interleave(choose_NE.shape[1] // self.groups, 1)
                choose_NE = choose_NE.masked_fill(~mask_NE, float("-inf"))
            ids_Nk = torch.topk(choose_NE, self.top_k, dim=-1).indices
            vals_Nk = s_NE.gather(1, ids_Nk)
        if self.norm_topk:
            vals_Nk = vals_Nk / vals_Nk.sum(-1, keepdim=True)
        return ids_Nk, vals_Nk * self.scale if self.scale != 1.0 else vals_Nk


class DenseExperts(nn.Module):
    """Every routed expert on this rank, computed expert by expert (the reference dispatcher)."""

    def __init__(self, num_experts: int, hidden: int, ffn: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.shard = ExpertShard(num_experts, hidden, ffn, dtype=dtype, device=device)

    def forward(self, x_NH, ids_Nk, weights_Nk):
        out_NH = torch.zeros_like(x_NH)
        k = ids_Nk.shape[1]
        flat = ids_Nk.reshape(-1)
        for e in range(self.shard.num_local):
            idx_R = (flat == e).nonzero().squeeze(1)
            if idx_R.numel() == 0:
                continue
            tok_R = torch.div(idx_R, k, rounding_mode="floor")
            y_RH = mlp(x_NH.index_select(0, tok_R), self.shard.w_up_nHJ[e], self.shard.w_down_nIH[e])
            w_R = weights_Nk.reshape(-1).index_select(0, idx_R)
            out_NH = out_NH.index_add(0, tok_R, y_RH * w_R.to(y_RH.dtype)[:, None])
        return out_NH


def init_expert_shard(shard: ExpertShard) -> None:
    """Re-initialise a (meta-built, then materialised) expert shard like ``ExpertShard``."""
    init_normal(shard.w_up_nHJ, shard.w_up_nHJ.shape[1] ** -0.5)
    init_normal(shard.w_down_nIH, shard.expert_ffn ** -0.5)


class MoEBlock(nn.Module):
    """Router → routed experts (``experts``, a dispatcher) + shared experts (optional sigmoid gate)."""

    def __init__(self, spec, experts: nn.Module, *, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.router = Router(spec, **kw)
        self.experts = experts
        self.shared = GatedMLP(spec.hidden_size, spec.shared_expert_ffn, **kw) if spec.shared_expert_ffn else None
        self.shared_gate = (nn.Linear(spec.hidden_size, 1, bias=False, **kw)
                            if spec.shared_expert_ffn and spec.shared_expert_gate else None)

    @property
    def context_fn(self):
        """``context_fn`` for the region's non-reentrant checkpoint (dispatch plan reuse) or None."""
        return getattr(self.experts, "plan_reuse", None)

    def reset_parameters(self) -> None:
        from planner.runtime.model_layers import init_linear

        self.router.reset_parameters()
        init_expert_shard(self.experts.shard)
        if self.shared is not None:
            self.shared.reset_parameters()
        if self.shared_gate is not None:
            init_linear(self.shared_gate)

    def forward(self, x_BTH: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` (``N = B·T``; not a view of a ``[B, T, H]`` output, which FSDP2's hooks dislike)."""
        x_NH = x_BTH.reshape(-1, x_BTH.shape[-1])
        ids_Nk, weights_Nk = self.router(x_NH)
        out_NH = self.experts(x_NH, ids_Nk, weights_Nk)
        if self.shared is not None:
            sh_NH = self.shared(x_NH)
            if self.shared_gate is not None:
                sh_NH = torch.sigmoid(self.shared_gate(x_NH)) * sh_NH
            out_NH = out_NH + sh_NH
        return out_NH
