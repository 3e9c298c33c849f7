"""The unshard sub-steps of the ``gathered`` live set (composed stack; ``planner.budget.gathered``'s
legend): FSDP2's all-gather output beside the parameters copied out of it, at a region's unshard in
the forward (region ``r−1``'s output still held) and in the backward (region ``r``'s own, before
its gradients and region ``r−1``'s prefetch). Each is the excess over what the phase books then.
"""

from __future__ import annotations

import numpy as np

from planner.budget.gathered_units import SOURCE, by_region as _by_region, unit_params as _unit_params
from planner.budget.terms import Phase, Term
from planner.context.ctx import Ctx


def forward_substep(ctx: Ctx, P) -> Term:
    """``forward[r]``, ``r ≥ 2``, ``W > 1``: region ``r−1``'s all-gather output beside region ``r``'s
    unshard, as the excess over ``A_r``, region ``r``'s ``attention``, ``ffn`` and ``dispatch``
    bytes in ``forward[r]`` (see the module legend), and without checkpointing the region's own
    saves that ``boundaries`` books (``saved_composed.own_bytes``: H200 allocator history of
    deepseek-v2-lite W = 8 ``checkpoint = none`` forward[2], whose peak is the dense FFN's down
    projection, with region 1's all-gather output freed)."""
    from planner.budget import attention, dispatch, ffn, saved_composed

    b = ctx.act_bytes
    units = _unit_params(ctx, P)[:-1]
    multi = np.where(np.asarray(ctx.world_size) > 1, 1, 0)
    from planner.budget.attention_sliding import local_regions

    acts, disp = [*attention.terms(ctx), *ffn.terms(ctx)], []

    def a_r(ph, terms):
        return sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in terms), np.int64(0))

    kinds, local = ctx.regions, set(local_regions(ctx))
    cnt = [0 * multi]
    seen: dict = {}   # A_r depends on the region's kind and window only (tests/unit/test_gathered_unshard.py)
    for r in range(2, len(units) + 1):
        key = (kinds[r - 2], kinds[r - 1], r in local)
        if key not in seen:
            ph, held = Phase("forward", r, kinds[r - 1]), np.asarray(units[r - 2]) * multi * b
            a = a_r(ph, acts)
            if ctx.stack == "composed" and ctx.checkpoint == "none":   # the region's own saves, booked there
                a = a + saved_composed.own_bytes(ctx, ph)
            if np.any(held > a):   # the dispatch terms (costly to build) only where they can matter
                disp = disp or dispatch.terms(ctx)
                a = a + a_r(ph, disp)
            seen[key] = np.maximum(held - a, 0) // b
        cnt.append(seen[key])
    big, at = _by_region(cnt)
    return Term("unshard sub-step: region r−1's all-gather output beside region r's (excess over A_r)",
                "gathered", big, b, "max(0, Θ_region(r−1)·[W > 1] − A_r)  (A_r: region r's attention, ffn, "
                "dispatch bytes in forward[r])", ("forward",), at=at, provisional=False,
                source=SOURCE + "; torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py wait_for_unshard (the "
                "previous all-gather state is freed after this unit's all-gather); whole-step trace of "
                "deepseek-v2-lite W = 64 forward[3] (all_gather_copy_in / split_with_sizes_copy at model.py:82); "
                "H200 validate of the same case: forward[3] held Θ_dense_ffn + 2·Θ_attention beside the "
                "persistent, boundary and workspace bytes (189.60 MB against 189.54)")


def backward_substep(ctx: Ctx, P, own: list[Term]) -> Term:
    """``backward[r]``, ``W > 1``: region ``r``'s backward starts with its unshard, which holds the
    unsharded parameters beside their all-gather output (``2·Θ_region(r)``) and region ``r+1``'s held
    reduce-scatter input, before any gradient of region ``r`` and before region ``r−1``'s prefetch:
    the excess of ``Θ_region(r)`` over what the phase books beside the region's parameters then (the
    prefetch ``Θ_region(r−1)``, region ``r``'s own unreduced gradients and its ``attention``, ``ffn``
    and ``dispatch`` backward bytes; without checkpointing also the dense FFN's gated-MLP moment,
    ``saved_composed.compute_only_backward_bytes``, which comes only after the unshard: 1.05-1.06
    at DeepSeek-V2-Lite W = 8 and 16 backward[2] when booked beside it, held-out rounds 4 and 5).
    A checkpointed region's recompute outweighs it; without checkpointing a dense FFN region's
    does not."""
    from planner.budget import attention, dispatch, ffn, saved_composed

    b = ctx.act_bytes
    units = _unit_params(ctx, P)             # the last: the [norm, head] unit after region L_b
    multi = np.where(np.asarray(ctx.world_size) > 1, 1, 0)
    ts = [t for t in own if t.name.startswith(("region weights", "unreduced grads"))]
    acts, disp = [*ts, *attention.terms(ctx), *ffn.terms(ctx)], []
    cnt = []
    for r in range(1, len(units)):
        ph = Phase("backward", r, ctx.regions[r - 1])
        beside = sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in acts), np.int64(0))
        beside = beside + saved_composed.compute_only_backward_bytes(ctx, ph)   # after the unshard
        held = (2 * np.asarray(units[r - 1]) * multi + np.asarray(units[r])) * b   # units[r]: region r+1's
        if ctx.regions[r - 1] == "moe" and np.any(held > beside):   # the dispatch terms only where they can matter
            disp = disp or dispatch.terms(ctx)
            beside = beside + sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in disp), np.int64(0))
        cnt.append(np.maximum(held - beside, 0) // b)
    big, at = _by_region(cnt)
    return Term("backward unshard sub-step: region r's all-gather output beside its parameters (excess)",
                "gathered", big, b, "max(0, (2·Θ_region(r)·[W > 1] + Θ_unit(r+1)) − (Θ_region(r) + Θ_region(r−1) "
                "+ region r's unreduced grads + Θ_unit(r+1) + its attention, ffn, dispatch backward bytes))",
                ("backward",), at=at,
                source=SOURCE + "; whole-step trace and H200 planner validate of deepseek-v2-lite W = 8 S = 8192 "
                "checkpoint = none backward[2] (validate_heldout_r4.json): the peak at the dense FFN unit's "
                "pre-backward unshard, 2 × 128.25 MiB of its parameters beside region 3's 26.3 MiB")
