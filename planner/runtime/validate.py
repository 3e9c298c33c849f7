"""``planner validate``: run a plan's own composed step on this machine and hold every phase of
the budget against the allocator (DESIGN §8, issue 11).

- The plan file is truncated once (``validate_plan.truncate``); the step and the prediction both
  use the truncated plan file.
- ``W = 1`` (or ``torchrun`` with ``WORLD_SIZE = W``): the step runs for real, so the step time is
  judged too. ``W`` above that: **one rank** runs under PyTorch's fake process group
  (``FakeStore``, ``init_process_group("fake")``): real CUDA memory, collectives that move nothing,
  so the time is reported but not judged.
- Each phase (``forward[r]``, ``head``, ``backward[r]``, ``optimizer``) is recorded through the
  step's ``on_phase`` hook (``phase_recorder``): peak allocated and reserved bytes from the
  allocator's counters, reset at each boundary. The last of ``K`` steps is compared (the first
  builds the optimizer state and the library workspaces); the time is the median over steps 2..K
  (CUDA events), a real run stepping on until those add up to ``TIME_WINDOW_S``.

Exit codes: 0 every judged row within tolerance, 1 one is not, 2 invalid input or no GPU.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field

from planner.errors import InvalidPlan
from planner.runtime.validate_compare import (MEMORY_OVER, MEMORY_UNDER, TIME_TOLERANCE, Row, compare,
                                              verdict)
from planner.runtime.validate_plan import (GRAD_LIFETIMES, Prediction, binding_rank, context, predict, symbols,
                                          truncate)

DEFAULT_STEPS = 3
"""Steps run; the last is compared (the first creates optimizer state and workspaces)."""
TIME_WINDOW_S = 2.0
"""A policy, not a measurement: a real run steps on past ``--steps`` until its timed steps (2..K)
add up to this many seconds. A launch-bound step's time follows the speed of the host core its
thread is on, which changes from moment to moment on the H200 machines
(``planner.runtime.host_cores``), so a 0.1 s step's median is taken over a window of steps rather
than over two. Measured on two H100 instances (README, `planner validate`): the window's median moved
from the median of steps 2-4 by -10.6% to +4.2%, and the steps inside one window spread up to 1.34x."""
MAX_STEPS = 40
"""A policy: the most steps ``TIME_WINDOW_S`` adds a run up to (20 of the shortest FSDP2 step,
0.1 s, fill the window)."""
SEED = 0
COMPARED_BOUND = "expected"
"""A step measures the dispatch buffers of the routing it draws: compare them with the plan evaluated
on the routing profile (``dispatch_bound = expected``); the guarantee bounds them from above."""


@dataclass
class Measurement:
    """What one rank's run recorded."""

    samples: dict
    """Phase label → ``PhaseSample`` of the last step."""
    step_start_bytes: int
    step_s: float | None
    mode: str
    """``real`` (every rank runs, communication real) or ``emulated`` (one rank, fake process group)."""
    device: str
    losses: list[float] = field(default_factory=list)
    allocator: str = ""
    """The caching allocator's mode the step ran under (``planner.runtime.allocator``)."""
    host_cores: object = None
    """The cores' speeds and the one the launching thread ran on (``planner.runtime.host_cores``)."""
    phase_s: dict | None = None
    """A real run's one step synchronised at each phase boundary (``planner.runtime.phase_times``)."""
    step_times_s: list[float] = field(default_factory=list)
    """Every timed step, in order (CUDA events); ``step_s`` is the median of the 2nd onwards."""
    alloc_retries: int = 0
    """Times the caching allocator freed its cache and retried a device allocation during the steps
    (``num_alloc_retries``): a step that runs near the card's capacity pays for them in time."""


