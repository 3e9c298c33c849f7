"""``planner validate`` on a CPU: truncation, the per-phase prediction under both gradient
lifetimes, the tolerance rule, the phase recorder, the exit code without a GPU, the bench's dry run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from planner.api import build_planfile
from planner.cli import main
from planner.runtime.phase_recorder import PhaseRecorder, TrackerSource
from planner.runtime.validate_compare import MEMORY_OVER, MEMORY_UNDER, compare, memory_ok, verdict
from planner.runtime.validate_plan import predict, truncate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    pf = build_planfile(model="deepseek-v2-lite", gpus=8, seq_len=16384)
    p = tmp_path_factory.mktemp("plans") / "dsv2.yaml"
    p.write_text(yaml.safe_dump(pf.model_dump(mode="json")))
    return p, pf


def test_truncation_keeps_widths_and_degrees(plan_path):
    _, pf = plan_path
    tr = truncate(pf, 2)
    m, mt = pf.model, tr.planfile.model
    assert mt.num_layers == 2 and mt.dense_layers == (0,)
    assert (mt.hidden_size, mt.num_experts, mt.vocab_size) == (m.hidden_size, m.num_experts, m.vocab_size)
    assert tr.planfile.plan == pf.plan and tr.planfile.workload == pf.workload
    assert any("num_layers 27 → 2" in c for c in tr.changes)
    pred = predict(tr.planfile, "freed", timing=False)
    assert pred.ctx.num_boundaries == 4 and pred.ctx.regions == ("attention", "dense_mlp", "attention", "moe")
    assert truncate(pf, None).changes == []


def test_freed_gradients_first_exist_in_their_backward(plan_path):
    """``freed``: no gradient in forward or at the head's peak, the head's from backward[L_b] on,
    region j's from backward[j],
    all of them by backward[1] but the embedding's; ``accumulate``: all of them everywhere."""
    tr = truncate(plan_path[1], 2)
    acc = predict(tr.planfile, "accumulate", timing=False)
    fr = predict(tr.planfile, "freed", timing=False)
    grads = ("dense grads (ZeRO-3 shard)", "expert grads (whole per shard)", "head grad (vocab shard)")
    full = acc.term_bytes("forward[1]", grads)
    assert full > 0 and all(acc.term_bytes(lbl, grads) == full for lbl in acc.labels)
    assert fr.term_bytes("forward[4]", grads) == 0
    seq = [fr.term_bytes(lbl, grads) for lbl in ("head", "backward[4]", "backward[3]", "backward[2]",
                                                 "backward[1]", "optimizer")]
    # the head's gradient is made after the head phase's peak: none there yet
    assert all(a <= b for a, b in zip(seq, seq[1:])) and 0 == seq[0] < seq[1] and seq[-1] == full
    # the embedding's gradient shard first exists in the embedding's backward, after region 1's
    from planner.budget.persistent import embedding_grad_shard
    emb = embedding_grad_shard(fr.ctx) * fr.ctx.act_bytes
    assert emb > 0 and seq[-2] == full - emb
    # region 4 (moe) brings its experts in backward[4]
    e = ("expert grads (whole per shard)",)
    assert fr.term_bytes("backward[4]", e) == fr.term_bytes("optimizer", e) > 0 == fr.term_bytes("head", e)


def test_tolerance_rule():
    assert memory_ok(int(1000 * (1 + MEMORY_OVER)), 1000) and not memory_ok(int(1000 * (1 + MEMORY_OVER)) + 1, 1000)
    assert memory_ok(int(1000 * (1 - MEMORY_UNDER)), 1000) and not memory_ok(int(1000 * (1 - MEMORY_UNDER)) - 1, 1000)


def _fake_samples(pred, scale: float):
    from planner.runtime.phase_recorder import PhaseSample

    out = {lbl: PhaseSample(lbl, 0, int(pred.phase_bytes(lbl) * scale)) for lbl in pred.labels}
    opt = out["optimizer"]
    opt.start_bytes = opt.peak_bytes - int(pred.live_set_bytes("optimizer", "optimizer_step") * scale)
    return out


def test_compare_judges_every_phase(plan_path):
    pred = predict(truncate(plan_path[1], 2).planfile, "freed", timing=False)
    # the step start holds the persistent state and the workspaces every phase keeps (cuBLAS)
    start = pred.live_set_bytes("forward[1]", "persistent") + pred.step_start_workspace_bytes()
    assert pred.step_start_workspace_bytes() > 0
    ok = compare(pred, _fake_samples(pred, 1.0), start)
    assert verdict(ok) and len([r for r in ok if r.what == "phase total"]) == len(pred.labels)
    # measured 3% above the formula: the formula is > 1% below the measurement
    assert not verdict(compare(pred, _fake_samples(pred, 1.03), start))
    missing = _fake_samples(pred, 1.0)
    missing.pop("head")
    assert not verdict(compare(pred, missing, start))


