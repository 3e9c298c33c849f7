"""One decoder for every shipped family, built from a ``ModelSpec`` (issue 11; DESIGN §2, §3.1).

Legend: ``B`` sequences, ``T`` tokens of each on this rank, ``H`` hidden, ``V`` vocabulary,
``L`` layers, ``L_b = 2L`` checkpointed regions, ``tokens_BT``/``targets_BT`` int64,
``h_BTH`` a boundary (a region's input), ``x_NH`` the head's input flattened (``N = B·T``).

Structure (torchtitan-like, so FSDP2 ``fully_shard`` per block or per region works):
``embed`` (``nn.Embedding``), ``layers`` (``nn.ModuleList`` of ``Block``: ``attention_norm``,
``attention``, ``ffn_norm``, ``ffn``), ``norm`` (RMSNorm), ``head`` (a module with ``.weight``
and ``forward(x_NH, targets_N) -> loss``; ``None`` when the embeddings are tied).

Regions (``regions()``), in forward order and matching ``planner.budget`` ``Ctx.regions``: per
layer ``("attention", block.attention_region)`` then ``("moe" | "dense_mlp", block.ffn_region)``;
each is ``h -> h + f(norm(h))`` and its input is its boundary.

Pluggable parts:

- ``attention``: the attention core, ``LocalCore()`` (default) or ``UlyssesCore(group)``;
- ``moe_block``: ``"dense"`` (``DenseExperts``, every expert local) or a callable
  ``make(layer) -> dispatcher`` (EP / LLEP / PipelinedLLEP holding this rank's expert shard);
- ``head``: ``"dense"`` (``DenseHead``) or a module (``RingDTPHead``, a vocab-parallel head);
- ``checkpoint``: ``"none"``, ``"per_layer"`` (one non-reentrant ``torch.utils.checkpoint`` per
  region), an ``SCO`` (per region, with boundary offload), or any callable
  ``checkpoint_fn(fn, h, *args, **kw)`` (e.g. torch's selective checkpointing via ``context_fn``);
- ``regions_per_layer``: 2 (composed, ``L_b = 2L``) or 1 (the FSDP2 baseline: one region per layer,
  ``block.layer_region``, ``L_b = L``).

``on_phase(name, r)`` (attribute, default ``None``) is called at every phase boundary of DESIGN
§3.1 with 1-based region indices: ``("forward", r)`` before region ``r`` runs, ``("head", None)``
before the final norm and head, and ``("backward", r)`` from a gradient hook on region ``r``'s
output, i.e. when autograd has finished everything after region ``r`` and is about to run (recompute
and) its backward. The optimizer phase belongs to the training step (``planner.runtime.mop``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from planner.runtime.attention import make_attention
from planner.runtime.model_layers import GatedMLP, RMSNorm, init_normal
from planner.runtime.moe_block import DenseExperts, MoEBlock
from planner.runtime.sco import SCO, checkpoint_region
from planner.runtime.vocab_baselines import DenseHead, dense_cross_entropy

def truncate_spec(spec, num_layers: int | None):
    """``spec`` cut to its first ``num_layers`` layers (widths, heads, experts unchanged)."""
    if num_layers is None or num_layers == spec.num_layers:
        return spec
    if not 1 <= num_layers <= spec.num_layers:
        raise ValueError(f"num_layers ({num_layers}) must be in 1..{spec.num_layers}; fix: pass a "
                         "depth the model has")
    keep = lambda idx: tuple(i for i in idx if i < num_layers)  # noqa: E731
    dense = keep(spec.dense_layers)
    return type(spec)(**{**spec.model_dump(), "num_layers": num_layers, "dense_layers": dense,
                         "local_layers": keep(spec.local_layers), "mtp_layers": 0})


class Block(nn.Module):
    """One decoder layer: an attention region and an FFN (MoE or dense) region."""

    def __init__(self, spec, layer: int, *, core, experts, device, dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        H = spec.hidden_size
        self.attention_norm = RMSNorm(H, **kw)
        self.attention = make_attention(spec, layer, core, **kw)
        self.ffn_norm = RMSNorm(H, **kw)
        self.is_moe = layer in set(spec.moe_layer_indices)
        if self.is_moe:
            self.ffn = MoEBlock(spec, experts, **kw)
        else:
            self.ffn = GatedMLP(H, spec.dense_ffn, **kw)

    @property
    def ffn_kind(self) -> str:
        return "moe" if self.is_moe else "dense_mlp"

    def attention_region(self, h_BTH: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
        return h_BTH + self.attention(self.attention_norm(h_BTH), positions_T)

    def ffn_region(self, h_BTH: torch.Tensor) -> torch.Tensor:
        return h_BTH + self.ffn(self.ffn_norm(h_BTH)).view_as(h_BTH)   # MoE blocks return [N, H]

    def layer_region(self, h_BTH: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
        """Both regions as one (the FSDP2 baseline's per-layer checkpoint)."""
        return self.ffn_region(self.attention_region(h_BTH, positions_T))


class Decoder(nn.Module):
    """The decoder of ``spec`` (module docstring). ``forward(tokens_BT, targets_BT)`` → this rank's
    loss: the mean over its tokens (``ignore_index = -100`` skipped), fp32."""

    def __init__(self, spec, *, num_layers: int | None = None, device=None, dtype=torch.bfloat16,
                 attention=None, moe_block="dense", head="dense", checkpoint="none",
                 position_offset: int = 0, regions_per_layer: int = 2) -> None:
        super().__init__()
        spec = truncate_spec(spec, num_layers)
        self.spec, self.dtype = spec, dtype
        kw = dict(device=device, dtype=dtype)
        H, V = spec.hidden_size, spec.vocab_size
        self.embed = nn.Embedding(V, H, **kw)
        self.layers = nn.ModuleList()
        for i in range(spec.num_layers):
            experts = None
            if i in set(spec.moe_layer_indices):
                experts = (DenseExperts(spec.num_experts, H, spec.expert_ffn, **kw) if moe_block == "dense"
                           else moe_block(i))
            self.layers.append(Block(spec, i, core=attention, experts=experts, **kw))
        self.norm = RMSNorm(H, **kw)
        if spec.tie_embeddings:
            if head != "dense":
                raise ValueError("tied embeddings need the dense head (the head is the embedding); "
                                 "fix: plan vocab: dense for a model with tie_embeddings")
            self.head = None
        else:
            self.head = DenseHead(H, V, **kw) if head == "dense" else head
        if regions_per_layer not in (1, 2):
            raise ValueError(f"regions_per_layer ({regions_per_layer}) must be 2 (composed: attention and "
                             "FFN regions) or 1 (FSDP2 baseline: one region per layer)")
        self.regions_per_layer = regions_per_layer
        self.checkpoint = checkpoint
        self.position_offset = position_offset
        self.on_phase: Callable | None = None

    # -- structure ------------------------------------------------------------------------------
    def regions(self) -> list[tuple[str, Callable]]:
        """``[(kind, fn), …]`` of the checkpointed regions in forward order: ``L_b = 2L``
        (``attention``, then ``moe``/``dense_mlp``, per layer), or ``L`` with
        ``regions_per_layer=1`` (kind: the layer's FFN kind, as ``Ctx.regions`` of the baseline)."""
        out = []
        for b in self.layers:
            if self.regions_per_layer == 1:
                out.append((b.ffn_kind, b.layer_region))
            else:
                out += [("attention", b.attention_region), (b.ffn_kind, b.ffn_region)]
        return out

    @property
    def num_boundaries(self) -> int:
        return self.regions_per_layer * len(self.layers)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter (this rank's part of it) from the global RNG."""
        init_normal(self.embed.weight, 1.0)
        for b in self.layers:
            for m in (b.attention_norm, b.attention, b.ffn_norm, b.ffn):
                m.reset_parameters()
        self.norm.reset_parameters()
        if self.head is not None:
            init_normal(self.head.weight, self.spec.hidden_size ** -0.5)

    # -- forward --------------------------------------------------------------------------------
    def _phase(self, name: str, r: int | None) -> None:
        if self.on_phase is not None:
            self.on_phase(name, r)

    def _run(self, r: int, kind: str, fn, h, *args):
        layer = self.layers[(r - 1) // self.regions_per_layer]
        ctx_fn = getattr(layer.ffn, "context_fn", None) if kind == "moe" else None
        kw = {"context_fn": ctx_fn} if ctx_fn is not None else {}
        if callable(self.checkpoint) and not isinstance(self.checkpoint, SCO):
            return self.checkpoint(fn, h, *args, **kw)
        if isinstance(self.checkpoint, SCO):
            return self.checkpoint.region(r, fn, h, *args, **kw)
        if self.checkpoint == "per_layer":
            return checkpoint_region(fn, h, *args, **kw)
        if self.checkpoint == "none":
            return fn(h, *args)
        raise ValueError(f"checkpoint ({self.checkpoint!r}) must be 'none', 'per_layer', an SCO or a "
                         "callable checkpoint_fn(fn, h, *args, **kw)")

    def _backward_hook(self, r: int):
        def hook(grad):
            self._phase("backward", r)
        return hook

    def hidden(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        """The final-normed hidden states ``[B, T, H]`` (phases ``forward[r]`` and ``head`` marked)."""
        T = tokens_BT.shape[1]
        positions_T = torch.arange(self.position_offset, self.position_offset + T, device=tokens_BT.device)
        h = self.embed(tokens_BT)
        for r, (kind, fn) in enumerate(self.regions(), 1):
            self._phase("forward", r)
            args = (positions_T,) if kind == "attention" or self.regions_per_layer == 1 else ()
            h = self._run(r, kind, fn, h, *args)
            if h.requires_grad:
                h.register_hook(self._backward_hook(r))
        self._phase("head", None)
        return self.norm(h)

    def forward(self, tokens_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        x = self.hidden(tokens_BT)
        x_NH, t_N = x.reshape(-1, x.shape[-1]), targets_BT.reshape(-1)
        if self.head is None:
            return dense_cross_entropy(x_NH, t_N, self.embed.weight)
        return self.head(x_NH, t_N)
