"""PipelinedLLEP chunk-count curve: step time against the chunk count ``K`` (DESIGN §4).

The operator lives in ``planner/runtime/pipelined_llep.py``; its hook in
``planner/runtime/pipelined_llep_calibration.py``, imported lazily here. The
hook it must offer::

    calibration_case(num_chunks: int, *, smoke: bool, device: torch.device)
        -> tuple[Callable[[], None], dict[str, int]]

returning a closure that runs one forward + backward of PipelinedLLEP at a fixed representative
shape with ``K = num_chunks`` on the current process group, and the shape it used
(``tokens_per_rank, hidden_size, expert_ffn, num_experts, top_k, expert_parallel``). It may also
offer ``emulation(device)``, a context the runs happen in: on one GPU, rank 0 of ``E_p = 8`` under
the fake process group with filled all-to-all outputs (``pipelined_llep_calibration``), so that the
curve is measured where the search's PipelinedLLEP plans run (GPU-bound chunk loops).
Until the module and the hook exist, the curve is skipped with a message saying which is missing.

Measured ``K`` values: 1, 2, 3, 5, 10, 20 (1, 2 under ``--smoke``). Emulated runs have no
communication to hide; the curve's note says how it ran.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from planner.runtime.measure import time_rep
from planner.timing.curves import ChunkCurve

CHUNK_COUNTS = (1, 2, 3, 5, 10, 20)
SMOKE_CHUNK_COUNTS = (1, 2)
MODULE = "planner.runtime.pipelined_llep_calibration"
HOOK = "calibration_case"
EMULATION = "emulation"
"""Optional context of the operator module the runs happen in (``emulation(device)``)."""


class Skipped(Exception):
    """The curve cannot be measured yet; the message says why."""


def load_hook():
    """The ``calibration_case`` hook of PipelinedLLEP.

    Raises:
        Skipped: the module is missing, fails to import, or has no hook.
    """
    try:
        mod = importlib.import_module(MODULE)
    except ModuleNotFoundError as err:
        if err.name == MODULE:
            raise Skipped(f"{MODULE} is not there yet ({MODULE.replace('.', '/')}.py); "
                          "chunk-count curve skipped") from None
        raise Skipped(f"{MODULE} cannot be imported ({err}); chunk-count curve skipped") from None
    except Exception as err:  # noqa: BLE001 - a half-written module must not stop calibration
        raise Skipped(f"{MODULE} fails to import ({type(err).__name__}: {err}); chunk-count curve skipped") from None
    hook = getattr(mod, HOOK, None)
    if hook is None:
        raise Skipped(f"{MODULE} has no {HOOK}(num_chunks, *, smoke, device) hook yet; chunk-count curve skipped")
    return hook


def chunk_curve(*, smoke: bool, device: torch.device, prov: dict, tick: Callable[[int], None],
                min_time_s: float = 1e-3, iters: int = 3) -> ChunkCurve:
    """Measure the chunk-count curve (raises ``Skipped`` when PipelinedLLEP is not available).

    The runs happen inside the operator module's ``emulation(device)`` context where it has one
    (on one GPU: rank 0 of several expert-parallel ranks under the fake process group)."""
    import contextlib

    import torch.distributed as dist

    hook = load_hook()
    emulation = getattr(importlib.import_module(MODULE), EMULATION, None)
    ks = SMOKE_CHUNK_COUNTS if smoke else CHUNK_COUNTS
    times, fills, shape = [], [], {}
    with (emulation(device) if emulation is not None else contextlib.nullcontext()) as filler:
        for k in ks:
            fn, shape = hook(k, smoke=smoke, device=device)
            if filler is not None:                # one call's fill bytes (the call warms up too)
                filler.nbytes = 0
                fn()
                fills.append(float(filler.nbytes))
            times.append(time_rep(fn, min_time_s=min_time_s, iters=iters, device=device))
            fn = None  # noqa: F841 - drop the layer before the next K builds its own
            if device.type == "cuda":
                torch.cuda.empty_cache()
            tick(1)
        world = dist.get_world_size() if dist.is_initialized() else 1
        fake = dist.is_initialized() and dist.get_backend() == "fake"
    if fake:
        how = (f" on rank 0 of E_p = {world} emulated on one GPU (fake process group: no communication, "
               "every all-to-all output filled from random data)")
    elif world > 1:
        how = f" on {world} ranks"
    else:
        how = " on one rank (no communication to hide: single-rank emulation)"
    return ChunkCurve(num_chunks=list(ks), time_s=times, shape={k: int(v) for k, v in shape.items()},
                      fill_bytes=fills or None, provenance=prov, note="PipelinedLLEP forward+backward" + how)


def count(smoke: bool) -> int:
    """Progress units of the chunk-count section."""
    return len(SMOKE_CHUNK_COUNTS if smoke else CHUNK_COUNTS)
