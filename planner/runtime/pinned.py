"""Page-aligned pinned host memory whose bytes are counted exactly (DESIGN §3.2 Boundaries).

PyTorch's pinned host allocator rounds every block up to a power of two (a 0.37 GiB boundary takes
0.5 GiB, a 10 GiB block 16 GiB), and its bytes are what ``torch.cuda.host_memory_stats`` reports.
SCO and OffloadStreamAdamW instead allocate anonymous ``mmap`` memory (page-aligned), wrap it with
``torch.frombuffer`` and pin it with ``cudaHostRegister``: physical bytes are
``roundup(nbytes, 4 KiB)`` and this module counts them itself (``live_pinned_bytes``).

- Pin once per job and reuse the buffer every step: pinning costs about 0.4 s/GiB.
- On a CPU-only machine the memory is allocated the same way and not registered.
- In the shim's trace mode the buffer is a fake ``meta`` tensor (``trace.HOST``) of the same
  byte size, so the trace counts host bytes apart from device bytes.

Release unregisters before unmapping. Views taken with ``view`` must not outlive the buffer.
"""

from __future__ import annotations

import mmap
import threading

import torch

from planner.runtime import shim
from planner.runtime.offload_checks import check_register
from planner.runtime.validation import check_host_bytes, check_int_range
from planner.units import PAGE_BYTES, round_up

_LOCK = threading.Lock()
_LIVE: dict[int, int] = {}
"""id(buffer) -> pinned bytes of every live buffer (trace-mode buffers excluded)."""


def live_pinned_bytes() -> int:
    """Physical bytes of every live ``PinnedBuffer`` of this process (registered or not)."""
    with _LOCK:
        return sum(_LIVE.values())


def _cuda_register(ptr: int, nbytes: int) -> None:
    rt = torch.cuda.cudart()
    rc = rt.cudaHostRegister(ptr, nbytes, 0)  # cudaHostRegisterDefault
    code = int(getattr(rc, "value", rc))
    if code != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with cudaError {code}; "
                           "check `ulimit -l` (locked memory) and free host RAM")


def _cuda_unregister(ptr: int) -> None:
    rt = torch.cuda.cudart()
    rt.cudaHostUnregister(ptr)


class PinnedBuffer:
    """``nbytes`` (rounded up to 4 KiB pages) of page-aligned host memory, pinned when CUDA runs.

    Args:
        nbytes: bytes wanted; the buffer holds ``roundup(nbytes, 4 KiB)``.
        register: pin with ``cudaHostRegister``; default: when CUDA is available and not tracing.

    Attributes:
        tensor: the whole buffer as a flat ``uint8`` tensor (host; fake ``meta`` in trace mode).
        nbytes: physical bytes, ``roundup(nbytes, 4 KiB)``.
        registered: whether ``cudaHostRegister`` pinned it.
    """

    def __init__(self, nbytes: int, *, register: bool | None = None) -> None:
        check_int_range("nbytes", nbytes, 0, fix="pass a byte count")
        check_register(register)
        if PAGE_BYTES % mmap.PAGESIZE:
            raise RuntimeError(f"host page size {mmap.PAGESIZE} does not divide PAGE_BYTES ({PAGE_BYTES}): "
                               "the pinned-byte formula would under-count")
        self.nbytes = int(round_up(int(nbytes), PAGE_BYTES))
        self.registered = False
        self._map: mmap.mmap | None = None
        self._ptr = 0
        if shim.is_tracing():
            from planner.runtime.trace import HOST

            self.tensor = torch.empty(self.nbytes, dtype=torch.uint8, device=HOST)
            return
        check_host_bytes("nbytes", self.nbytes)
        if self.nbytes == 0:
            self.tensor = torch.empty(0, dtype=torch.uint8)
        else:
            self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
            self._ptr = self.tensor.data_ptr()
            assert self._ptr % PAGE_BYTES == 0, "mmap memory must be page-aligned"
            if register is None:
                register = torch.cuda.is_available()
            if register:
                _cuda_register(self._ptr, self.nbytes)
                self.registered = True
        with _LOCK:
            _LIVE[id(self)] = self.nbytes

    def view(self, offset_bytes: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat ``dtype`` view of ``numel`` elements starting ``offset_bytes`` into the buffer."""
        size = dtype.itemsize
        end = offset_bytes + numel * size
        if offset_bytes % size or end > self.nbytes:
            raise ValueError(f"view [{offset_bytes}, {end}) of {dtype} does not fit the {self.nbytes}-byte buffer")
        return self.tensor[offset_bytes:end].view(dtype)

    def release(self) -> None:
        """Unregister and unmap (idempotent). Synchronise the streams that used it first."""
        with _LOCK:
            _LIVE.pop(id(self), None)
        if self.registered:
            _cuda_unregister(self._ptr)
            self.registered = False
        self.tensor = torch.empty(0, dtype=torch.uint8)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still exports the memory: the GC unmaps it with the view
                pass
            self._map = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> "PinnedBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
