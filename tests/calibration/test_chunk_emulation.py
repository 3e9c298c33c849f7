"""The chunk-count curve measured on an emulated rank (``pipelined_llep_calibration.emulation``):
on one device, rank 0 of ``E_p = 8`` under the fake process group, every all-to-all output written
from random data (``planner.runtime.emulated_fill``), the fills' bytes recorded per ``K``."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from calibration import chunks
from planner.runtime import exchange
from planner.runtime import pipelined_llep_calibration as hook
from planner.runtime.emulated_fill import FilledAllToAll

CPU = torch.device("cpu")
PROV = {"device": "cpu", "date": "2026-12-06", "command": "pytest"}


def test_the_curve_runs_on_an_emulated_rank_and_records_its_fills():
    curve = chunks.chunk_curve(smoke=True, device=CPU, prov=PROV, tick=lambda n: None, min_time_s=1e-4, iters=1)
    assert curve.shape["expert_parallel"] == hook.EMULATED_EXPERT_PARALLEL
    assert curve.shape["tokens_per_rank"] == hook.SMOKE_DIMS["N"]
    assert "rank 0 of E_p = 8 emulated" in curve.note and "filled from random data" in curve.note
    # balanced routing: every K moves the same routes, so the same fill bytes; at least the
    # forward's dispatch and combine of the routes that other ranks send (N·k·7/8 rows of H bf16)
    d = hook.SMOKE_DIMS
    foreign_rows = d["N"] * d["k"] * (hook.EMULATED_EXPERT_PARALLEL - 1) // hook.EMULATED_EXPERT_PARALLEL
    assert curve.fill_bytes is not None and len(set(curve.fill_bytes)) == 1
    assert curve.fill_bytes[0] >= 2 * 2 * foreign_rows * d["H"] * 2
    assert not dist.is_initialized() and exchange.fake_fill is None, "the emulation is torn down"


def test_a_fill_writes_the_output_of_a_fake_all_to_all_only():
    with hook.emulation(CPU) as fill:
        assert isinstance(fill, FilledAllToAll) and dist.get_backend() == "fake"
        out = torch.zeros(6, 4, dtype=torch.bfloat16)
        exchange.a2a(out, torch.zeros(0, 4, dtype=torch.bfloat16), [6] + [0] * 7, [0] * 8)
        assert out.abs().sum() > 0 and fill.nbytes == 2 * out.numel() * 2
        with pytest.raises(RuntimeError, match="does not nest"):
            FilledAllToAll(CPU).__enter__()
    out = torch.zeros(3, 2)
    dist.init_process_group("fake", store=__import__("torch.testing._internal.distributed.fake_pg",
                                                     fromlist=["FakeStore"]).FakeStore(), rank=0, world_size=2)
    try:
        exchange.a2a(out, torch.zeros(0, 2), [3, 0], [0, 0])
        assert out.abs().sum() == 0, "outside the fill the fake all-to-all leaves its output unwritten"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3"])
def test_the_hook_rejects_a_bad_chunk_count(bad):
    with pytest.raises(ValueError, match="num_chunks"):
        hook.calibration_case(bad, smoke=True, device=CPU)


def test_the_fill_needs_a_torch_device():
    with pytest.raises(ValueError, match="torch.device"):
        FilledAllToAll("cuda")