def test_phase_recorder_windows_under_fake_tensors():
    """Each window's peak is its own; the embedding's window (before the first call) is forward[1]'s."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    MiB = 2**20
    with FakeTensorMode():
        keep = torch.empty(MiB, dtype=torch.uint8)
        mt = MemTracker()
        mt.track_external(keep)
        with mt:
            rec = PhaseRecorder(TrackerSource(mt))
            rec.start()
            a = torch.empty(3 * MiB, dtype=torch.uint8)   # before forward[1]: counts in forward[1]
            del a
            rec("forward", 1)
            b = torch.empty(2 * MiB, dtype=torch.uint8)
            rec("head")
            c = torch.empty(5 * MiB, dtype=torch.uint8)
            del c
            rec("optimizer")
            out = rec.finish()
    assert out["forward[1]"].peak_bytes == 4 * MiB          # keep + a
    assert out["head"].start_bytes == 3 * MiB and out["head"].peak_bytes == 8 * MiB
    assert out["optimizer"].peak_bytes == 3 * MiB
    del b


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cli_without_gpu_exits_2(plan_path, capsys):
    assert main(["validate", str(plan_path[0]), "--layers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0] and "fix:" in err[0]


def test_cli_bad_layers_exits_2(plan_path, capsys):
    assert main(["validate", str(plan_path[0]), "--layers", "99"]) == 2
    assert "--layers (99)" in capsys.readouterr().err


def test_bench_dry_run(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "validate.py"), "--dry-run", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "validate.json").read_text())
    cases = doc["cases"]
    assert {c["model"] for c in cases} == {"gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v2-lite"}
    assert {c["W"] for c in cases} == {1, 8, 64} and {c["lifetime"] for c in cases} == {"freed", "accumulate"}
    assert all(c["predicted_peak_bytes"] <= c["capacity_bytes"] for c in cases)
    assert all((tmp_path / "plans" / Path(c["command"].split()[2]).name).exists() for c in cases)
    # every (model, W) at two context lengths or more, each under both lifetimes; real runs up to 65536
    for m in {c["model"] for c in cases}:
        for W in (1, 8, 64):
            seqs = {c["S"] for c in cases if c["model"] == m and c["W"] == W}
            assert len(seqs) >= 2, (m, W, seqs)
            for S in seqs:
                assert {c["lifetime"] for c in cases if (c["model"], c["W"], c["S"]) == (m, W, S)} == {
                    "freed", "accumulate"}
    assert max(c["S"] for c in cases if c["W"] == 1) <= 65536
    assert all("--steps 2" in c["command"] for c in cases)


@pytest.mark.parametrize("residue,cls_name", [("source", "PipelinedLLEPSource"), ("destination", "PipelinedLLEP")])
def test_composed_step_runs_the_planned_pipelined_variant(residue, cls_name):
    """The composed step's PipelinedLLEP is the variant ``dispatch_residue`` names, the one the budget
    counts (``planner.budget.dispatch``: ``pipelined_llep_source`` for ``source``)."""
    from types import SimpleNamespace

    from planner.runtime.mop import _dispatcher
    from planner.schema import ComposedKnobs
    from tests.conftest import tiny_moe

    knobs = ComposedKnobs(dispatch="pipelined_llep", dispatch_residue=residue)
    make = _dispatcher("pipelined_llep", tiny_moe(), SimpleNamespace(expert=None), knobs, torch.device("meta"),
                       torch.bfloat16)
    assert type(make(0)).__name__ == cls_name


@pytest.mark.parametrize("stack,knob,want", [("fsdp2", "accumulate", "accumulate"), ("fsdp2", "freed", "freed"),
                                             ("composed", None, "freed")])
def test_default_gradient_lifetime_is_the_plans(stack, knob, want):
    """Without ``--grad-lifetime`` an FSDP2 plan runs (and is predicted) with its own
    ``baseline.grad_lifetime``; the composed stack with freed gradients, as ``planner.train`` runs it."""
    from planner.runtime import validate as v

    ov = {"stack": "fsdp2", "grad_lifetime": knob} if stack == "fsdp2" else None
    pf = build_planfile(model="qwen3-30b-a3b", gpus=8, seq_len=8192, overrides=ov)
    assert v.plan_grad_lifetime(pf) == want
    seen = {}

    def fake_measure(planfile, ctx, *, rank, steps, grad_lifetime):
        seen.update(lifetime=grad_lifetime, ctx=ctx.grad_lifetime)
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        v.validate(pf, layers=2, measure_fn=fake_measure)
    assert seen == {"lifetime": want, "ctx": want}
    with pytest.raises(RuntimeError, match="stop"):
        v.validate(pf, layers=2, grad_lifetime="accumulate", measure_fn=fake_measure)
    assert seen["lifetime"] == "accumulate"


def _measured_as_predicted(device: str, step_factor: float):
    """A fake real run on ``device`` whose every phase is the prediction's and whose step took
    ``step_factor`` × the predicted time."""
    from planner.budget.fsdp2_boundaries import INPUT_BATCH
    from planner.runtime import validate as v
    from planner.runtime.phase_recorder import PhaseSample

    def fake_measure(planfile, ctx, *, rank, steps, grad_lifetime):
        pred = predict(planfile, grad_lifetime, dispatch_bound=v.COMPARED_BOUND, rank=rank)
        first = pred.labels[0]
        start = (pred.live_set_bytes(first, "persistent") + pred.term_bytes(first, (INPUT_BATCH,))
                 + pred.step_start_workspace_bytes())
        opt = pred.phase_bytes("optimizer") - pred.live_set_bytes("optimizer", "optimizer_step")
        samples = {lbl: PhaseSample(lbl, opt if lbl == "optimizer" else 0, pred.phase_bytes(lbl))
                   for lbl in pred.labels}
        return v.Measurement(samples, start, step_factor * pred.step_s, "real", device, step_times_s=[1.0])
    return fake_measure


@pytest.mark.parametrize("device,judged", [("NVIDIA H200", True), ("NVIDIA H100 80GB HBM3", False)])
def test_time_is_judged_only_on_the_clusters_gpu(device, judged):
    """A real step on another GPU than the plan's cluster profile (an H100 for the H200 profile) is
    held to the memory rows only: its time is printed, not judged, and the outcome says why."""
    from planner.runtime import validate as v

    pf = build_planfile(model="qwen3-30b-a3b", gpus=1, seq_len=16384)
    slow = v.validate(pf, layers=2, measure_fn=_measured_as_predicted(device, 2.0))
    fair = v.validate(pf, layers=2, measure_fn=_measured_as_predicted(device, 1.0))
    assert fair.ok and all(r.ok for r in slow.rows if r.unit == "bytes")
    assert slow.ok is not judged and slow.time_judged is judged
    step = next(r for r in slow.rows if r.unit == "s")
    assert step.judged is judged and step.measured == pytest.approx(2 * step.predicted)
    doc = slow.to_json()
    assert doc["tolerances"]["time_judged"] is judged and doc["cluster_gpu"] == "NVIDIA H200"
    if judged:
        assert doc["other_gpu"] is None and slow.other_gpu == ""
    else:
        assert "NVIDIA H100 80GB HBM3" in doc["other_gpu"] and "planner calibrate" in doc["other_gpu"]


def test_a_plan_that_cannot_fit_this_gpu_is_refused():
    """The predicted peak against this GPU's free memory: a plan for a larger card is refused with one
    line (exit 2), not run into a CUDA out-of-memory."""
    from planner.errors import InvalidPlan
    from planner.runtime import validate as v
    from planner.units import GiB

    pf = truncate(build_planfile(model="gpt-oss-20b", gpus=1, seq_len=65536), 2).planfile
    pred = predict(pf, "freed", timing=False)
    assert pred.peak_bytes > 80 * GiB
    with pytest.raises(InvalidPlan, match=r"predicted peak 8\d\.\d\d GiB at head.*must fit this GPU \(NVIDIA H100 80GB "
                                          r"HBM3: 77\.00 GiB free of 79\.18 GiB\)"):
        v.check_fits_here(pred, int(77 * GiB), int(79.18 * GiB), "NVIDIA H100 80GB HBM3")
    v.check_fits_here(pred, pred.peak_bytes, int(140 * GiB), "NVIDIA H200")


@pytest.mark.parametrize("args, says", [(["--lengths", "-1"], "--lengths (-1) must be >= 1"),
                                        (["--steps", "0"], "'0' must be >= 1"),
                                        (["--budget-s", "nan"], "'nan' must be a finite number of seconds > 0"),
                                        (["--max-seq-len", "3000"], "--max-seq-len (3000) must be >= 4096")])
def test_bench_refuses_bad_options(args, says, tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "validate.py"), "--dry-run", "--worlds", "1",
                          "--out", str(tmp_path), *args], capture_output=True, text=True)
    assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_bench_matrix_fails_on_an_out_of_memory_and_skips_a_refused_plan(tmp_path, monkeypatch):
    """``finish``: a case that ran out of memory is a miss (exit 1) even when the others are within
    tolerance; a plan refused before it ran (larger than this GPU) is only skipped."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "bench"))
    from _validate_runner import finish

    ok = {"status": "ran", "result": {"ok": True}}
    args = SimpleNamespace(dry_run=False)
    run = lambda cases: finish(tmp_path, "v", "t", "n", [], [], cases, args, 0.0)  # noqa: E731
    monkeypatch.setattr("planner.runtime.measure.provenance", lambda: {})
    assert run([ok, {"status": "skipped (plan (84 GiB) must fit this GPU)"}]) == 0
    assert run([ok, {"status": "error: OutOfMemoryError: CUDA out of memory"}]) == 1
