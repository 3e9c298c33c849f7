"""Every bad constructor argument of the operators' Python API raises a ``ValueError`` whose message
names the argument (and repeats its value), at construction, before anything is allocated: no
``RuntimeError`` of an overflowed storage size, ``MemoryError``, ``TypeError``, ``IndexError``,
``AssertionError`` or ``AttributeError``, and no silent truncation (``1.5`` slots) or acceptance
(``lr = inf``). CPU, one process (``group=None``)."""

from __future__ import annotations

import math

import pytest
import torch

from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
from planner.runtime.expert_mlp import ExpertShard
from planner.runtime.expert_parallel import ExpertParallel
from planner.runtime.llep import LLEP
from planner.runtime.master_adamw import MasterAdamW
from planner.runtime.offload_adamw import OffloadStreamAdamW
from planner.runtime.pinned import PinnedBuffer
from planner.runtime.pipelined_llep import PipelinedLLEP
from planner.runtime.pipelined_llep_source import PipelinedLLEPSource, pipelined_llep
from planner.runtime.ring_dtp import RingDTPHead
from planner.runtime.sco import SCO
from planner.schema.knobs import default as knob_default

E, K, H, I, N, V = 4, 2, 6, 5, 7, 50
RTOL, ATOL = 1e-5, 1e-5
"""fp32: the two variants run the same expert kernels per chunk (summation order may differ)."""
HUGE = 2 ** 40
"""A width whose square overflows torch's int64 storage size."""


def _shard(**kw):
    return ExpertShard(E, H, I, dtype=torch.float32, **kw)


def _sco(**kw):
    args = dict(num_boundaries=2, boundary_shape=(4, 4), dtype=torch.float32, device="cpu",
                host_budget_bytes=1 << 20)
    args.update(kw)
    return SCO(**args)


def _adamw(cls=OffloadStreamAdamW, params=None, **kw):
    params = params if params is not None else [torch.nn.Parameter(torch.zeros(32))]
    if cls is OffloadStreamAdamW:
        kw.setdefault("bucket_params", 64)
    opt = cls(params, register=False, **kw)
    opt.close()
    return opt


