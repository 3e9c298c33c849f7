"""One small shim through which every operator issues its streams and collectives (DESIGN §7).

- Under CUDA it hands out side streams and events and runs collectives asynchronously.
- In trace mode (``tracing()``, used by ``planner.runtime.trace``) and on the CPU it runs everything
  in program order with no streams: ``side_stream`` returns ``None`` and events are ``None``.
- Collectives are the ones that behave the same under gloo, NCCL and the fake process group:
  ``all_to_all_single`` with uneven splits, ``isend``/``irecv`` through ``batch_isend_irecv``,
  ``all_reduce``, and the reduce-scatter / all-gather under whichever name the installed torch has
  (2.13 renames ``reduce_scatter_tensor`` → ``reduce_scatter_single`` and
  ``all_gather_into_tensor`` → ``all_gather_single`` with a deprecation warning).
- Scalars that must be agreed across ranks (``N_max``, ``K``) go through ``global_max``: in trace
  mode ``.item()`` is impossible on fake tensors, so the caller passes the value the real-valued
  plan already knows.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

_TRACING = [False]


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """Trace mode: everything in order, no streams, no ``.item()``."""
    prev = _TRACING[0]
    _TRACING[0] = True
    try:
        yield
    finally:
        _TRACING[0] = prev


def is_tracing() -> bool:
    """Whether the shim runs in trace mode."""
    return _TRACING[0]


def use_streams(device: torch.device | str) -> bool:
    """Streams and events are used only for real CUDA execution outside trace mode."""
    return (not is_tracing()) and torch.device(device).type == "cuda" and torch.cuda.is_available()


def side_stream(device: torch.device | str) -> "torch.cuda.Stream | None":
    """A new side stream on ``device``, or ``None`` when running in order."""
    return torch.cuda.Stream(device=device) if use_streams(device) else None


@contextlib.contextmanager
def on_stream(stream: "torch.cuda.Stream | None") -> Iterator[None]:
    """Run the block on ``stream``; a no-op for ``None``."""
    if stream is None:
        yield
    else:
        with torch.cuda.stream(stream):
            yield


def record(stream: "torch.cuda.Stream | None" = None, device: torch.device | str = "cuda"):
    """Record an event on ``stream`` (the current stream when ``None``); ``None`` when in order."""
    if not use_streams(device):
        return None
    ev = torch.cuda.Event()
    ev.record(stream if stream is not None else torch.cuda.current_stream(device))
    return ev


def wait(event, stream: "torch.cuda.Stream | None" = None) -> None:
    """Make ``stream`` (current when ``None``) wait for ``event``; no-op for ``None``."""
    if event is None:
        return
    (stream if stream is not None else torch.cuda.current_stream()).wait_event(event)


def keep_alive(t: torch.Tensor, stream: "torch.cuda.Stream | None") -> None:
    """Tell the caching allocator that ``t`` is used on ``stream`` (``record_stream``)."""
    if stream is not None and t.is_cuda:
        t.record_stream(stream)


# ---------------------------------------------------------------------------------------------
# collectives
# ---------------------------------------------------------------------------------------------
def group_size(group=None) -> int:
    """Ranks in ``group`` (1 when torch.distributed is not initialised)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group=None) -> int:
    """This rank's index in ``group`` (0 when torch.distributed is not initialised)."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def global_rank(group, group_rank_: int) -> int:
    """Global rank of ``group_rank_`` in ``group``."""
    if not dist.is_initialized():
        return group_rank_
    return dist.get_global_rank(group, group_rank_) if group is not None else group_rank_


def all_to_all_single(out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int] | None,
                      in_splits: Sequence[int] | None, group=None, async_op: bool = False):
    """Uneven all-to-all along dim 0 (``out_splits[j]`` rows arrive from rank ``j``)."""
    if group_size(group) == 1:
        out.copy_(inp)
        return None
    return dist.all_to_all_single(out, inp, list(out_splits) if out_splits is not None else None,
                                  list(in_splits) if in_splits is not None else None,
                                  group=group, async_op=async_op)


def all_reduce(t: torch.Tensor, op: str = "sum", group=None, async_op: bool = False):
    """In-place all-reduce with ``op`` in {sum, max, min}."""
    if group_size(group) == 1:
        return None
    rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    return dist.all_reduce(t, op=rop, group=group, async_op=async_op)


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group=None, async_op: bool = False):
    """Sum-reduce-scatter of ``inp`` (``size·out`` rows) into ``out``, under either torch name."""
    if group_size(group) == 1:
        out.copy_(inp)
        return None
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def all_gather(out: torch.Tensor, inp: torch.Tensor, group=None, async_op: bool = False):
    """All-gather of equal ``inp`` into ``out`` (``size·inp`` rows), under either torch name."""
    if group_size(group) == 1:
        out.copy_(inp)
        return None
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def send_recv(send: Sequence[tuple[torch.Tensor, int]], recv: Sequence[tuple[torch.Tensor, int]],
              group=None) -> list:
    """Post ``(tensor, group_peer)`` sends and receives together (``batch_isend_irecv``).

    Returns the requests; ``wait_all`` them before touching the receive buffers.
    """
    ops = [dist.P2POp(dist.isend, t, global_rank(group, p), group) for t, p in send]
    ops += [dist.P2POp(dist.irecv, t, global_rank(group, p), group) for t, p in recv]
    return dist.batch_isend_irecv(ops) if ops else []


def wait_all(works) -> None:
    """Wait for async work handles (``None`` entries are skipped)."""
    if works is None:
        return
    if not isinstance(works, (list, tuple)):
        works = [works]
    for w in works:
        if w is not None:
            w.wait()


def global_max(value: int, group=None, known: int | None = None, device="cpu") -> int:
    """All-reduce-max an integer across ``group``.

    In trace mode the tensors are fake, so the caller passes ``known``: the value the real-valued
    plan computed from every rank's inputs. Raises ``ValueError`` if it is missing there.
    """
    if is_tracing():
        if known is None:
            raise ValueError("global_max needs the plan's value (known=...) in trace mode")
        return int(known)
    if group_size(group) == 1:
        return int(value)
    dev = device
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([int(value)], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())