@dataclass
class Outcome:
    """A validation: the plan, both sides and the rows."""

    changes: list[str]
    prediction: Prediction
    measurement: Measurement
    rank: int
    rank_reason: str
    rows: list[Row]

    @property
    def ok(self) -> bool:
        return verdict(self.rows)

    @property
    def time_judged(self) -> bool:
        return judge_time(self.measurement, self.prediction)

    @property
    def other_gpu(self) -> str:
        """'' on the plan cluster's own GPU, else why the step time is not judged here."""
        return other_gpu(self.measurement.device, self.prediction.ctx.cluster)

    def to_json(self) -> dict:
        pred, meas = self.prediction, self.measurement
        phases = {}
        for label in pred.labels:
            s = meas.samples.get(label)
            phases[label] = {"predicted_bytes": pred.phase_bytes(label),
                             "predicted_live_sets": pred.by_live_set(label),
                             "measured": s.asdict() if s is not None else None}
        return {
            "ok": self.ok, "mode": meas.mode, "device": meas.device, "rank": self.rank,
            "rank_reason": self.rank_reason, "world_size": pred.ctx.world_size,
            "grad_lifetime": pred.ctx.grad_lifetime, "truncation": self.changes,
            "symbols": symbols(pred.ctx), "predicted_peak_bytes": pred.peak_bytes,
            "predicted_binding_phase": pred.binding_phase, "capacity_bytes": pred.capacity_bytes,
            "measured_peak_bytes": max((s.peak_bytes for s in meas.samples.values()), default=0),
            "measured_peak_reserved_bytes": max((s.peak_reserved_bytes or 0 for s in meas.samples.values()),
                                                default=0),
            "step_s": meas.step_s, "step_times_s": meas.step_times_s, "alloc_retries": meas.alloc_retries,
            "predicted_step_s": pred.step_s,
            "losses": [v if math.isfinite(v) else None for v in meas.losses],
            "predicted_step_components_s": finite_or_none(pred.step_components),
            "predicted_step_phases_s": finite_or_none(pred.step_phases), "measured_phase_s": meas.phase_s,
            "allocator": meas.allocator,
            "host_cores": meas.host_cores.to_json() if meas.host_cores is not None else None,
            "tolerances": {"memory_under": MEMORY_UNDER, "memory_over": MEMORY_OVER,
                           "time": TIME_TOLERANCE, "time_judged": self.time_judged},
            "cluster_gpu": pred.ctx.cluster.topology.gpu_name, "other_gpu": self.other_gpu or None,
            "rows": [r.asdict() for r in self.rows], "phases": phases,
        }


def finite_or_none(d: dict | None) -> dict | None:
    """``d`` with every value that is not a finite number as None (strict JSON has no NaN)."""
    if d is None:
        return None
    return {k: (float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None) for k, v in d.items()}


def other_gpu(device: str, cluster) -> str:
    """'' when ``device`` (``torch.cuda.get_device_name``) is the GPU the plan's cluster profile was
    measured on, else why a step time measured on it says nothing of that profile's time model."""
    want = cluster.topology.gpu_name
    if device == want:
        return ""
    return (f"this GPU is {device}, the plan's cluster ({cluster.name}) is {want}: the time model's curves were "
            f"measured on {want}, so the step time is shown, not judged (calibrate this machine with planner "
            "calibrate and validate a plan of that profile)")


def judge_time(meas: "Measurement", pred: Prediction) -> bool:
    """The step time is judged where communication is real and the GPU is the cluster profile's."""
    return meas.mode == "real" and not other_gpu(meas.device, pred.ctx.cluster)


def check_fits_here(pred: Prediction, free_bytes: int, total_bytes: int, device: str) -> None:
    """Refuse a plan whose predicted peak cannot fit this GPU (a smaller card than the plan's cluster):
    the run would only end in a CUDA out-of-memory."""
    if pred.peak_bytes > free_bytes:
        from planner.units import GiB

        raise InvalidPlan("plan", f"predicted peak {pred.peak_bytes / GiB:.2f} GiB at {pred.binding_phase}",
                          f"must fit this GPU ({device}: {free_bytes / GiB:.2f} GiB free of "
                          f"{total_bytes / GiB:.2f} GiB)",
                          "free this GPU's memory if other processes hold it, validate on a GPU of the plan's "
                          "cluster, or give a plan that fits this one (fewer --layers, a shorter --seq-len, or "
                          "more GPUs)")


