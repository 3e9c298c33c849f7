"""``MemTracker`` over a step whose tensors are real, run under ``FakeTensorMode`` (DESIGN §8).

The whole-step trace (``step_trace``) builds the composed step with real CPU tensors before fake
mode (FSDP2 cannot build under fake tensors) and runs it under
``FakeTensorMode(allow_non_fake_inputs=True)``. Every op on a real tensor first converts it to a
fake tensor with a fake storage of its own (the size of the real storage), memoised only while
that fake lives. ``MemTracker`` counts an op's output storages, so the output of an op on a
converted tensor that aliases it adds the whole converted storage as a new allocation beside the
real storage it already counts (``track_external``, the modules' forward hooks), for as long as
the alias lives. The GPU allocates nothing there. In the composed step (before this tracker):

- each MoE layer's expert block, ``self.shard.w_up_nHJ[slot]`` / ``w_down_nIH[slot]``: views of
  the converted local expert stack, ``E/E_p`` experts' weights, in the forward and the backward;
- the head, Ring-DTP's strips ``w_VpH[lo:hi]`` (forward folds, backward gradient strips): views of
  the converted head shard, the size of the head's gradient;
- the optimizer, the writes through ``p.detach().view(-1)`` (``OffloadStreamAdamW``'s update of
  the replicated proxies, ``ReplicatedShards.gather``): the converted head and expert shards.

``RealInputsTracker(fake_mode, *holders)``: before tracking, converts every real tensor of
``holders`` once (``fake_mode.from_tensor``) and keeps those fakes alive as long as the tracker,
so that any later conversion of a tensor on one of those storages (the tensor itself, a view or an
alias of it) yields a fake on the same fake storage; and counts that fake storage as the real
storage it stands for (``_track``). A real tensor outside ``holders`` is converted, and counted,
as by ``MemTracker``.

Build the tracker outside the fake mode: ``DTensor.to_local`` runs a view op, which under fake mode
would itself convert.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.weak import WeakIdKeyDictionary


def real_tensors(*holders) -> list[torch.Tensor]:
    """The real tensors of ``holders``: modules (parameters, a DTensor's local shard, buffers),
    optimizers (state tensors), tensors and lists of them."""
    out: list[torch.Tensor] = []

    def add(t) -> None:
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
            out.append(t.to_local() if hasattr(t, "to_local") else t)

    for h in holders:
        if isinstance(h, torch.nn.Module):
            for t in (*h.parameters(), *h.buffers()):
                add(t)
        elif isinstance(h, torch.optim.Optimizer):
            for state in h.state.values():
                for t in state.values():
                    add(t)
        elif isinstance(h, (list, tuple)):
            for t in h:
                add(t)
        else:
            add(h)
    return out


class RealInputsTracker(MemTracker):
    """``MemTracker`` that counts the fake conversion of a real input as the real storage (module
    docstring). ``holders``: as ``real_tensors``. It overrides ``MemTracker._track``, a private
    method (the same signature in torch 2.11 and 2.13, where the trace tests run)."""

    def __init__(self, fake_mode, *holders) -> None:
        super().__init__()
        self._fakes: list[torch.Tensor] = []
        """The conversions, kept alive: while they live, the converter's storage memo returns
        their fake storages for every tensor on the same real storages."""
        self._real_of = WeakIdKeyDictionary()
        """Fake storage -> a real tensor on the storage it converts."""
        for t in real_tensors(*holders):
            f = fake_mode.from_tensor(t)
            self._fakes.append(f)
            self._real_of.setdefault(f.untyped_storage(), t)

    def _track(self, reftype, t: torch.Tensor) -> None:
        if isinstance(t, FakeTensor):
            real = self._real_of.get(t.untyped_storage())
            if real is not None:
                t = real
        super()._track(reftype, t)
