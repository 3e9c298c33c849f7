"""DESIGN §7's norm-wise exactness bound, for comparisons whose summation order may differ between
machines (different GEMM call sites or layouts, reductions in another order).

``err <= max(TORCH_ERR_FACTOR·err_torch, EPS_FACTOR·eps·‖ref‖)``: ``err`` is the operator's error
against a float64 reference, ``err_torch`` that of torch's own fp32 reference on the same inputs.
Bitwise comparisons (``torch.equal``) stay only where the order is provably the same everywhere:
elementwise updates, copies, and identical kernels on identical inputs (README, Validation).
"""

from __future__ import annotations

TORCH_ERR_FACTOR = 2.0
"""DESIGN §7: the operator may err up to this multiple of torch's own fp32 reference error."""
EPS_FACTOR = 4.0
"""DESIGN §7: ... or up to this many machine epsilons of the reference norm."""


def normwise_excess(ours, torch_ref, ref64) -> str | None:
    """``None`` if ``ours`` meets the bound, else a line with the numbers."""
    import torch

    eps = torch.finfo(ours.dtype).eps
    ref64 = ref64.double()
    err = float((ours.double() - ref64).norm())
    err_torch = float((torch_ref.double() - ref64).norm())
    bound = max(TORCH_ERR_FACTOR * err_torch, EPS_FACTOR * eps * float(ref64.norm()))
    if err <= bound:
        return None
    return f"err {err:.3e} > bound {bound:.3e} (err_torch {err_torch:.3e}, ‖ref‖ {float(ref64.norm()):.3e})"