# ---- the run ---------------------------------------------------------------------------------------
CPU_TRACE = {"composed": "planner.runtime.step_trace.trace_step(PLAN, num_layers=2)",
             "fsdp2": "planner.runtime.fsdp2_trace.trace_fsdp2(truncate(load_planfile(PLAN), 2).planfile), at tp = cp = 1 "
                      "(tensor and context parallelism shard only CUDA attention),"}
"""What traces a stack's step with fake tensors on a CPU (``planner validate`` without a GPU names it)."""


def _require_gpu(stack: str):
    try:
        import torch
    except ImportError:
        raise InvalidPlan("planner validate", "torch", "is not installed (it needs the runtime extra)",
                          "pip install 'moe-planner[runtime]' on a machine with a GPU") from None
    if not torch.cuda.is_available():
        raise InvalidPlan("planner validate", "no CUDA device", "needs a CUDA GPU to measure the step",
                          f"run it on a machine with a GPU; on a CPU, {CPU_TRACE[stack]} traces the same "
                          "step with fake tensors (README, `planner validate`)")
    return torch


def _world(world_size: int, rank: int, torch):
    """Start the process group: ``(mode, rank)``."""
    import torch.distributed as dist

    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_initialized():
        dist.destroy_process_group()
    if world_size == 1:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", torch.cuda.current_device()))
        return "real", 0
    if env_world == world_size:  # torchrun with the plan's W: every rank runs for real
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return "real", dist.get_rank()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    return "emulated", rank


def synthetic_batch(ctx, device, torch):
    """Random token ids and targets of one rank, ``[B, T]`` = sequences per micro-batch × this
    rank's ``S/D`` tokens of each (``N = B·T``), seeded."""
    B = int(ctx.seqs_per_microbatch)
    T = int(ctx.tokens_per_rank) // B if ctx.stack == "composed" else int(ctx.seq_len)  # fsdp2: whole sequences, CP shards them
    tokens = torch.randint(ctx.vocab_size, (B, T), device=device)
    targets = torch.randint(ctx.vocab_size, (B, T), device=device)
    return tokens, targets


def run_steps(composed, recorder, tokens, targets, *, steps: int, timer=None, min_timed_s: float = 0.0):
    """Run ``steps`` steps through the phase recorder, and more (up to ``MAX_STEPS``) while the timed
    steps 2..K add up to less than ``min_timed_s``; returns (samples of the last step, its
    step-start bytes, step times, losses). The step frees or keeps the gradients itself
    (``build_composed_step(set_to_none=...)``)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidPlan("--steps", steps, "must be an integer >= 1", "give --steps 3 (the last step is compared)")
    if not (isinstance(min_timed_s, (int, float)) and math.isfinite(min_timed_s) and min_timed_s >= 0):
        raise InvalidPlan("min_timed_s", min_timed_s, "must be a finite number of seconds >= 0",
                          f"give TIME_WINDOW_S ({TIME_WINDOW_S}) or 0 for no window")
    times, losses = [], []
    samples, start = {}, 0
    composed.on_phase = recorder
    k = 0
    while k < steps or (timer is not None and sum(times[1:]) < min_timed_s and k < MAX_STEPS):
        k += 1
        recorder.start()
        start = recorder._start
        t = timer() if timer is not None else None
        loss = composed.step(tokens, targets)
        if t is not None:
            dt = t()
            if not (math.isfinite(dt) and dt >= 0):
                raise RuntimeError(f"step {k} timed {dt!r} s: the timer must return finite seconds >= 0")
            times.append(dt)
        samples = recorder.finish()
        losses.append(0.0 if _is_fake(loss) else float(loss.detach().float().cpu()))
    return samples, start, times, losses


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _cuda_timer(torch):
    def start():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()

        def stop():
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b) / 1e3
        return stop
    return start


def build_step(planfile, *, device, grad_lifetime: str, rank: int = 0):
    """The composed step of ``planfile`` on this rank (``planner.runtime.mop``); ``freed``: the step
    ends with ``zero_grad(set_to_none=True)``, ``accumulate``: gradients are kept. An ``fsdp2`` plan
    builds the FSDP2 baseline (``planner.runtime.fsdp2``)."""
    if planfile.plan.stack == "fsdp2":
        from planner.runtime.fsdp2 import build_from_planfile

        return build_from_planfile(planfile, device=device, rank=rank, grad_lifetime=grad_lifetime)
    from planner.runtime.mop import build_composed_step

    return build_composed_step(planfile, device=device, set_to_none=grad_lifetime == "freed")


def _profile_plans(disp, profile: str) -> None:
    """``disp`` plans from ``profile``'s integer counts at the tokens it is given (every rank of the
    expert group drawing them), instead of all-gathering the ranks' counts; the checkpoint's
    recompute still reuses the forward's plan."""
    import types

    from planner.plans import routing
    from planner.runtime import shim

    def make_plan(self, ids_Nk):
        counts = routing.profile_counts(profile, int(ids_Nk.shape[0]), self.num_experts, self.top_k,
                                        shim.group_size(self.group))
        self.plans_computed += 1
        return self.plan_from_counts(counts, self._num_chunks(ids_Nk.shape[0]))

    disp.make_plan = types.MethodType(make_plan, disp)


