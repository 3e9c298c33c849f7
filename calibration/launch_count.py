"""Kernel-launching calls of a step, counted by phase (``calibration.step_host``'s launches).

A ``TorchDispatchMode`` sees every aten call the step makes, autograd's backward included; a call
counts as a launch unless it is a view (every return aliases an input read-only), an allocation
(``NOT_LAUNCHES``) or a profiler range. One aten call is one launch here; a few launch more than one
kernel on CUDA (the fused AdamW's ``multi_tensor_apply`` chunks, flash attention's backward), so the
count is a launch count of the Python-visible calls, which is what the host pays per call.
"""

from __future__ import annotations


NOT_LAUNCHES = ("aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided", "aten::detach",
                "aten::lift_fresh", "aten::set_", "aten::resize_", "aten::empty_like")
"""Dispatched calls that allocate or relabel without launching a kernel (besides views)."""


def launches_kernel(func) -> bool:
    """Whether a dispatched call launches a kernel: not a view (every return aliasing an input
    read-only), not an allocation (``NOT_LAUNCHES``), not a profiler range."""
    name = func.name()
    if name.startswith("profiler::") or name.split(".")[0] in NOT_LAUNCHES:
        return False
    rets = func._schema.returns
    return not (rets and all(r.alias_info is not None and not r.alias_info.is_write for r in rets))


def counter(phase: list, inside):
    """A dispatch mode counting kernel-launching calls by ``phase[0]`` and ``inside()`` (in an expert loop)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n: dict = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if launches_kernel(func):
                key = (phase[0], bool(inside()))
                self.n[key] = self.n.get(key, 0) + 1
            return out
    return Count()


def count_step(st, tok, tgt, phase: list, inside) -> tuple:
    """One more step (untimed) under the launch counter: ``{(phase, inside loops): launches}``;
    ``({}, reason)`` where the counter cannot run (selective AC's own dispatch mode rejects
    another mode's calls in its recompute)."""
    from planner.runtime.measure import error_line

    count = counter(phase, inside)
    phase[0] = "embedding"
    try:
        with count:
            st.step(tok, tgt)
    except Exception as e:  # noqa: BLE001 - the timing stands; the count is reported missing
        return {}, error_line(e, 200)
    return dict(count.n), None
