"""Selective checkpoint offload (SCO) around checkpointed decoder regions (DESIGN §3.2, §7).

Legend:
    h_NH      boundary ``ℓ``: the input of checkpointed region ``ℓ`` (``N`` tokens × ``H``), device
    slot_NH   its pinned host slot, ``roundup(N·H·b, 4 KiB)`` bytes of one ``PinnedBuffer``
    L_b       boundaries (two regions per decoder layer: attention, then MLP/MoE; ``L_b = 2L``)
    n_off     boundaries offloaded: ``1..n_off`` (``planner.plans.sco``; greedy in forward order)

Each region runs under plain non-reentrant ``torch.utils.checkpoint`` (the baseline). SCO wraps
that call in ``torch.autograd.graph.saved_tensors_hooks``: the checkpoint saves its inputs as saved
tensors before it enters its own hooks, so the outer pack hook receives the boundary, and the
recomputation unpacks it. Interior tensors never reach these hooks (the checkpoint's own hooks
sit on top of the stack), so a nested reentrant checkpoint inside the region (PipelinedLLEP) is
untouched.

Forward of region ``ℓ`` when ``ℓ ≤ n_off``:
    1. record event E_h on the compute stream (h_ℓ produced); the copy stream waits E_h;
    2. copy stream: ``slot_ℓ ← h_ℓ`` (D2H, non-blocking), event E_d2h;
    3. after the region's forward is enqueued, the compute stream waits E_d2h and SCO drops its
       reference: the device copy is freed once the caller drops ``h_ℓ`` (at the latest, one
       region after it was produced), and no compute kernel can reuse its memory before the copy.
Backward, when region ``ℓ`` recomputes (the checkpoint unpacks its input):
    1. ``h_ℓ``: the prefetched buffer (or an on-demand restore); the compute stream waits its
       H2D event before any use;
    2. prefetch ``h_{ℓ-1}`` if offloaded: allocate on the compute stream, record E_alloc, the copy
       stream waits E_alloc (earlier users of that memory), H2D, record E_h2d.
    So at most 2 restored boundaries are on the device: the one recomputing and the one prefetched.
The D2H of step t+1 and the H2D of step t use one copy stream, so a slot is never overwritten
while it is read. On the CPU and in trace mode (``planner.runtime.shim``) copies run in order.

In-place changes: torch checks that a saved tensor was not changed in place before its backward,
except for tensors that pass through saved-tensor hooks. SCO makes that check at unpack for what it
keeps (the retained boundary and the region's other tensor arguments: ``_version`` now against the
one at pack) and raises torch's ``RuntimeError`` ("modified by an inplace operation"), as plain
checkpointing does. An offloaded boundary changed by its own region's forward raises the same (the
D2H may have read either value); one changed after its region returned is restored as the forward
read it, so the gradients stay exact.

Collectives: none. Bytes moved per step: ``n_off·N·H·b`` D2H in forward and as much H2D in
backward. Live device buffers: retained boundaries ``h_{n_off+1}..``, the region's input and output,
≤ 2 restored boundaries, the boundary gradients (``planner/budget/boundaries.py``). Host: one
pinned pool of ``n_off·roundup(N·H·b, 4 KiB)`` bytes, pinned once in ``__init__``.

Only ``loss.backward()`` is supported (``torch.autograd.grad`` is unsupported under reentrant
checkpointing, DESIGN §7); each rank builds its own ``SCO`` from the same plan.

One host slot per offloaded boundary: between a region's forward and the backward that reads its
boundary back, the same region index must not run again with grad (a second forward before the
backward, e.g. two micro-batches summed into one loss, or one index used twice in a forward),
because that overwrites the slot. Supporting it would need a slot per use; SCO detects it
instead: every offload bumps the slot's generation and the saved placeholder keeps the one it
wrote; a restore whose slot (or prefetched copy) holds another generation raises ``RuntimeError``
naming the region index (one integer comparison per restore; the normal path is unchanged). Do one
backward per forward (accumulate micro-batches in ``.grad``), one index per region. After
``close()`` every use raises ``RuntimeError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.utils.checkpoint as tuc

from planner.plans.sco import offloaded_indices, pinned_bytes_per_boundary
from planner.runtime import shim
from planner.runtime.offload_checks import check_region_input, check_register, check_sco_device, check_version
from planner.runtime.pinned import PinnedBuffer
from planner.runtime.validation import check_host_bytes, check_sco, checked_device, floating_dtype

RACE_SLEEP_CYCLES = {"copy": 0, "compute": 0}
"""Cycles of ``torch.cuda._sleep`` injected before each copy and on the compute stream (race tests)."""


def set_race_sleep(copy: int = 0, compute: int = 0) -> None:
    """Inject ``torch.cuda._sleep`` on the copy and compute streams (0 turns it off)."""
    RACE_SLEEP_CYCLES.update(copy=int(copy), compute=int(compute))


def _sleep(kind: str, stream, device) -> None:
    cycles = RACE_SLEEP_CYCLES[kind]
    if cycles and shim.use_streams(device):
        with shim.on_stream(stream):
            torch.cuda._sleep(cycles)


def checkpoint_region(fn: Callable, h: torch.Tensor, *args, **kwargs):
    """The baseline: plain non-reentrant per-region ``torch.utils.checkpoint``."""
    return tuc.checkpoint(fn, h, *args, use_reentrant=False, **kwargs)


def _what(index: int, boundary: bool) -> str:
    return f"the boundary h of SCO region {index}" if boundary else f"a tensor argument of SCO region {index}"


@dataclass
class _Kept:
    """A tensor the checkpoint saved and SCO keeps: the retained boundary (``boundary``) or another
    tensor argument of the region, with its ``_version`` at pack (torch skips its own in-place
    check for tensors that pass through saved-tensor hooks, so the unpack hook makes it)."""

    index: int
    tensor: torch.Tensor
    version: int
    boundary: bool


@dataclass
class _Offloaded:
    """An offloaded boundary: only its index, the slot generation it wrote and, when the region's
    own forward changed the boundary in place (the copy may have read either value), the version
    it had at pack."""

    index: int
    generation: int
    changed_from: int | None = None


@dataclass
class SCOStats:
    """Counters of one SCO instance (cumulative over steps)."""

    offloads: int = 0
    restores: int = 0
    prefetch_hits: int = 0
    """Restores that were already issued (prefetched) when the recompute asked for them."""
    log: list = field(default_factory=list)
    """``("d2h"|"h2d"|"use", index)`` in host program order (kept when ``SCO.keep_log``)."""


class SCO:
    """Selective checkpoint offload for ``num_boundaries`` checkpointed regions.

    Args:
        num_boundaries: ``L_b``.
        boundary_shape: shape of every boundary (``(N, H)`` or ``(batch, seq, H)``).
        dtype: boundary dtype (``b`` bytes per scalar).
        device: device of the boundaries.
        host_budget_bytes: SCO budget per rank, physical pinned bytes.
        register: pin the pool with ``cudaHostRegister`` (default: when CUDA is available).

    Raises:
        ValueError: a negative or infinite budget, an empty boundary, ``device="meta"`` outside
            a trace, ``register=True`` where CUDA is not available.
    """

    def __init__(self, *, num_boundaries: int, boundary_shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device | str, host_budget_bytes: int, register: bool | None = None,
                 keep_log: bool = False) -> None:
        dtype = floating_dtype("dtype", dtype)
        device = checked_device("device", device)
        check_sco_device(device)
        check_sco(num_boundaries, boundary_shape, host_budget_bytes, dtype, device)
        check_register(register)
        self.num_boundaries = int(num_boundaries)
        self.shape = tuple(int(s) for s in boundary_shape)
        self.dtype = dtype
        self.device = device
        numel = math.prod(self.shape)
        nbytes = numel * dtype.itemsize
        self.numel = numel
        self.offloaded = offloaded_indices(self.num_boundaries, nbytes, host_budget_bytes)
        self.slot_bytes = int(pinned_bytes_per_boundary(numel, 1, nbytes // numel))
        self._slot_of = {ell: k for k, ell in enumerate(self.offloaded)}
        if not shim.is_tracing():
            check_host_bytes("host_budget_bytes", len(self.offloaded) * self.slot_bytes)
        self.pool = PinnedBuffer(len(self.offloaded) * self.slot_bytes, register=register)
        self.copy_stream = shim.side_stream(self.device)
        self._pending: tuple[torch.Tensor, object] | None = None
        self._restored: dict[int, tuple[torch.Tensor, object, int]] = {}
        self._generation: dict[int, int] = {}
        """Offloads written into each slot so far (the slot's current content)."""
        self._closed = False
        self.stats = SCOStats()
        self.keep_log = keep_log

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def num_offloaded(self) -> int:
        """``n_off``."""
        return len(self.offloaded)

    @property
    def pinned_bytes(self) -> int:
        """Physical pinned host bytes: ``n_off · roundup(N·H·b, 4 KiB)``."""
        return self.pool.nbytes

    def slot(self, index: int) -> torch.Tensor:
        """The pinned host slot of offloaded boundary ``index`` (1-based), shaped like a boundary."""
        self._check_open()
        k = self._slot_of[index]
        return self.pool.view(k * self.slot_bytes, self.numel, self.dtype).view(self.shape)

    # -- the region wrapper ---------------------------------------------------------------------
    def region(self, index: int, fn: Callable, h: torch.Tensor, *args,
               checkpoint_fn: Callable = checkpoint_region, **kwargs):
        """Run checkpointed region ``index`` (1-based) on boundary ``h``: ``checkpoint_fn(fn, h, *args)``.

        ``checkpoint_fn`` must save its inputs as saved tensors (non-reentrant
        ``torch.utils.checkpoint`` does); ``fn`` may nest a reentrant checkpoint.

        Raises:
            ValueError: ``index`` outside ``1..L_b``, ``h`` not a tensor, or an offloaded ``h`` of
                the wrong shape, dtype, layout or device.
            RuntimeError: after ``close()``; in backward, when the boundary's host slot was
                overwritten by a later run of the same index, or a saved input was changed in
                place (module docstring).
        """
        self._check_open()
        check_region_input(index, h, self.num_boundaries,
                           (self.shape, self.dtype, self.device) if index in self._slot_of else None)
        if index == 1:
            self._drain()
        _sleep("compute", None, self.device)
        # The saved tensor keeps these hooks until backward: the pack hook must not keep ``h``
        # alive through its closure, so it reads it from a cell cleared after the first pack.
        target, offloaded = [h], []

        def pack(t: torch.Tensor):
            if target[0] is None or t is not target[0]:
                return _Kept(index, t, t._version, False)
            target[0] = None
            if index not in self._slot_of:
                return _Kept(index, t, t._version, True)
            offloaded.append(_Offloaded(index, self._offload(index, t)))
            return offloaded[-1]

        def unpack(p):
            if isinstance(p, _Kept):
                check_version(p.tensor, p.version, _what(p.index, p.boundary))
                if p.boundary:
                    self._prefetch(p.index - 1)
                return p.tensor
            if isinstance(p, _Offloaded):
                return self._restore(p)
            return p

        version = h._version
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = checkpoint_fn(fn, h, *args, **kwargs)
        target[0] = None
        if offloaded and h._version != version:  # changed while the D2H may still read it
            offloaded[0].changed_from = version
        self._finish_offload()
        return out

    # -- forward: offload -----------------------------------------------------------------------
    def _offload(self, index: int, h: torch.Tensor) -> int:
        """Start the D2H of ``h`` into its slot; returns the slot's new generation."""
        produced = shim.record(None, self.device)
        slot = self.slot(index)
        with shim.on_stream(self.copy_stream):
            shim.wait(produced, self.copy_stream)
            _sleep("copy", self.copy_stream, self.device)
            slot.copy_(h, non_blocking=True)
            done = shim.record(self.copy_stream, self.device)
        assert self._pending is None, "one offload in flight at a time"
        self._pending = (h, done)
        self.stats.offloads += 1
        if self.keep_log:
            self.stats.log.append(("d2h", index))
        self._generation[index] = generation = self._generation.get(index, 0) + 1
        return generation

    def _finish_offload(self) -> None:
        """The compute stream waits for the last D2H; then SCO drops its device reference."""
        if self._pending is not None:
            shim.wait(self._pending[1])
            self._pending = None

    # -- backward: restore and prefetch ---------------------------------------------------------
    def _issue_restore(self, index: int) -> None:
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        _sleep("compute", None, self.device)
        allocated = shim.record(None, self.device)
        with shim.on_stream(self.copy_stream):
            shim.wait(allocated, self.copy_stream)
            _sleep("copy", self.copy_stream, self.device)
            buf.copy_(self.slot(index), non_blocking=True)
            done = shim.record(self.copy_stream, self.device)
        self._restored[index] = (buf, done, self._generation.get(index, 0))
        self.stats.restores += 1
        if self.keep_log:
            self.stats.log.append(("h2d", index))

    def _prefetch(self, index: int) -> None:
        if index in self._slot_of and index not in self._restored:
            self._issue_restore(index)
            assert len(self._restored) <= 1, "SCO holds at most one prefetched boundary"

    def _restore(self, saved: _Offloaded) -> torch.Tensor:
        self._check_open()
        index, generation = saved.index, saved.generation
        if index in self._restored:
            self.stats.prefetch_hits += 1
        else:
            self._issue_restore(index)
        buf, done, held = self._restored.pop(index)
        shim.wait(done)                           # also before raising: the H2D still writes buf
        if held != generation:
            raise RuntimeError(
                f"SCO: the host slot of region {index} holds the boundary of a later run of region "
                f"{index} (offload {held}, this backward needs offload {generation}): a second "
                "forward before this backward, or the same index used twice in one forward, "
                "overwrote it, so the gradients would be wrong; fix: call backward after each "
                "forward (accumulate micro-batches in .grad) and give each region its own index")
        if saved.changed_from is not None:
            check_version(buf, saved.changed_from, _what(index, True))
        if self.keep_log:
            self.stats.log.append(("use", index))
        self._prefetch(index - 1)
        return buf

    def _drain(self) -> None:
        """Before a new forward: consume stale prefetches (a backward that did not reach them)."""
        self._finish_offload()
        for buf, done, _ in self._restored.values():
            shim.wait(done)
        self._restored.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("SCO is closed (its pinned pool was released): a region ran, or a "
                               "backward restored a boundary, after close(); fix: build a new SCO "
                               "and finish every backward before close()")

    def close(self) -> None:
        """Wait for the copy stream and unpin the pool (idempotent; the SCO is unusable after)."""
        if self._closed:
            return
        if self.copy_stream is not None:
            self.copy_stream.synchronize()
        self._drain()
        self.pool.release()
        self._closed = True
