"""The operators' entry points refuse malformed constructor and call arguments with a ``ValueError``
that names the argument (no ZeroDivisionError, raw torch error or deep matmul error), and the
planner's ``InvalidPlan`` is a ``ValueError`` too. CPU, one process (``group=None``)."""

from __future__ import annotations

import math

import pytest
import torch

from planner import cli
from planner.errors import InvalidPlan, UnwritableOutput
from planner.runtime.expert_mlp import ExpertShard
from planner.runtime.llep import LLEP
from planner.runtime import shim
from planner.runtime.pipelined_llep import PipelinedLLEP
from planner.runtime.ring_dtp import RingDTPHead
from planner.runtime.sco import SCO
from planner.runtime.validation import host_ram_bytes

E, K, H, I, N, V = 4, 2, 6, 5, 7, 50
CLEAN_EXIT = 2


def _sco(**kw):
    args = dict(num_boundaries=2, boundary_shape=(4, 4), dtype=torch.float32, device="cpu",
                host_budget_bytes=1 << 20)
    args.update(kw)
    return SCO(**args)


CONSTRUCTORS = {
    "ring_hidden_0": (lambda: RingDTPHead(0, V), "hidden_size"),
    "ring_vocab_0": (lambda: RingDTPHead(H, 0), "vocab_size"),
    "ring_device_xyz": (lambda: RingDTPHead(H, V, device="xyz"), "device"),
    "ring_device_tpu": (lambda: RingDTPHead(H, V, device="tpu"), "device"),
    "ring_dtype_int": (lambda: RingDTPHead(H, V, dtype=torch.int32), "dtype"),
    "shard_negative": (lambda: ExpertShard(-1, 16, 8), "num_local"),
    "shard_zero": (lambda: ExpertShard(0, 16, 8), "num_local"),
    "shard_ffn_zero": (lambda: ExpertShard(2, 16, 0), "expert_ffn"),
    "shard_first_expert": (lambda: ExpertShard(2, 16, 8, first_expert=-1), "first_expert"),
    "shard_device": (lambda: ExpertShard(2, 16, 8, device="tpu"), "device"),
    "sco_dtype_name": (lambda: _sco(dtype="bfloat17"), "dtype"),
    "sco_dtype_bool": (lambda: _sco(dtype=torch.bool), "dtype"),
    "sco_device_xyz": (lambda: _sco(device="xyz"), "device"),
    "sco_device_tpu": (lambda: _sco(device="tpu"), "device"),
    "sco_device_meta": (lambda: _sco(device="meta"), r"device \('meta'\) holds no data.*fix: pass the device"),
    "sco_budget_inf": (lambda: _sco(host_budget_bytes=math.inf),
                       r"host_budget_bytes \(inf\) must be a finite number >= 0; fix: 8192 bytes"),
    "sco_register_str": (lambda: _sco(register="yes"), r"register \('yes'\) must be True, False or None"),
}


@pytest.mark.parametrize("case", list(CONSTRUCTORS))
def test_constructors_refuse_bad_arguments(case):
    make, name = CONSTRUCTORS[case]
    with pytest.raises(ValueError, match=name):
        make()


def test_sco_maps_dtype_strings():
    assert _sco(dtype="bf16").dtype == torch.bfloat16
    assert _sco(dtype="fp32").dtype == torch.float32


def test_sco_budget_beyond_host_ram_is_refused_before_allocating():
    ram = host_ram_bytes()
    assert ram is not None and ram > 0
    slot = 1 << 20                                            # 4 Ki × 64 fp32 = 1 MiB per boundary
    n = ram // slot + 2                                       # the boundaries need more than the RAM
    with pytest.raises(ValueError, match="RAM"):
        _sco(num_boundaries=n, boundary_shape=(1 << 12, 64), host_budget_bytes=n * slot)


def test_sco_region_index_must_be_an_int():
    s = _sco()
    h = torch.randn(4, 4)
    for bad in (1.0, True, 0, 3):
        with pytest.raises(ValueError, match="region index"):
            s.region(bad, lambda t: t * 2, h)
    assert torch.equal(s.region(1, lambda t: t * 2, h), h * 2)
    s.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="register=True pins where CUDA is available")