def plan_dispatch(model, ctx) -> None:
    """Give every MoE layer's dispatcher the integer plan of the plan's routing profile, and the
    Ring-DTP head its ``N_max`` (computed here, as ``dispatch_trace`` does): the step then routes as
    the budget's ``expected`` size assumes, under a fake process group (whose collectives cannot
    exchange real counts) and in a trace (which cannot read them) alike. The FSDP2 baseline's
    dispatchers too: under the fake process group the other ranks' counts never arrive, and a
    rank's own (randomly initialised, far from balanced) routing replicated over the expert group
    puts up to ``ep`` times its routes on one rank, a load the plan's profile does not describe."""
    import functools

    from planner.budget.dispatch import profile_of
    from planner.plans import routing
    from planner.runtime.expert_parallel import DispatchOp

    if ctx.stack == "fsdp2":   # the tokens a layer routes (N, or N/tp under sequence parallel) are its own
        for disp in (m for m in model.modules() if isinstance(m, DispatchOp)):
            _profile_plans(disp, profile_of(ctx))
        return
    counts = routing.profile_counts(profile_of(ctx), int(ctx.tokens_per_rank), ctx.num_experts, ctx.top_k,
                                    int(ctx.expert_parallel))
    for blk in model.layers:
        if blk.is_moe:
            disp = blk.ffn.experts
            disp.forward = functools.partial(type(disp).forward, disp, plan=disp.plan_from_counts(counts))
    head = model.head
    if head is not None and "n_max" in type(head).forward.__code__.co_varnames:  # every rank holds N
        head.forward = functools.partial(type(head).forward, head, n_max=int(ctx.tokens_per_rank))


