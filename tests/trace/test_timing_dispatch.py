"""The dispatch kernel inventory (``planner/timing/dispatch_kernels.py``) against the runtime it
describes (formula vs trace, DESIGN §8).

The operators run on the CPU in bf16 at tiny awkward shapes, at ``E_p = 1`` (no process group:
the shim's all-to-alls are copies, as in the bench's real ``E_p = 1`` rows) and as each rank of
``E_p = 2`` under the fake process group (the bench's emulation; skewed routing, so LLEP's
exporter and importer paths run), under a ``TorchDispatchMode`` that sees every aten call the
runtime makes, forward and backward (dense output gradient). Per case and pass:

- **launches**: calls that launch a kernel (views and allocations excluded) equal the model's,
  less the host→device index copies, which are no-ops on the CPU (``send_order`` 2, EP's
  ``perm_Q``/``inv_Q`` 2, ``ExpertChunk``'s ``slot_index`` once per forward and twice per
  backward chunk);
- **GEMMs**: the multiset of ``torch.mm`` shapes equals the model's blocks (the plan's rows per
  slot and chunk, cut at ``block_rows``);
- **bytes**: memory-bound bytes by the rules of ``_bytes`` below (what each call reads and writes
  on the tensors it is given) equal the model's within ``BYTES_TOL``, **per kernel class** (``_classes``:
  the class each call is timed at, ``planner.timing.dispatch_kernels``); ``send_order``'s calls are
  excluded on both sides (the model's ``SEND_ORDER_BYTES`` is an approximate constant).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.distributed as dist
from synthetic_profiles import ADAMW_RATE, flat_cluster
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from planner.plans.llep import LlepKnobs
from planner.plans.routing import expert_ids, profile_counts
from planner.runtime import expert_parallel, pipelined_llep
from planner.runtime.dispatch_trace import OPERATORS
from planner.runtime.expert_mlp import ExpertShard
from planner.timing import dispatch_kernels as DK
from planner.timing.dispatch import plan_loads
from planner.timing.flops import expert_bwd, expert_fwd
from planner.timing.lookups import Lookups

BYTES_TOL = 0.01
"""Formula vs trace (DESIGN §8)."""
FREE = {"view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "slice", "select", "expand",
        "unsqueeze", "squeeze", "as_strided", "detach", "alias", "empty", "empty_like", "new_empty",
        "new_empty_strided", "empty_strided", "lift_fresh", "permute", "split", "unbind"}
"""aten calls that launch no kernel (views, allocations), and the fake process group's collectives
(no-ops; under NCCL their time is the communication model's)."""
COMM = {"alltoall_base_", "allgather_", "allreduce_", "send", "recv_"}
N, H, I, E, k, c, m = 50, 24, 12, 8, 3, 16, 4
KNOBS = LlepKnobs(1.0, m, 1.3, 4)


def _elems_bytes(t) -> int:
    """Bytes of the elements a tensor holds (stride-0 dimensions counted once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride else 1
    return n * t.element_size()


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _bytes(name: str, args, kwargs, out) -> int:
    """Bytes one call reads and writes: gathers read the rows they write; scatters read their
    source and read-modify-write the target rows; an out-of-place ``index_add`` first copies its
    target; ``copy_`` reads its source and writes as much; other calls read every input and write
    their output (in place: ``self``)."""
    if name == "index_select":
        return 2 * _elems_bytes(out) + _elems_bytes(args[2])
    if name in ("index_add_", "index_add"):
        copy = 2 * _elems_bytes(args[0]) if name == "index_add" else 0
        return copy + 3 * _elems_bytes(args[3]) + _elems_bytes(args[2])
    if name == "index_copy_":
        return 2 * _elems_bytes(args[3]) + _elems_bytes(args[2])
    if name in ("new_zeros", "zeros_like"):
        return _elems_bytes(out)
    if name == "copy_":
        return 2 * _elems_bytes(args[1])
    reads = sum(_elems_bytes(t) for t in _tensors(list(args) + [v for key, v in kwargs.items() if key != "out"]))
    if name.endswith("_"):
        return reads + _elems_bytes(args[0])
    return reads + sum(_elems_bytes(t) for t in _tensors(out))


ZERO = {"new_zeros", "zeros_like", "zero_", "fill_", "zeros"}
COPY = {"copy_", "_to_copy", "clone"}
SIMPLE = {"index_copy_": "index_copy", "silu": "silu", "silu_backward": "silu_bwd", "cat": "cat", "sum": "row_sum",
          "sort": "sort", "add": "add", "add_": "add", "sub": "add"}


def _classes(name: str, args, kwargs, out, tokens: set) -> dict:
    """``{kernel class: bytes}`` of one call (``planner.timing.dispatch_kernels``' docstring): gathers
    from the token tensor or its gradient (``tokens``: their data pointers) ``gather_dup``;
    ``index_add`` into token rows (``N``) ``index_add_bf16``, into other rows ``index_add_bf16_perm``,
    fp32 ``index_add_fp32``, its out-of-place copy ``copy``; products with a column-sliced operand
    (row stride ≠ width, also for one-row blocks) ``mul_strided``, broadcast products
    ``route_weight``, same-shape products ``add``."""
    nbytes = _bytes(name, args, kwargs, out)
    if name == "index_select":
        return {"gather_dup" if args[0].data_ptr() in tokens else "gather_perm": nbytes}
    if name in ("index_add_", "index_add"):
        tgt = args[0]
        copy = 2 * _elems_bytes(tgt) if name == "index_add" else 0
        cls = "index_add_fp32" if tgt.dtype == torch.float32 else \
            "index_add_bf16" if tgt.dim() == 2 and tgt.shape[0] == N else "index_add_bf16_perm"
        return {"copy": copy, cls: nbytes - copy}
    if name in ZERO:
        return {"zero": nbytes}
    if name in COPY:
        return {"copy": nbytes}
    if name == "mul":
        ts = [t for t in args if isinstance(t, torch.Tensor)]
        if any(t.dim() == 2 and t.stride() != (t.shape[1], 1) for t in ts):   # a column slice (gate/up half)
            return {"mul_strided": nbytes}
        return {"route_weight" if len({tuple(t.shape) for t in ts}) > 1 else "add": nbytes}
    return {SIMPLE.get(name, "other"): nbytes}


class Recorder(TorchDispatchMode):
    """Launching calls, their bytes (in all and by class) and the ``mm`` shapes; ``paused`` skips
    bytes (not launches). ``tokens``: data pointers of the token tensor and its gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.launches, self.nbytes, self.paused, self.mm = 0, 0, False, collections.Counter()
        self.by_class: collections.Counter = collections.Counter()
        self.tokens: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        if name in FREE or name in COMM or all(o.numel() == 0 for o in _tensors(out)):
            return out                                    # (zero elements: nothing is launched)
        self.launches += 1
        if name == "mm":
            a, b = args[0], args[1]
            self.mm[(a.shape[0], b.shape[1], a.shape[1])] += 1
        elif not self.paused:
            self.nbytes += _bytes(name, args, kwargs, out)
            self.by_class.update(_classes(name, args, kwargs, out, self.tokens))
        return out


def _run(op: str, profile: str, E_p: int, rank: int, monkeypatch):
    """Forward and backward recorders of ``op`` on ``profile`` as ``rank`` of ``E_p`` (``E_p > 1``:
    under the fake process group, as the bench's emulation), and the plan."""
    rec = {"fwd": Recorder(), "bwd": Recorder()}
    torch.manual_seed(0)
    for module in (expert_parallel, pipelined_llep):
        real = module.send_order

        def paused(*a, _real=real):
            rec["fwd"].paused = True
            try:
                return _real(*a)
            finally:
                rec["fwd"].paused = False
        monkeypatch.setattr(module, "send_order", paused)
    if E_p > 1:
        if dist.is_initialized():
            pytest.skip("a process group is already initialised in this process")
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=E_p)
    try:
        shard = ExpertShard(E // E_p, H, I, dtype=torch.bfloat16)
        shard.ensure_grads()
        mod = OPERATORS[op](shard, E, k, None, token_budget=c, max_chunks=10, alpha=KNOBS.alpha, min_tokens=m,
                            lam=KNOBS.lam, max_imports=KNOBS.max_imports)
        plan = mod.plan_from_counts(profile_counts(profile, N, E, k, E_p),
                                    mod._num_chunks(N) if op == "pipelined_llep" else None)
        x = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
        w = torch.rand(N, k, requires_grad=True)
        g = torch.randn(N, H, dtype=torch.bfloat16)
        for r in rec.values():
            r.tokens = {x.data_ptr(), g.data_ptr()}
        ids = torch.from_numpy(expert_ids(profile, N, E, k, E_p))
        with rec["fwd"]:
            out = mod(x, ids, w, plan=plan)
        with rec["bwd"]:
            out.backward(g)
    finally:
        if E_p > 1:
            dist.destroy_process_group()
    return rec, plan


def _model(op: str, profile: str, E_p: int, rank: int, K: int):
    """The model's raw ``(gemm s, bytes, launches)`` per pass and its GEMM shape multisets."""
    L = {key: v[rank] for key, v in plan_loads(op, N, E, k, E_p, K, profile, KNOBS).items()}
    lk = Lookups(flat_cluster(), strict=True)
    kw = dict(N=N, copies=E_p == 1, dense_grad=True, raw=True, X=L["imports"], X_e=L["exports"])
    if op == "pipelined_llep":
        raw = DK.pipelined(lk, H, I, 2, k, s=L["send"], q=L["recv"], rows=L["rows"], cnt=L["cnt"],
                           K=K, chunk_axis=True, **kw)
        passes = {"fwd": lambda r: expert_fwd(r, H, I),
                  "bwd": lambda r: expert_fwd(r, H, I) + expert_bwd(r, H, I)}
    else:
        raw = DK.unchunked(lk, H, I, 2, k, s=L["send"][0], q=L["recv"][0], rows=L["rows"][0],
                           cnt=L["cnt"][0], n_own=E // E_p, **kw)
        passes = {"fwd": lambda r: expert_fwd(r, H, I), "bwd": lambda r: expert_bwd(r, H, I)}
    mm = {}
    for p, gemms in passes.items():
        cnt = collections.Counter()
        for r, n in zip(L["rows"].reshape(-1).tolist(), L["cnt"].reshape(-1).tolist()):
            for gm in (gemms(int(r)) if r else []):
                cnt[(gm.m, gm.n, gm.k)] += int(n)
        mm[p] = cnt
    return raw, mm, L


CASES = [(op, prof, 1, 0) for op in ("ep", "llep", "pipelined_llep") for prof in ("balanced", "80/2")] + \
    [(op, "80/2", 2, r) for op in ("llep", "pipelined_llep") for r in (0, 1)]
"""``(operator, routing, E_p, rank)``: ``E_p = 2`` ranks 0 and 1 export and import hot experts."""


@pytest.mark.parametrize("op,profile,E_p,rank", CASES)
def test_inventory_matches_the_runtime(op, profile, E_p, rank, monkeypatch):
    rec, plan = _run(op, profile, E_p, rank, monkeypatch)
    K = plan.num_chunks
    raw, mm, L = _model(op, profile, E_p, rank, K)
    if E_p > 1:
        assert L["imports"] + L["exports"] > 0           # the LLEP weight transfer is exercised
    h2d = {"fwd": 2 + (K if op == "pipelined_llep" else 2), "bwd": 2 * K if op == "pipelined_llep" else 0}
    for p in ("fwd", "bwd"):
        assert rec[p].launches == raw[p][2] - h2d[p], (p, rec[p].launches, raw[p][2])
        assert rec[p].mm == mm[p], p
        by_class = {c: float(v) for c, v in raw[p][1].items()}
        if p == "fwd":                                    # send_order: excluded on both sides
            by_class["sort"] -= N * k * DK.SORT_BYTES
            by_class["other"] -= N * k * (DK.SEND_ORDER_BYTES - DK.SORT_BYTES)
        model_bytes = sum(by_class.values())
        assert rec[p].nbytes == pytest.approx(model_bytes, rel=BYTES_TOL), (p, rec[p].nbytes, model_bytes)
        got = {c: v for c, v in rec[p].by_class.items() if v}
        want = {c: v for c, v in by_class.items() if abs(v) > 1e-9}
        assert set(got) == set(want) and all(got[c] == pytest.approx(want[c], rel=BYTES_TOL) for c in want), \
            (p, sorted(got.items()), sorted(want.items()))
    if op == "pipelined_llep" and profile != "balanced":
        assert (L["cnt"] > 1).any()                       # hot slots run in several GEMM blocks


def test_flat_profile_reads_back_bytes_and_gemm_seconds():
    """On the flat profile the memory-bound seconds are the bytes at 28 B × the AdamW rate and no
    launch time is exposed (its GEMM table's floor is ~0)."""
    lk = Lookups(flat_cluster(), strict=True)
    L = plan_loads("ep", N, E, k, 1, 1, "balanced", KNOBS)
    args = dict(N=N, s=L["send"][0, 0], q=L["recv"][0, 0], rows=L["rows"][0, 0], cnt=L["cnt"][0, 0], n_own=E)
    t = DK.unchunked(lk, H, I, 2, k, **args)
    raw = DK.unchunked(lk, H, I, 2, k, raw=True, **args)
    for p in ("fwd", "bwd"):
        assert t[p][1] * 28 * ADAMW_RATE == pytest.approx(sum(raw[p][1].values()), rel=1e-12)
        assert t[p][2] == 0.0 and t[p][0] == raw[p][0]


def test_dispatch_kernels_microbenchmark_smoke(tmp_path):
    """``python3 -m calibration.dispatch_kernels --smoke`` runs every section on the CPU and records
    the provenance the held-out test needs (``host_instance``)."""
    import json

    from calibration import dispatch_kernels as bench

    assert bench.LAUNCHES == {"grouped_fwd": DK.LAUNCH["ep_fwd_block"], "grouped_bwd": DK.LAUNCH["ep_bwd_block"],
                              "chunk_fwd": DK.LAUNCH["pl_fwd_block"], "chunk_recompute": DK.LAUNCH["pl_up_block"],
                              "chunk_bwd": DK.LAUNCH["pl_bwd_block"]}
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "dispatch_kernels.json").read_text())
    assert doc["provenance"]["host_instance"] and doc["adamw_ref_bytes_per_s"] > 0
    assert all(r["seconds"] > 0 and r["model_bytes"] > 0 for r in doc["memory"])
    assert len(doc["gemm_layouts"]) == 6 * len(bench.SMOKE["rows"]) and doc["sustained"]["ratio"] > 0
    assert set(doc["host_blocks"]) == set(bench.LAUNCHES) | {"tiny_mm_floor"}
    assert (tmp_path / "dispatch_kernels.md").read_text().startswith("# Dispatch-kernel microbenchmarks")
    from calibration.io import read_yaml
    from planner.schema.curves import DISPATCH_KERNEL_CLASSES, DispatchKernelsCurve

    frag = read_yaml(tmp_path / "dispatch_kernels.yaml")
    cv = DispatchKernelsCurve.model_validate(frag["curves"]["dispatch_kernels"])
    assert set(cv.memory) == set(DISPATCH_KERNEL_CLASSES) and cv.provenance.host_instance
    assert {g.role for g in cv.gemm_layouts} == {"up", "down", "g_down", "gh", "g_up", "gx"}