def test_register_without_cuda_is_refused_at_construction():
    from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
    from planner.runtime.offload_adamw import OffloadStreamAdamW
    from planner.runtime.pinned import PinnedBuffer

    want = r"register \(True\) needs CUDA \(cudaHostRegister\), which is not available here; fix: pass register=None"
    with pytest.raises(InvalidPlan, match=want):
        _sco(register=True)
    with pytest.raises(InvalidPlan, match=want):
        OffloadStreamAdamW([torch.nn.Parameter(torch.zeros(40))], bucket_params=64, register=True)
    with pytest.raises(InvalidPlan, match=want):
        CPUOffloadAdamW([torch.nn.Parameter(torch.zeros(40))], register=True)
    with pytest.raises(InvalidPlan, match=want):
        PinnedBuffer(4096, register=True)


def test_sco_region_refuses_a_non_tensor_and_a_boundary_on_another_device():
    s = _sco()
    with pytest.raises(InvalidPlan, match=r"h \(3.0\) must be a torch.Tensor .*; fix: pass the boundary tensor"):
        s.region(1, lambda t: t, 3.0)
    s.close()
    with shim.tracing():                          # the only other device a CPU host has
        s = _sco(device="meta")
    with pytest.raises(ValueError, match=r"boundary 1 \(\(4, 4\), torch.float32, cpu\) must be a contiguous "
                                         r"\(4, 4\) torch.float32 tensor on meta to be offloaded"):
        s.region(1, lambda t: t * 2, torch.randn(4, 4, requires_grad=True))
    s.close()


def test_sco_region_refuses_a_meta_input():
    s = _sco()
    with pytest.raises(ValueError, match="meta"):
        s.region(1, lambda t: t * 2, torch.empty(4, 4, device="meta"))
    s.close()


def test_ring_head_n_max_must_cover_the_local_rows():
    head = RingDTPHead(H, V)
    x, t = torch.randn(N, H), torch.randint(0, V, (N,))
    for bad in (-1, N - 1, 2.5):
        with pytest.raises(ValueError, match="n_max"):
            head(x, t, n_max=bad)
    assert torch.allclose(head(x, t, n_max=N), head(x, t))


def test_ring_head_refuses_meta_inputs():
    head = RingDTPHead(H, V)
    with pytest.raises(ValueError, match="meta"):
        head(torch.empty(N, H, device="meta"), torch.randint(0, V, (N,)))


@pytest.mark.parametrize("cls", [LLEP, PipelinedLLEP])
def test_dispatch_refuses_activations_of_another_dtype_than_the_experts(cls):
    op = cls(ExpertShard(E, H, I, dtype=torch.float32), E, K, None, min_tokens=1)
    ids, w = torch.randint(0, E, (N, K)), torch.rand(N, K)
    with pytest.raises(ValueError, match="dtype"):
        op(torch.randn(N, H, dtype=torch.bfloat16), ids, w)
    with pytest.raises(ValueError, match="meta"):
        op(torch.empty(N, H, device="meta"), ids, w)
    assert op(torch.randn(N, H), ids, w).shape == (N, H)


def test_invalid_plan_is_a_value_error_and_the_cli_still_exits_2(capsys):
    assert issubclass(InvalidPlan, ValueError) and issubclass(UnwritableOutput, ValueError)
    assert issubclass(UnwritableOutput, OSError)
    code = cli.main(["check", "gpt-oss-20b", "--gpus", "8", "--seq-len", "32k", "--max-imports", "100000"])
    err = capsys.readouterr().err
    assert code == CLEAN_EXIT and err.startswith("error: ") and "Traceback" not in err, err


def test_schema_objects_raise_the_planners_own_error_not_pydantics():
    """``InvalidPlan`` is a ``ValueError``, which pydantic would fold into a ``ValidationError``
    (a traceback at the CLI, exit 3): constructing a schema object raises the one-line error."""
    from planner.schema import Plan

    with pytest.raises(InvalidPlan, match="plan.routing"):
        Plan(world_size=8, routing="0/16")
    with pytest.raises(InvalidPlan, match="plan.routing"):
        Plan.model_validate({"world_size": 8, "routing": "0/16"})