def measure(planfile, ctx, *, rank: int, steps: int, grad_lifetime: str) -> Measurement:
    """Run ``steps`` steps of the composed step of ``planfile`` on this GPU as ``rank``."""
    torch = _require_gpu(ctx.stack)
    import torch.distributed as dist

    from planner.runtime import allocator, host_cores, phase_times
    from planner.runtime.phase_recorder import CudaSource, PhaseRecorder

    alloc_line = allocator.configure(torch, planfile.cluster.memory.expandable_segments)

    mode, rank = _world(ctx.world_size, rank, torch)
    try:
        device = torch.device("cuda", torch.cuda.current_device())
        cores = host_cores.survey()  # how fast each host core is, beside the step time
        torch.manual_seed(SEED)
        composed = build_step(planfile, device=device, grad_lifetime=grad_lifetime, rank=rank)
        try:
            plan_dispatch(composed.model, ctx)
            tokens, targets = synthetic_batch(ctx, device, torch)
            rec = PhaseRecorder(CudaSource(device))
            retries0 = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
            samples, start, times, losses = run_steps(composed, rec, tokens, targets, steps=steps,
                                                      timer=_cuda_timer(torch),
                                                      min_timed_s=TIME_WINDOW_S if mode == "real" else 0.0)
            retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries0
            phase_s = (phase_times.phase_seconds(composed, tokens, targets, lambda: torch.cuda.synchronize(device))
                       if mode == "real" else None)
        finally:
            if hasattr(composed, "close"):
                composed.close()  # pinned host memory (SCO pool, offloaded optimizer state)
        step_s = median_step_s(times)
        name = torch.cuda.get_device_name(device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return Measurement(samples, start, step_s, mode, name, losses, alloc_line, cores, phase_s, times, retries)


def median_step_s(times: list[float]) -> float | None:
    """The step time: the median of the timed steps after the first (which builds the optimizer
    state and the library workspaces), the first alone when it is the only one."""
    return statistics.median(times[1:]) if len(times) > 1 else (times[0] if times else None)


def plan_grad_lifetime(pf) -> str:
    """The gradient lifetime a plan file runs with when ``--grad-lifetime`` is not given: an FSDP2
    plan's ``baseline.grad_lifetime``, ``freed`` for the composed stack (``planner.train`` frees
    the gradients after every optimizer step)."""
    return pf.plan.baseline.grad_lifetime if pf.plan.stack == "fsdp2" else "freed"


def validate(plan: str, *, layers: int | None = None, steps: int = DEFAULT_STEPS, rank: int | None = None,
             grad_lifetime: str | None = None, measure_fn=None) -> Outcome:
    """Truncate, predict, measure, compare (``measure_fn`` replaces the GPU run, e.g. by a trace).

    Raises:
        InvalidPlan: bad arguments, a bad plan file, or no GPU.
    """
    from planner.schema.io import load_planfile

    if steps < 1:
        raise InvalidPlan("--steps", steps, "must be >= 1", "give --steps 3 (the last step is compared)")
    pf = load_planfile(plan) if isinstance(plan, (str, os.PathLike)) else plan
    grad_lifetime = grad_lifetime or plan_grad_lifetime(pf)
    tr = truncate(pf, layers)
    ctx = context(tr.planfile, grad_lifetime, COMPARED_BOUND)
    if ctx.model.is_moe:
        tr.changes.append(f"dispatch follows the integer plan of routing {ctx.routing_text} and is compared "
                          f"at its {COMPARED_BOUND} size on the measured rank's plan (the verdict takes the "
                          "largest over ranks; the guarantee bounds them all)")
    if rank is None:
        rank, why = binding_rank(ctx)
    else:
        if not 0 <= rank < ctx.world_size:
            raise InvalidPlan("--rank", rank, f"must be in [0, {ctx.world_size}) (plan.world_size)",
                              "give a rank of the plan")
        why = "chosen with --rank"
    # the rank's own dispatch plan, not the largest over ranks
    pred = predict(tr.planfile, grad_lifetime, dispatch_bound=COMPARED_BOUND, rank=rank)
    if measure_fn is None:
        torch = _require_gpu(ctx.stack)
        free, total = torch.cuda.mem_get_info()
        check_fits_here(pred, free, total, torch.cuda.get_device_name())
    meas = (measure_fn or measure)(tr.planfile, ctx, rank=rank, steps=steps, grad_lifetime=grad_lifetime)
    rows = compare(pred, meas.samples, meas.step_start_bytes, step_s=meas.step_s,
                   judge_time=judge_time(meas, pred))
    return Outcome(tr.changes, pred, meas, rank, why, rows)


def main(plan: str, *, layers: int | None = None, steps: int = DEFAULT_STEPS, rank: int | None = None,
         grad_lifetime: str | None = None, json_out: bool = False, console=None) -> int:
    """``planner validate``: returns the exit code (0 within tolerance, 1 not)."""
    if grad_lifetime is not None and grad_lifetime not in GRAD_LIFETIMES:
        raise InvalidPlan("--grad-lifetime", grad_lifetime, f"must be one of {', '.join(GRAD_LIFETIMES)}",
                          "use --grad-lifetime freed or accumulate")
    o = validate(plan, layers=layers, steps=steps, rank=rank, grad_lifetime=grad_lifetime)
    if json_out:
        sys.stdout.write(json.dumps(o.to_json(), indent=1) + "\n")
    else:
        from rich.console import Console

        from planner.runtime.validate_report import render

        render(o, console or Console())
    return 0 if o.ok else 1