BAD = {
    # Ring-DTP: sizes beyond torch's storage limit or the host's RAM, choices checked at construction
    "ring_overflow": (lambda: RingDTPHead(hidden_size=HUGE, vocab_size=HUGE), "hidden_size"),
    "ring_beyond_ram": (lambda: RingDTPHead(hidden_size=1 << 20, vocab_size=1 << 20), "vocab_size"),
    "ring_reduction": (lambda: RingDTPHead(H, V, reduction="avg"), "reduction"),
    "ring_mode": (lambda: RingDTPHead(H, V, mode="xyz"), "mode"),
    "ring_ignore_index": (lambda: RingDTPHead(H, V, ignore_index=1.5), "ignore_index"),
    # dispatch operators
    "pllep_not_a_shard": (lambda: PipelinedLLEP(torch.nn.Linear(2, 2), E, K), "shard"),
    "pllep_membership": (lambda: PipelinedLLEP(_shard(), E, K, membership="bogus"), "membership"),
    "pllep_residue": (lambda: PipelinedLLEP(_shard(), E, K, residue="bogus"), "residue"),
    "pllep_residue_other_variant": (lambda: PipelinedLLEP(_shard(), E, K, residue="source"), "residue"),
    "source_residue_other_variant": (lambda: PipelinedLLEPSource(_shard(), E, K, residue="destination"),
                                     "residue"),
    "factory_residue": (lambda: pipelined_llep(_shard(), E, K, residue="bogus"), "residue"),
    "ep_first_expert": (lambda: ExpertParallel(_shard(first_expert=4), E, K), "first_expert"),
    "shard_overflow": (lambda: ExpertShard(HUGE, HUGE, 2), "num_local"),
    # SCO
    "sco_shape_int": (lambda: _sco(boundary_shape=8), "boundary_shape"),
    "sco_shape_str": (lambda: _sco(boundary_shape="ab"), "boundary_shape"),
    "sco_shape_overflow": (lambda: _sco(boundary_shape=(HUGE, HUGE)), "boundary_shape"),
    "sco_boundaries_huge": (lambda: _sco(num_boundaries=HUGE), "num_boundaries"),
    # offloaded AdamWs
    "adamw_betas_one": (lambda: _adamw(betas=(0.9,)), "betas"),
    "adamw_betas_str": (lambda: _adamw(betas="ab"), "betas"),
    "adamw_slots_str": (lambda: _adamw(staging_slots="2"), "staging_slots"),
    "adamw_slots_nan": (lambda: _adamw(staging_slots=math.nan), "staging_slots"),
    "adamw_slots_float": (lambda: _adamw(staging_slots=1.5), "staging_slots"),
    "adamw_slots_many": (lambda: _adamw(staging_slots=10 ** 6), "staging_slots"),
    "adamw_bucket_nan": (lambda: _adamw(bucket_params=math.nan), "bucket_params"),
    "adamw_bucket_float": (lambda: _adamw(bucket_params=2.5), "bucket_params"),
    "adamw_bucket_small": (lambda: _adamw(bucket_params=8), "bucket_params"),
    "adamw_lr_inf": (lambda: _adamw(lr=math.inf), "lr"),
    "adamw_eps_inf": (lambda: _adamw(eps=math.inf), "eps"),
    "adamw_wd_inf": (lambda: _adamw(weight_decay=math.inf), "weight_decay"),
    "adamw_lr_str": (lambda: _adamw(lr="0.1"), "lr"),
    "adamw_meta": (lambda: _adamw(params=[torch.nn.Parameter(torch.zeros(32, device="meta"))]), "params"),
    "cpu_adamw_betas_one": (lambda: _adamw(CPUOffloadAdamW, betas=(0.9,)), "betas"),
    "cpu_adamw_lr_inf": (lambda: _adamw(CPUOffloadAdamW, lr=math.inf), "lr"),
    "cpu_adamw_meta": (lambda: _adamw(CPUOffloadAdamW, params=[torch.nn.Parameter(torch.zeros(32, device="meta"))]),
                       "params"),
    "master_adamw_betas_one": (lambda: MasterAdamW([torch.nn.Parameter(torch.zeros(3))], betas=(0.9,)), "betas"),
    "master_adamw_lr_inf": (lambda: MasterAdamW([torch.nn.Parameter(torch.zeros(3))], lr=math.inf), "lr"),
    # pinned host memory
    "pinned_nan": (lambda: PinnedBuffer(math.nan, register=False), "nbytes"),
    "pinned_float": (lambda: PinnedBuffer(1.5, register=False), "nbytes"),
    "pinned_beyond_ram": (lambda: PinnedBuffer(1 << 62, register=False), "nbytes"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_argument_raises_a_value_error_naming_it(case):
    make, name = BAD[case]
    with pytest.raises(ValueError, match=name) as err:
        make()
    assert "\n" not in str(err.value)


def test_string_values_are_repeated_in_the_message():
    with pytest.raises(ValueError, match=r"reduction \('avg'\)"):
        RingDTPHead(H, V, reduction="avg")
    with pytest.raises(ValueError, match=r"staging_slots \(1\.5\)"):
        _adamw(staging_slots=1.5)


def test_the_factory_builds_the_variant_the_plan_knob_names_by_default():
    default = knob_default("dispatch_residue")
    shard = _shard()
    op = pipelined_llep(shard, E, K, min_tokens=1)
    assert op.knobs["residue"] == default and op.residue == default
    assert isinstance(op, PipelinedLLEPSource if default == "source" else PipelinedLLEP)
    dest = pipelined_llep(shard, E, K, residue="destination", min_tokens=1)
    assert type(dest) is PipelinedLLEP and dest.knobs["residue"] == "destination"
    x, ids, w = torch.randn(N, H), torch.randint(0, E, (N, K)), torch.rand(N, K)
    with torch.no_grad():                      # the same function of the same shard, other residue
        torch.testing.assert_close(op(x, ids, w), dest(x, ids, w), rtol=RTOL, atol=ATOL)


def test_first_expert_is_set_by_the_operator_and_a_matching_value_is_accepted():
    shard = _shard()
    ExpertParallel(shard, E, K)
    assert shard.first_expert == 0
    ExpertParallel(_shard(first_expert=0), E, K)


@pytest.fixture
def two_ranks():
    """A fake process group of two ranks (constructors only: no collective runs)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("cls", [LLEP, PipelinedLLEP, PipelinedLLEPSource])
def test_max_imports_above_e_minus_e_over_w_is_refused(two_ranks, cls):
    bound = E - E // 2
    with pytest.raises(ValueError, match=rf"max_imports \(100\).*= {bound}"):
        cls(ExpertShard(E // 2, H, I, dtype=torch.float32), E, K, max_imports=100)
    assert cls(ExpertShard(E // 2, H, I, dtype=torch.float32), E, K, max_imports=bound).knobs["max_imports"] == bound
    default = knob_default("max_imports")
    assert default > bound                                     # the default is lowered, as the planner does
    assert cls(ExpertShard(E // 2, H, I, dtype=torch.float32), E, K).knobs["max_imports"] == bound


def test_first_expert_must_be_where_the_operator_puts_the_shard(two_ranks):
    n = E // 2
    with pytest.raises(ValueError, match=rf"first_expert \(0\).*= {n}"):
        ExpertParallel(ExpertShard(n, H, I, dtype=torch.float32, first_expert=0), E, K)
    shard = ExpertShard(n, H, I, dtype=torch.float32)
    ExpertParallel(shard, E, K)
    assert shard.first_expert == n                            # rank 1 holds experts n … 2n − 1


def test_max_imports_is_inert_on_one_rank_as_in_the_planner():
    assert LLEP(_shard(), E, K, max_imports=100).knobs["max_imports"] == 100


def test_valid_arguments_still_construct():
    assert RingDTPHead(H, V, reduction="sum", mode="weights").weight.shape == (V, H)
    s = _sco(boundary_shape=[4, 4])
    assert s.shape == (4, 4)
    s.close()
    assert _adamw(staging_slots=3, lr=torch.tensor(1e-3)).staging_slots == 3


def test_trace_step_refuses_what_is_not_a_plan_file():
    from planner.runtime.step_trace import trace_step

    with pytest.raises(ValueError, match="planfile"):
        trace_step(42)
    with pytest.raises(ValueError, match="num_layers"):
        trace_step(_tiny_planfile(), num_layers=0)


def _tiny_planfile():
    from planner.runtime.step_trace import trace_planfile

    return trace_planfile("gpt-oss-20b", world_size=8, seq_len=1 << 12)


def test_a_negative_expert_id_is_named():
    from planner.runtime.routing import local_counts

    with pytest.raises(ValueError, match="ids_Nk must lie in \\[0, 4\\): found a negative id"):
        local_counts(torch.tensor([[0], [-1]]), 4)
    with pytest.raises(ValueError, match="found 5"):
        local_counts(torch.tensor([[0], [5]]), 4)
