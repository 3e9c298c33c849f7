"""Per-phase memory of one training step, recorded through the composed step's ``on_phase`` hook.

The step calls ``on_phase(name, r)`` at each phase boundary of DESIGN §3.1: before the forward of
region ``r`` (``"forward", r``), at the head (``"head", None``), before the backward of region
``r`` (``"backward", r``) and before the optimizer (``"optimizer", None``). A phase is the window
from its call to the next call (the last one ends with ``finish()``). What runs before the first
call (the embedding) belongs to ``forward[1]``, as the budget counts it (DESIGN §3.1 table).

At each boundary the recorder reads the window's peak and resets it to the current bytes. Two
sources of bytes:

- ``CudaSource``: the caching allocator's own counters, ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved``, reset with ``torch.cuda.reset_peak_memory_stats`` (real GPU runs);
- ``TrackerSource``: ``MemTracker``'s current and peak snapshots of the fake ``cpu`` device under
  ``FakeTensorMode`` (the whole-step trace, DESIGN §8); it has no reserved bytes.

``SavedTensorCounter`` attributes bytes to the ``boundaries`` live set: a saved-tensor pack hook
around the step counts the distinct storages autograd saves at the outermost level, which under
per-region checkpointing are exactly the boundaries (and, without checkpointing, every saved
activation).
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch


@dataclass
class PhaseSample:
    """Bytes of one phase window."""

    label: str
    """``forward[3]``, ``head``, ``backward[3]``, ``optimizer``."""
    start_bytes: int
    """Allocated bytes when the phase began."""
    peak_bytes: int
    """Peak allocated bytes during the phase."""
    peak_reserved_bytes: int | None = None
    """Peak reserved bytes during the phase (``None`` where the source has none: fake tensors)."""
    saved_bytes: int = 0
    """Bytes autograd held as outer saved tensors when the phase began (the boundaries)."""

    def asdict(self) -> dict:
        return asdict(self)


class Source(Protocol):
    """Where the bytes come from."""

    def current(self) -> int: ...
    def peak(self) -> tuple[int, int | None]: ...
    def reset(self) -> None: ...


class CudaSource:
    """The CUDA caching allocator's counters on ``device``."""

    def __init__(self, device: torch.device | str = "cuda") -> None:
        self.device = torch.device(device)

    def current(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> tuple[int, int | None]:
        return (int(torch.cuda.max_memory_allocated(self.device)),
                int(torch.cuda.max_memory_reserved(self.device)))

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


class TrackerSource:
    """``MemTracker``'s bytes of one device type (fake ``cpu`` = the traced device)."""

    def __init__(self, tracker, device_type: str = "cpu") -> None:
        self.mt, self.device_type = tracker, device_type

    def _total(self, snap: dict) -> int:
        return sum(int(c.get("Total", 0)) for d, c in snap.items() if torch.device(d).type == self.device_type)

    def current(self) -> int:
        return self._total(self.mt.get_tracker_snapshot("current"))

    def peak(self) -> tuple[int, int | None]:
        return max(self._total(self.mt.get_tracker_snapshot("peak")), self.current()), None

    def begin_step(self) -> None:
        """MemTracker refuses a module's second forward unless its module stats are cleared."""
        self.mt.reset_mod_stats()

    def reset(self) -> None:
        # MemTracker keeps one running peak per device and no public reset: restart it from now.
        cur = self.mt.get_tracker_snapshot("current")
        self.mt._peak_mem_snap = cur
        self.mt._peak_mem = {d: int(c.get("Total", 0)) for d, c in cur.items()}


class SavedTensorCounter:
    """Distinct storages autograd saves at the outermost level while the context is open.

    Use as a context manager around the step; ``bytes`` is what is saved and still alive (a
    storage counts while the first tensor saved on it lives).
    """

    def __init__(self, device_type: str | None = None) -> None:
        self.device_type = device_type
        self._live: dict[int, tuple[int, weakref.ref]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        if self.device_type is None or t.device.type == self.device_type:
            st = t.untyped_storage()
            key = st._cdata  # the StorageImpl: one key per storage, fake or real
            if key not in self._live or self._live[key][1]() is None:
                self._live[key] = (st.nbytes(), weakref.ref(t))
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def bytes(self) -> int:
        return sum(n for n, ref in self._live.values() if ref() is not None)

    def clear(self) -> None:
        self._live.clear()

    def __enter__(self) -> "SavedTensorCounter":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


@dataclass
class PhaseRecorder:
    """The ``on_phase`` hook: one ``PhaseSample`` per phase of the last recorded step."""

    source: Source
    saved: SavedTensorCounter | None = None
    samples: dict[str, PhaseSample] = field(default_factory=dict)
    _label: str | None = None
    _start: int = 0
    _saved_at_start: int = 0
    _pre: tuple[int, int | None] | None = None
    _open: bool = False

    def start(self) -> None:
        """Begin a step: forget the previous step's samples; the window before the first
        ``on_phase`` call is folded into ``forward[1]``."""
        self.samples = {}
        self._label, self._pre, self._open = None, None, True
        if hasattr(self.source, "begin_step"):
            self.source.begin_step()
        self._start = self.source.current()
        self._saved_at_start = self._saved_bytes()
        self.source.reset()

    def _saved_bytes(self) -> int:
        return self.saved.bytes if self.saved is not None else 0

    def _close(self) -> None:
        peak, reserved = self.source.peak()
        if self._label is None:
            self._pre = (peak, reserved)
            return
        prev = self.samples.get(self._label)
        if self._pre is not None:  # the embedding's window belongs to forward[1]
            peak = max(peak, self._pre[0])
            reserved = None if reserved is None else max(reserved, self._pre[1] or 0)
            self._pre = None
        if prev is not None:  # a phase entered twice (should not happen): keep the larger
            peak = max(peak, prev.peak_bytes)
        self.samples[self._label] = PhaseSample(self._label, self._start, peak, reserved, self._saved_at_start)

    def __call__(self, name: str, r: int | None = None) -> None:
        assert self._open, "PhaseRecorder.start() must be called before the step"
        assert name in ("forward", "head", "backward", "optimizer"), name
        self._close()
        self._label = f"{name}[{r}]" if r is not None else name
        self._start = self.source.current()
        self._saved_at_start = self._saved_bytes()
        self.source.reset()

    def finish(self) -> dict[str, PhaseSample]:
        """End the step; returns the samples by phase label."""
        self._close()
        self._open = False
        return self.samples
