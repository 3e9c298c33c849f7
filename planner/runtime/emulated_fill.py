"""Random data in the receive buffers of ranks emulated under the fake process group.

Under the fake process group (one rank of a larger plan measured on one GPU: real memory, no-op
communication) every all-to-all is a no-op, so each receive buffer is ``new_empty`` memory that the
expert GEMMs read unwritten: zeros or stale values, on which they run 8-18% faster than on random
operands (``bench/results/gemm_operands``). Inside ``FilledAllToAll`` an all-to-all on a fake group
copies its output from a random buffer instead (``exchange.fake_fill``); ``nbytes`` counts the
bytes the copies read and write, so a timing can be net of them.
"""

from __future__ import annotations

import torch

from planner.runtime import exchange


class FilledAllToAll:
    """Context manager: while inside, an all-to-all on a fake group fills its output from random
    data (``exchange.fake_fill``); other groups are untouched."""

    def __init__(self, device: torch.device) -> None:
        if not isinstance(device, torch.device):
            raise ValueError(f"device must be a torch.device, got {device!r}")
        self.device = device
        self.buf: dict = {}
        self.nbytes = 0
        """Bytes read and written by the fills so far (a caller may reset it)."""

    def fill(self, out: torch.Tensor) -> None:
        """Write ``out`` from the random buffer of its dtype (grown as needed)."""
        if not out.numel():
            return
        have = self.buf.get(out.dtype)
        if have is None or have.numel() < out.numel():
            have = torch.randn(out.numel(), device=self.device).to(out.dtype)
            self.buf[out.dtype] = have
        out.copy_(have[: out.numel()].view_as(out))
        self.nbytes += 2 * out.numel() * out.element_size()

    def __enter__(self) -> "FilledAllToAll":
        if exchange.fake_fill is not None:
            raise RuntimeError("an all-to-all fill is already active (FilledAllToAll does not nest)")
        exchange.fake_fill = self.fill
        return self

    def __exit__(self, *exc) -> None:
        exchange.fake_fill = None
