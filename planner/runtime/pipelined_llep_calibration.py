"""The chunk-count calibration hook of PipelinedLLEP (``calibration/chunks.py`` loads it by name).

It builds the operator through ``planner.runtime.dispatch_trace`` (the traced-layer builder), which
imports the operator; kept out of ``pipelined_llep.py`` so that the operator does not import its own
harness.
"""

from __future__ import annotations

from planner.runtime import shim
from planner.runtime.dispatch_trace import DispatchShape, build_layer
from planner.units import ceil_div


def calibration_case(num_chunks: int, *, smoke: bool, device):
    """Hook of ``calibration/chunks.py``: one forward+backward of PipelinedLLEP with
    ``K = num_chunks`` on the current process group (or one rank), balanced routing.

    Shape per rank: reference shape A (``N=65536, H=7168, I=2048, E=128, k=8``; tiny under
    ``smoke``), ``E_p`` = the group size, ``c = ceil(N/K)``, ``K_max = max(K, 10)``. The plan comes
    from the real route counts (all-gather and all-reduce-max on the group). Returns
    ``(run, shape)``.
    """
    world = shim.group_size(None)
    dims = dict(N=512, H=64, I=32, E=16, k=4) if smoke else dict(N=65536, H=7168, I=2048, E=128, k=8)
    s = DispatchShape(**dims, E_p=world, c=ceil_div(dims["N"], num_chunks), K_max=max(num_chunks, 10),
                      m=8 if smoke else 1024)
    _, run = build_layer("pipelined_llep", s, None, "balanced", device=device, init=True)
    shape = dict(tokens_per_rank=s.N, hidden_size=s.H, expert_ffn=s.I, num_experts=s.E, top_k=s.k,
                 expert_parallel=world)
    return (lambda: run()), shape
