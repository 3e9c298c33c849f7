"""The committed H200 runs of ``planner validate`` (bench/results/validate/) held against the formula
as it is now (``bench/validate_table.py``): no phase of any recorded case may be predicted more than
``UNDER`` below its measurement — a false fit — except the known gaps listed here with their reason.
A listed gap that is no longer under fails too, so the list cannot go stale."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import validate_table  # noqa: E402

from planner.runtime.validate_compare import MEMORY_UNDER, time_ok  # noqa: E402

UNDER = MEMORY_UNDER
_PERSISTENT = ("DeepSeek-V2-Lite W = 64 step start and optimizer 0.985 (5.1 MiB on a 330 MiB rank) in the runs made "
               "in PyTorch's default allocator mode (validate_fsdp2, validate_fsdp2_run2): the 11 MiB expert shards "
               "sit in unsplit 12 MiB blocks there (bench/results/allocator_modes: allocated − requested 5.08 MiB "
               "at step start). In the cluster file's mode, which planner validate now sets "
               "(validate_fsdp2_expandable), the case is 0.9999-1.0002 and allocated − requested is 0.02 MiB")
KNOWN_UNDER = {
    # (stack, case, W, S, lifetime): reason
    ("fsdp2", "dsv2-W64-full", 64, 32768, "accumulate"): _PERSISTENT,
}
"""Phases below the measurement by more than ``UNDER`` today, each with its reason: the default
allocator mode's DeepSeek W = 64 FSDP2 rows. (Held-out round 4's ``per_layer`` MoE backward, 0.988,
HSDP 4 × 8's backward[1], 0.987, and ``checkpoint = none``'s dense FFN backward, 0.981, are fixed: a
retained region input beside the normed output, HSDP's all-reduce buffers, and the composed stack's
own saved-tensor inventory, ``planner.budget.saved_composed``.)"""


@pytest.fixture(scope="module")
def records():
    return [validate_table.row(stem, c, pf) for stem in validate_table.STEMS
            for c, pf in validate_table.cases(stem)]


def _key(r):
    return (r["stack"], r["case"], r["W"], r["S"], r["lifetime"])


def _gpu_key(r):
    """A step time's key: the case and the GPU it ran on (a GPU's steps are predicted with its profile)."""
    return (*_key(r), r["device"])


def test_every_recorded_case_is_read(records):
    stacks = {r["stack"] for r in records}
    assert stacks == {"composed", "fsdp2"}
    assert len(records) >= 40


def test_no_peak_is_a_false_fit(records):
    """The verdict itself (the step's peak) is never more than ``UNDER`` below the measurement."""
    assert [(_key(r), r["peak_predicted"] / r["peak_measured"]) for r in records
            if r["peak_predicted"] < (1 - UNDER) * r["peak_measured"]] == []


def test_no_new_false_fit_against_the_h200(records):
    under = {_key(r): f"{r['min_row']} {r['min_ratio']:.3f}" for r in records if r["min_ratio"] < 1 - UNDER}
    assert {k: v for k, v in under.items() if k not in KNOWN_UNDER} == {}
    assert sorted(k for k in KNOWN_UNDER if k not in under) == []


_CORES = ("The cause, measured (bench/results/step_spread): the H200 machines' vCPUs run at two speeds, a fixed "
          "Python loop reads 2.4-3.5 ms or 4.5-6.6 ms (111 of 120 probes), one core 4.9 ms in one round and 2.4 ms "
          "in the next, with at most 0.05 s of stolen time and ~1 ms of garbage collection a step; the launch-bound steps follow "
          "the core their thread is on. Pinned to the fastest core (validate_*_pinned_expandable, instance 7542d85e) "
          "they were no steadier, and that instance's own host calibrations, pinned there, priced five of the 18 0.78-0.85 "
          "(bench/validate_table.py --calibration instance_7542d85e)")
_QWEN3_HOST = (_CORES + ". Qwen3-30B-A3B composed at W = 1 (128 experts: 51k-140k kernel launches per 2-layer step, the GPU "
               "idle about half of it, bench/results/step_profile): host-bound, and the host's speed differs "
               "between H200 instances; 64k measured 4.47 (bench/results/step_phases), 4.85, 5.04, 5.33, 5.66 and "
               "5.94 s against 4.91 s predicted (0.83-1.10), 32k 2.85, 3.19, 3.49, 3.67, 3.68 and 2.61 s against 3.09 s "
               "(0.84-1.18; 2.61 s on instance 9fd232e7, validate_w1_run6_expandable, where the FSDP2 steps were the "
               "slowest measured: the spread is not one speed per instance). On the instance of validate_w1_run5 the tiny-width host calibrations "
               "(bench/results/calibration/instance_c275be5e) measured the chunk loops at 175 / 42 / 464 us per "
               "block against the profile's 165 / 35 / 519: the slowdown is not in what the calibration measures; on "
               "7542d85e 64k 4.16 s and 32k 2.69 s (1.18, 1.15)")
_SLOW_INSTANCE = ("gpt-oss-20b composed at W = 1, 16k: 1.46 s on the instance of validate_w1_run5 (c275be5e), where "
                  "Qwen3's host-bound steps are also slowest, against 1.26-1.42 s on four other instances and 1.24 s "
                  "predicted (0.85-0.98 there)")
_QWEN3_FSDP2_HOST = ("Qwen3-30B-A3B FSDP2 at W = 1, 16k: 0.35 s on the calibrating instance (validate_fsdp2.json), "
                     "0.54 s on the instance of validate_fsdp2_run2.json against 0.34 s predicted; that instance's own "
                     "calibration.step_host rows are within 10% of the profile's (bench/results/calibration/"
                     "instance_c275be5e), and its other eight W = 1 steps are within 15%")
_GPTOSS_FSDP2_SHORT = ("gpt-oss-20b FSDP2 at W = 1, 4k: 0.181 s on instance 9fd232e7 (validate_fsdp2_run3_expandable) "
                       "against 0.145 s predicted (0.80); 0.151-0.166 s on the four other instances (0.88-0.96). On "
                       "the same instance the composed Qwen3 32k step was the fastest measured (2.61 s): the host-bound "
                       "steps' spread between runs is not one speed per machine")
_DSV2_FSDP2_SHORT = ("DeepSeek-V2-Lite FSDP2 at W = 1, 4k, the shortest step: 0.103-0.109 s on four H200 instances "
                     "(validate_fsdp2, _run2, _fresh, _expandable) against 0.121 s predicted (1.11-1.18; 0.121 s, 1.01, on a "
                     "fifth, validate_fsdp2_run3_expandable), 0.098 s on a sixth (7542d85e, validate_fsdp2_pinned_expandable, 1.24); "
                     "over-priced, so the search errs against the baseline's speed here")
_NONE_TIME = ("composed checkpoint = none at W = 1 (held-out round 6, one instance, 508abae7): gpt-oss-20b 4k "
              "0.97 s measured against 0.83 s predicted (0.85), Qwen3-30B-A3B 16k 1.31 s against 1.51 s (1.16); "
              "DeepSeek-V2-Lite 16k 0.84 s against 0.79 s (0.95). Run again on instance 8dccf714 "
              "(validate_heldout_r6_rerun) the same two were within, 0.87 s (0.94) and 1.38 s (1.09): instance "
              "spread, as the Qwen3 host-bound steps above; this instance's host speed is unmeasured")
_QWEN3_FSDP2_SHORT = (_CORES + ". Qwen3-30B-A3B FSDP2 at W = 1, 4k: 0.187-0.244 s on four instances against 0.213 s "
                      "predicted (0.87-1.14), 0.171 s on 7542d85e (validate_fsdp2_pinned_expandable, 1.25)")
_H100_CAL = ("On the H100 whose calibration is the shipped h100 profile (instance b213c03d, "
             "bench/results/calibration/h100_b213c03d; validate_*_h100_cal_expandable, run minutes after it), every "
             "composed step ran slower than that calibration predicts (0.77-0.91), while on another H100 instance "
             "(002db3fa, validate_*_h100_expandable) the same steps were 0.93-1.04. By phase (one step synchronised at "
             "each boundary) the head and optimizer are within 1-10% on both instances and the miss is in the "
             "regions' forward and backward: Qwen3-30B-A3B 32k forward 0.378 s predicted against 0.558 measured, "
             "backward 1.337 against 1.715 (0.442 and 1.567 on 002db3fa), its 128-expert loops host-bound; this "
             "instance's probe read half its cores at 2.5 ms and half at 4.6-5.0 ms")
_H100_NEAR_FULL = ("gpt-oss-20b FSDP2 at W = 1, 16k on an H100: its peak (69.8 GiB allocated, 75.1 GiB reserved of the "
                   "card's 79.2) is beyond the h100 profile's usable capacity at W = 1 (69.6 GiB: planner check says it does not "
                   "fit), and its head and backward ran at 0.25-0.31 s and 0.27-0.36 s against 0.146 and 0.171 s "
                   "predicted (its 8k step, 61.6 GiB, is within 1-3%); allocator retries near capacity: on instance 00c2e474 "
                   "(validate_fsdp2_h100_si_expandable) the run records 6 (num_alloc_retries) and its steps slow as "
                   "they accumulate, 0.48, 0.65, 0.72, 0.73 s (0.59 of the 0.42 s predicted); no other case retried")
_H100_SI = ("On a third H100 instance (00c2e474, validate_*_h100_si_expandable, run after its same-instance dispatch "
            "calibration) the composed steps at 16k and 32k are 0.93-0.97 of their time, but Qwen3-30B-A3B at 64k is "
            "0.81: its four timed steps ran 4.64-5.77 s in one process against 4.03 s predicted (backward 2.63 s "
            "measured, 2.39 s predicted), the launch-bound spread of the H200 runs above; its FSDP2 16k step 0.84 "
            "(0.349-0.425 s over its steps against 0.322 s; backward 0.195 s against 0.143 s)")
_H200_SI = ("On an H200 instance whose host loops ran fast (dec975e8, validate_*_h200_si_expandable, its same-instance "
            "dispatch calibration bench/results/dispatch_same_instance/h200_dec975e8 run minutes later: chunk loops "
            "110 / 31 / 288 us per block against the profile's 165 / 35 / 519) Qwen3-30B-A3B's composed steps ran 0.74-0.77 "
            "of their predicted time (64k 3.66 s against 4.91, 32k 2.28 against 3.09, 16k 1.33 against 1.73); priced with "
            "that instance's calibration they are within (INSTANCE_CALIBRATED)")
_H100_BIDIR = ("On H100 d700f3ef (validate_*_h100_d700f3ef_expandable) gpt-oss-20b's composed 16k step took 1.436 s "
               "against 1.184 s with the shipped h100 profile (0.82): its OffloadStreamAdamW step streams at the "
               "bidirectional pinned rate, 36.7 GB/s on that instance against the profile's 53.0 GB/s (optimizer "
               "0.71 s predicted); priced with the planner calibrate profile of that instance it is 1.433 s (1.00, "
               "INSTANCE_PROFILED)")
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
KNOWN_SLOW = {
    ("composed", "gpt-oss-20b", 1, 16384, "freed", H100): _H100_BIDIR,
    ("fsdp2", "qwen3-W1-S4096", 1, 4096, "freed", H200): _QWEN3_FSDP2_SHORT,
    ("composed", "r6-gptoss-W1-S4096-none", 1, 4096, "accumulate", H200): _NONE_TIME,
    ("composed", "r6-qwen3-W1-S16384-none", 1, 16384, "accumulate", H200): _NONE_TIME,
    ("fsdp2", "dsv2-W1-S4096", 1, 4096, "freed", H200): _DSV2_FSDP2_SHORT,
    ("composed", "qwen3-30b-a3b", 1, 65536, "freed", H200): _QWEN3_HOST + "; " + _H200_SI,
    ("composed", "qwen3-30b-a3b", 1, 32768, "freed", H200): _QWEN3_HOST + "; " + _H200_SI,
    ("composed", "qwen3-30b-a3b", 1, 16384, "freed", H200): _H200_SI,
    ("composed", "gpt-oss-20b", 1, 16384, "freed", H200): _SLOW_INSTANCE,
    ("fsdp2", "qwen3-W1-S16384", 1, 16384, "freed", H200): _QWEN3_FSDP2_HOST,
    ("fsdp2", "gptoss-W1-S4096", 1, 4096, "freed", H200): _GPTOSS_FSDP2_SHORT,
    ("composed", "qwen3-30b-a3b", 1, 32768, "freed", H100): _H100_CAL,
    ("composed", "qwen3-30b-a3b", 1, 16384, "freed", H100): _H100_CAL,
    ("composed", "deepseek-v2-lite", 1, 16384, "freed", H100): _H100_CAL + (
        "; DeepSeek-V2-Lite 16k 0.846 there (backward 0.385 s predicted, 0.479 measured), 0.979 on 002db3fa"),
    ("fsdp2", "qwen3-W1-full", 1, 8192, "freed", H100): _H100_CAL + (
        "; Qwen3-30B-A3B FSDP2 8k 0.289 s there (0.252-0.299 s over its 8 timed steps) against 0.218 s, 0.230 s "
        "on 002db3fa (0.95)"),
    ("fsdp2", "gptoss-W1-S16384", 1, 16384, "freed", H100): _H100_NEAR_FULL,
    ("composed", "qwen3-30b-a3b", 1, 65536, "freed", H100): _H100_SI,
    ("fsdp2", "qwen3-W1-S16384", 1, 16384, "freed", H100): _H100_SI,
    ("fsdp2", "dsv2-W1-S4096", 1, 4096, "freed", H100): _DSV2_FSDP2_SHORT + (
        "; on an H100 (002db3fa) 0.097 s against 0.126 s (1.30), 0.117 s (1.08) on the calibrating one"),
}
"""W = 1 step times outside ``TIME_TOLERANCE`` today (on any run of the key, on the GPU named last),
each with its reason. The nine FSDP2 W = 1 steps are 0.90-1.14 of the calibrating instance
(``planner.timing.baseline_host``)."""


def test_w1_step_time_within_tolerance(records):
    """Every real (W = 1) step's predicted time is within ``TIME_TOLERANCE`` of the measured median,
    except the listed gaps; a listed gap that closed fails too. A key measured in several runs is
    judged on every run."""
    timed = [r for r in records if r["time_judged"] and r["step_s_measured"] and r["step_s_predicted"]]
    assert len({(r["model"], r["S"]) for r in timed if r["stack"] == "composed"}) >= 9
    off = {_gpu_key(r) for r in timed if not time_ok(r["step_s_predicted"], r["step_s_measured"])}
    assert sorted(off - set(KNOWN_SLOW)) == []
    assert sorted(set(KNOWN_SLOW) - off) == []


W1_FULL_RUNS = {"composed": "validate_w1_expandable", "fsdp2": "validate_fsdp2"}
"""Per stack, a run that timed all nine W = 1 steps (three models × three context lengths) on one
H200 instance, every one of them within ``TIME_TOLERANCE`` (issue 15's whole-step target): the FSDP2
run on the instance its host calibration (``calibration.step_host``) was measured on."""


@pytest.mark.parametrize("stack", sorted(W1_FULL_RUNS))
def test_nine_w1_steps_within_tolerance_on_one_instance(stack):
    stem = W1_FULL_RUNS[stack]
    recs = [validate_table.row(stem, c, pf) for c, pf in validate_table.cases(stem)]
    timed = [r for r in recs if r["W"] == 1 and r["stack"] == stack and r["step_s_measured"]]
    assert len({r["model"] for r in timed}) == 3 and len({(r["model"], r["S"]) for r in timed}) == 9
    assert [(r["case"], r["S"], round(r["step_s_predicted"] / r["step_s_measured"], 3)) for r in timed
            if not time_ok(r["step_s_predicted"], r["step_s_measured"])] == []


_DSV2_FSDP2_SHORT_H100 = ("DeepSeek-V2-Lite FSDP2 at W = 1, 4k on H100 00c2e474: 0.107 s measured against 0.130 s with that "
                          "instance's dispatch calibration (1.22; 0.126 s, 1.18, with the shipped h100 profile): the FSDP2 "
                          "host rows (calibration.step_host) were not measured on that instance, and this shortest step "
                          "is over-priced on every GPU (KNOWN_SLOW)")
INSTANCE_CALIBRATED = {
    "h200_dec975e8": (("validate_w1_h200_si_expandable", "validate_fsdp2_h200_si_expandable"), {}),
    "h100_00c2e474": (("validate_w1_h100_si_expandable", "validate_w1_64k_h100_si_expandable",
                       "validate_fsdp2_h100_si_expandable"),
                      {("fsdp2", "gptoss-W1-S16384", 16384): _H100_NEAR_FULL,
                       ("fsdp2", "dsv2-W1-S4096", 4096): _DSV2_FSDP2_SHORT_H100}),
}
"""W = 1 runs of both stacks priced with the dispatch calibration of their own host instance (``bash
bench/dispatch_same_instance.sh``, run in a call just before or after the runs on the same machine; ``bench/validate_table.py
--calibration FOLDER``): per folder the runs and the steps still outside ``TIME_TOLERANCE``, each with
its reason. On the H200 all 18 steps (three models × three lengths, each stack) are within."""


@pytest.mark.parametrize("folder", sorted(INSTANCE_CALIBRATED))
def test_w1_steps_priced_with_their_instance_calibration(folder):
    """The calibration and the runs are one host instance; with its curves merged, every W = 1 step of
    those runs is within ``TIME_TOLERANCE`` except the listed ones (a listed step that comes within
    fails too), and the calibration moves the prediction (the merge is read)."""
    import json

    stems, listed = INSTANCE_CALIBRATED[folder]
    hosts = {json.loads((validate_table.RESULTS / f"{s}.json").read_text())["provenance"]["host_instance"][:8]
             for s in stems}
    assert hosts == {folder.rsplit("_", 1)[1]}, (folder, hosts)
    recs = [validate_table.row(s, c, pf) for s in stems for c, pf in validate_table.cases(s, folder)]
    shipped = [validate_table.row(s, c, pf) for s in stems for c, pf in validate_table.cases(s)]
    timed = [r for r in recs if r["W"] == 1 and r["step_s_measured"]]
    assert len(timed) >= 17 and {r["stack"] for r in timed} == {"composed", "fsdp2"}
    off = {(r["stack"], r["case"], r["S"]): round(r["step_s_predicted"] / r["step_s_measured"], 3) for r in timed
           if not time_ok(r["step_s_predicted"], r["step_s_measured"])}
    assert sorted(off) == sorted(listed), off
    assert any(abs(a["step_s_predicted"] / b["step_s_predicted"] - 1) > 0.05 for a, b in zip(recs, shipped))


_DSV2_SELECTIVE_9F4 = ("DeepSeek-V2-Lite FSDP2 with selective checkpointing at W = 1, 8k on H100 9f4ff8ea: 0.199 s "
                       "measured (0.196-0.216 s over steps 2-8) against 0.164 s with that instance's planner calibrate "
                       "profile (0.825); its forward took 0.049 s against 0.028 s predicted (0.035 s on d700f3ef), while "
                       "the instance's FSDP2 host rows, measured minutes earlier in the same call, ran 12-17% faster "
                       "than d700f3ef's (selective MoE layer forward 8.3 against 10.0 ms); the shipped h100 profile "
                       "prices it at 0.196 s (0.98)")
INSTANCE_PROFILED = {
    "calibrate_h100_d700f3ef": (("validate_w1_h100_d700f3ef_expandable", "validate_fsdp2_h100_d700f3ef_expandable"),
                                {("fsdp2", "gptoss-W1-S16384", 16384): _H100_NEAR_FULL + "; it retried 8 times there"},
                                2),
    "calibrate_h100_9f4ff8ea": (("validate_w1_h100_9f4ff8ea_expandable", "validate_fsdp2_h100_9f4ff8ea_expandable"),
                                {("fsdp2", "gptoss-W1-S16384", 16384): _H100_NEAR_FULL,
                                 ("fsdp2", "dsv2-W1-selective", 8192): _DSV2_SELECTIVE_9F4},
                                0),
}
"""W = 1 runs of both stacks priced with the ``planner calibrate`` profile (every section) of their own
host instance, written in the call just before them on the same machine
(``bench/results/calibration/FOLDER/measured.yaml``; ``bench/validate_table.py --profile``): per
folder the runs, the steps still outside ``TIME_TOLERANCE`` (each with its reason), and how many more
steps are within than with the shipped profile (on 9f4ff8ea none: the own profile brings
DeepSeek-V2-Lite's FSDP2 4k step within, 1.18 to 0.96, and takes its selective 8k step out)."""
COVERAGE_CURVES = ("attention_long", "dispatch_kernels_widths", "sco", "baseline_host", "chunk_count", "cpu_adamw")
"""Curves a full ``planner calibrate`` writes that its partial runs before the coverage sections did not."""


@pytest.mark.parametrize("folder", sorted(INSTANCE_PROFILED))
def test_w1_steps_priced_with_the_planner_calibrate_profile_of_their_instance(folder):
    """One command calibrated the instance; with its whole profile merged into the shipped one, every
    W = 1 step of the runs made right after on the same machine is within ``TIME_TOLERANCE`` except
    the listed ones, and the listed number more steps are within than with the shipped profile."""
    import json

    import yaml

    stems, listed, gain = INSTANCE_PROFILED[folder]
    path = validate_table.RESULTS.parent / "calibration" / folder / "measured.yaml"
    prof = yaml.safe_load(path.read_text())
    assert all(prof["curves"].get(c) for c in COVERAGE_CURVES), [c for c in COVERAGE_CURVES if not prof["curves"].get(c)]
    assert prof["curves"]["cpu_adamw"]["num_params"] == 10**9
    hosts = {json.loads((validate_table.RESULTS / f"{s}.json").read_text())["provenance"]["host_instance"] for s in stems}
    assert hosts == {prof["curves"]["gemm"]["provenance"]["host_instance"]}, hosts
    recs = [validate_table.row(s, c, pf) for s in stems for c, pf in validate_table.cases(s, profile=str(path))]
    shipped = [validate_table.row(s, c, pf) for s in stems for c, pf in validate_table.cases(s)]
    timed = [r for r in recs if r["W"] == 1 and r["step_s_measured"]]
    assert len(timed) >= 17 and {r["stack"] for r in timed} == {"composed", "fsdp2"}
    off = {(r["stack"], r["case"], r["S"]) for r in timed if not time_ok(r["step_s_predicted"], r["step_s_measured"])}
    assert sorted(off) == sorted(listed)
    shipped_ok = sum(time_ok(r["step_s_predicted"], r["step_s_measured"]) for r in shipped if r["step_s_measured"])
    assert len(timed) - len(off) - shipped_ok == gain
    # the head and optimizer windows too, except the step beyond the usable capacity
    phases = {(r["stack"], r["case"], r["S"], k) for r in timed if r["phase_s_measured"] for k in GPU_BOUND_PHASES
              if abs(r["step_phases_predicted"][k] / r["phase_s_measured"][k] - 1) > SYNC_PHASE_TOL}
    assert {p[:3] for p in phases} <= set(listed), phases


CLUSTER_MODE_STEMS = tuple(s for s in validate_table.STEMS if s.endswith("_expandable") or s.startswith("validate_heldout"))
"""The runs made in the cluster file's allocator mode (``planner.runtime.allocator``): there every
judged memory row is held to both bounds, −``MEMORY_UNDER`` / +``MEMORY_OVER``."""
KNOWN_OVER: dict = {}
"""Rows of the cluster-mode runs above ``MEMORY_OVER`` today, each with its reason (none). Held-out
round 6's was fixed: ``checkpoint = none``'s Qwen3-30B-A3B W = 64 attention backward[1], 1.023, booked
two boundary gradients where the region holds only the incoming one until its input norm's backward
(``saved_composed.grads_per_nh``; every GQA attention and dense FFN backward without checkpointing
was one N·H·b over). Held-out round 5's were fixed: ``checkpoint = none``'s attention forward,
1.02-1.11, booked the region's whole saved inventory beside the attention interior that holds part
of it (now only what the region saved before its projections,
``saved_composed.attention_norm_counts``), and DeepSeek-V2-Lite's dense FFN backward at W > 1, 1.05-1.06, booked the gated MLP's backward moment beside the unshard
that starts the phase (``saved_composed.compute_only_backward_bytes``). Held-out round 4's were
fixed: Qwen3-30B-A3B W = 8 under LLEP was 1.021 in its MoE forward and 1.065-1.070 in its backward before LLEP's and standard EP's late tensors were booked where the allocator
history shows them (``planner.budget.dispatch_edges``: the region output, the dispatcher's input
gradient and, with freed gradients, the region's own expert gradients); ``checkpoint = none``'s MoE
region, 1.125 at forward[4], counted the current region's routed rows beside the dispatch working
set that holds them, and booked balanced per-token rows where PipelinedLLEP keeps only its imports
(``planner.budget.saved_composed``). gpt-oss-20b
W = 16 / 64's global-attention backward was 1.021-1.030 before the q, k, v gradients were booked
after FlashAttention's backward, ``planner.budget.gathered._qkv_grads_not_yet_made``; DeepSeek-V2-Lite
W = 16 at N = 512 was 1.094 at forward[4], the largest dispatch plan over ranks held against rank 0's,
now compared with the measured rank's own plan, and 1.071 at backward[2], before the dense FFN's later
backward moments, ``planner.budget.ffn.dense_backward_moment``.)"""


KNOWN_UNDER_ROWS: dict = {}
"""The rows of the cluster-mode runs below ``MEMORY_UNDER`` today, each with its measured ratio: none.
(Held-out round 8's W = 1 MoE backward without checkpointing at N = 32768, 0.961-0.989, is fixed: the
MoE input norm's fp32 backward, ``planner.budget.saved_norm_backward``.)"""


@pytest.fixture(scope="module")
def cluster_mode():
    """Every judged row of the cluster-mode runs, keyed by (stack, case, W, S, lifetime, phase), and
    the ``(live_set, name)`` of the terms those phases confirm (``validate_compare.confirmed_terms``:
    resident in a phase within both bounds that would fall more than ``MEMORY_UNDER`` below the
    measurement without it) and of the terms the predictions mark ``provisional``."""
    from planner.runtime.validate import COMPARED_BOUND
    from planner.runtime.validate_compare import compare, confirmed_terms
    from planner.runtime.validate_plan import predict

    out, confirmed, marked = [], set(), set()
    for stem in CLUSTER_MODE_STEMS:
        for c, pf in validate_table.cases(stem):
            pred = predict(pf, c["lifetime"], timing=False, dispatch_bound=COMPARED_BOUND,
                           rank=c["result"].get("rank", 0))
            samples, start = validate_table._samples(c["result"], c.get("name") or c["model"])
            stack = "fsdp2" if validate_table._fsdp2(stem, c) else "composed"
            rows = compare(pred, samples, start, judge_time=False)
            for r in rows:
                if r.unit == "bytes" and r.judged and r.measured:
                    out.append(((stack, c.get("name") or c["model"], c["W"], c["S"], c["lifetime"], r.phase), r))
            confirmed |= confirmed_terms(pred, rows)
            marked |= {(t.live_set, t.name) for t in pred.evaluation.terms if t.provisional}
    return {"rows": out, "confirmed": confirmed, "marked": marked}


CONFIRMED_BY_H200 = {
    ("attention", "sliding window backward: block copies, their gradients, the norm's saved input (excess over a global layer)"),
    ("gathered", "HSDP all-reduce buffers of the units reduced so far (fp32, accumulate)"),
    ("gathered", "backward unshard sub-step: region r's all-gather output beside its parameters (excess)"),
    ("gathered", "head gather (ZeRO-3, P = 1)"),
    ("gathered", "region weights: unsharded + all-gather output (forward), + prefetched region (backward)"),
    ("gathered", "unreduced grads: region r's, and the held reduce-scatter input of region r+1 (bf16)"),
    ("gathered", "embedding table, re-gathered by FSDP2's backward prefetch"),
    ("optimizer_step", "fp32 grad upcast for fused AdamW"),
    ("boundaries", "saved activations of the layers before r"),
    ("boundaries", "saved activations of the layers before r (fp32)"),
    ("vocab", "head input x (replicated over the group)"),
    ("vocab", "dx (fp32, all-reduced)"),
    ("vocab", "chunk GEMM output"),
    ("vocab", "log-softmax, target grad, exp, their sum (fp32)"),
}
"""Terms that lost their ``provisional`` mark on these runs (the composed ZeRO-3 units, the
sliding-window backward, the GPU AdamW upcast, the composed vocabulary-parallel head; FSDP2's saved
activations, HSDP buffers, chunked and loss-parallel heads): each is confirmed by at least one
cluster-mode H200 phase."""


def test_terms_the_h200_confirms_are_not_provisional(cluster_mode):
    confirmed, marked = cluster_mode["confirmed"], cluster_mode["marked"]
    assert sorted(CONFIRMED_BY_H200 - confirmed) == []
    assert sorted(confirmed & marked) == [], "\n".join(map(str, sorted(confirmed & marked)))


def test_every_row_within_both_bounds_in_the_cluster_mode(cluster_mode):
    from planner.runtime.validate_compare import memory_ok

    rows = cluster_mode["rows"]
    assert len(CLUSTER_MODE_STEMS) == 34 and len(rows) > 700
    off = {k: round(r.ratio, 4) for k, r in rows if not memory_ok(int(r.predicted), int(r.measured))}
    known = KNOWN_OVER | KNOWN_UNDER_ROWS
    assert {k: v for k, v in off.items() if k not in known} == {}
    assert sorted(k for k in known if k not in off) == []
    assert all(v > 1 for k, v in off.items() if k in KNOWN_OVER)   # the listed ones are over: conservative
    assert all(v < 1 for k, v in off.items() if k in KNOWN_UNDER_ROWS)
    assert {k: off[k] for k in KNOWN_UNDER_ROWS} == KNOWN_UNDER_ROWS   # at the ratios listed


def test_summary_counts_every_case_and_row(records):
    """``--summary`` (the README's composed table): every case and judged row in one line of its group."""
    for stack in ("composed", "fsdp2"):
        lines = validate_table.summary(records, stack).splitlines()[2:]
        mine = [r for r in records if r["stack"] == stack]
        assert sum(int(ln.split("|")[4]) for ln in lines) == len(mine)
        assert sum(int(ln.split("|")[7].split("/")[1]) for ln in lines) == sum(r["rows"] for r in mine)


SYNC_PHASE_TOL = 0.20
"""The head's and the optimizer's synchronised windows (``planner validate``'s one step synchronised
at every phase boundary, which adds each boundary's drain) within 20% of the model's seconds there."""
GPU_BOUND_PHASES = ("head", "optimizer")
"""Phases the host's speed does not set: the vocabulary operator's GEMMs and loss, the optimizer's
fused update and copies (the regions' phases hold the host-bound expert loops: ``KNOWN_SLOW``)."""
NEAR_FULL = {("fsdp2", "gptoss-W1-S16384", 1, 16384, "freed")}
"""Steps whose peak is beyond their profile's usable capacity (``KNOWN_SLOW``'s ``_H100_NEAR_FULL``)."""


def test_gpu_bound_phases_on_the_h100_its_calibration_predicts(records):
    """The H100 runs of three instances (one of them the calibration's) carry their phase windows:
    held against the h100 profile that ``planner calibrate``, the coverage sections and
    ``calibration.step_host`` wrote on one of them, the head and optimizer windows are within
    ``SYNC_PHASE_TOL`` on both, except the step beyond the usable capacity. (Two more instances' runs
    are held against their own profiles, ``INSTANCE_PROFILED``: on d700f3ef the bidirectional copies ran
    at 0.69 of the profile's rate, and its optimizer windows at 0.70-0.79 of the shipped profile's.)"""
    profiled = {s for stems, _, _ in INSTANCE_PROFILED.values() for s in stems}
    runs = [r for r in records if r["device"] == H100 and r["phase_s_measured"] and r["stem"] not in profiled]
    assert len(runs) == 49 and len({r["case"] for r in runs}) == 12
    off = {(_key(r), k): round(r["step_phases_predicted"][k] / r["phase_s_measured"][k], 3)
           for r in runs for k in GPU_BOUND_PHASES
           if abs(r["step_phases_predicted"][k] / r["phase_s_measured"][k] - 1) > SYNC_PHASE_TOL}
    assert {k[0] for k in off} == NEAR_FULL, off


def test_a_calibration_folder_reaches_only_the_runs_of_its_gpu():
    """``--calibration DIR`` merges an H200 instance's host calibrations into the H200 profile, and
    leaves the H100 runs' profile as it is (merging them was refused: curve device ≠ the GPU)."""
    from planner.schema.profiles import load_cluster

    h100, h200 = load_cluster("h100"), load_cluster("h200")
    assert validate_table.calibration_devices("instance_7542d85e") == {H200}
    assert validate_table.instance_cluster("instance_7542d85e", h100) is h100
    merged = validate_table.instance_cluster("instance_7542d85e", h200)
    assert merged.curves.baseline_host != h200.curves.baseline_host
    recs = [validate_table.row(s, c, pf) for s in ("validate_w1_h100_expandable", "validate_w1_pinned_expandable")
            for c, pf in validate_table.cases(s, "instance_7542d85e")]
    assert {r["device"] for r in recs} == {H100, H200} and all(r["step_s_predicted"] for r in recs)


def test_a_same_instance_run_is_a_calibration_folder():
    """``--calibration`` also names a run of ``bench/dispatch_same_instance.sh``: the sections inside
    its ``measured.yaml`` are read (there: ``dispatch_kernels``, no ``step_host``); a name that is no
    such folder, or a path, is one clear error."""
    frags = validate_table._instance_fragments("h200_dec975e8")
    assert [sorted(f["curves"]) for f in frags] == [["dispatch_kernels"]]
    assert validate_table.calibration_devices("h200_dec975e8") == {H200}
    for bad, says in (("nope", "no such folder"), ("../validate", "must name a folder"), ("", "must name a folder")):
        with pytest.raises(ValueError, match=says):
            validate_table._instance_fragments(bad)
    with pytest.raises(SystemExit) as e:
        validate_table.main(["--calibration", "nope"])
    assert e.value.code == 2
