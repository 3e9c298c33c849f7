"""Training entry point of the composed stack: a plan file's own step for K steps (issue 11).

    torchrun --nproc_per_node=W -m planner.train --plan plan.yaml --steps K [--layers L]
             [--data my_module:make_batches] [--device cuda|cpu] [--lr 1e-4] [--seed 0]

(``planner/train.py`` re-exports this module for ``-m``.)

Synthetic tokens by default. A real data loader plugs in through ``--data module:fn`` (or the
``data=`` argument of ``run``): ``fn(shard: DataShard)`` returns an iterable that yields, per
optimizer step, ``(tokens, targets)`` int64 tensors of shape ``[M, B, T]`` (``M`` micro-steps of
gradient accumulation) or ``[B, T]`` (``M = 1``) on ``shard.device``: the ``T = S/D`` positions
``shard.seq_rank·T …`` of this rank's ``B`` sequences. The ``D`` ranks of one sequence group must see
slices of the same sequences (``shard.seq_group`` names the group); ``targets`` are the next tokens
(``-100`` is ignored). Bad input: one line naming the field, value and fix, exit 2.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import typer

from planner.errors import InvalidPlan, PlanError


@dataclass(frozen=True)
class DataShard:
    """What one rank's data loader must produce (module docstring)."""

    rank: int
    world: int
    seq_group: int
    """Index of this rank's sequence group (``rank // D``)."""
    seq_rank: int
    """Index in the group: this rank holds positions ``seq_rank·T … (seq_rank+1)·T - 1``."""
    seq_parallel: int
    batch: int
    """``B``: sequences per micro-step."""
    tokens: int
    """``T = S/D``."""
    seq_len: int
    vocab_size: int
    micro_steps: int
    """``M``: micro-steps per optimizer step (``global_batch_tokens / (W·B·T)``)."""
    device: object


def synthetic(shard: DataShard, seed: int = 0) -> Iterable:
    """Random token sequences, the same on the ``D`` ranks of a sequence group (each takes its slice)."""
    import torch

    step = 0
    lo, hi = shard.seq_rank * shard.tokens, (shard.seq_rank + 1) * shard.tokens
    while True:
        g = torch.Generator().manual_seed(hash((seed, step, shard.seq_group)) % (2 ** 63))
        seq = torch.randint(0, shard.vocab_size, (shard.micro_steps, shard.batch, shard.seq_len + 1), generator=g)
        yield seq[..., lo:hi].to(shard.device), seq[..., lo + 1:hi + 1].to(shard.device)
        step += 1


def load_data_fn(ref: str) -> Callable:
    """``module:fn`` → the function (``InvalidPlan`` naming ``--data`` otherwise)."""
    mod, _, fn = ref.partition(":")
    if not mod or not fn:
        raise InvalidPlan("--data", ref, "must be module:function", "write e.g. --data my_pkg.data:batches")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise InvalidPlan("--data", ref, f"cannot be imported ({e})", "check the module path and name") from None


def _init_dist(device_type: str):
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def run(plan_path: str, steps: int, *, layers: int | None = None, data: Callable | None = None,
        device_type: str | None = None, lr: float | None = None, seed: int = 0, log: Callable = print) -> list[float]:
    """Train ``steps`` steps of the plan; returns the global mean loss of every step."""
    import torch

    from planner.runtime.mop import DEFAULT_LR, build_composed_step
    from planner.schema.io import load_planfile

    if steps < 1:
        raise InvalidPlan("--steps", steps, "must be >= 1", "give a number of steps")
    if layers is not None and layers < 1:
        raise InvalidPlan("--layers", layers, "must be >= 1", "give a depth of at least one layer, or drop --layers")
    pf = load_planfile(plan_path)
    if pf.plan.stack != "composed":
        raise InvalidPlan("plan.stack", pf.plan.stack, "planner.train runs the composed stack",
                          "write the plan with `planner search MODEL --gpus W --seq-len S --stack composed --out "
                          "plan.yaml`; `planner validate plan.yaml` runs an FSDP2 plan's own step")
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type not in ("cuda", "cpu"):
        raise InvalidPlan("--device", device_type, "must be cuda or cpu", "drop --device (cuda when a GPU is present)")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise InvalidPlan("--device", device_type, "needs a CUDA GPU, and this machine has none", "use --device cpu")
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) != pf.plan.world_size:
        raise InvalidPlan("plan.world_size", pf.plan.world_size,
                          f"must equal the launched ranks ({os.environ.get('WORLD_SIZE', '1')})",
                          f"torchrun --nproc_per_node={pf.plan.world_size} (or a plan for this world)")
    if device_type == "cuda":
        from planner.runtime import allocator

        line = allocator.configure(torch, pf.cluster.memory.expandable_segments)
        if int(os.environ.get("RANK", "0")) == 0:
            log(line)
    device = _init_dist(device_type)
    torch.manual_seed(seed)
    step = build_composed_step(pf, num_layers=layers, device=device, seed=seed, lr=lr or DEFAULT_LR)
    lay = step.layout
    per_step = lay.W * lay.batch * lay.tokens
    gbt = pf.workload.global_batch_tokens or per_step
    rank = dist.get_rank()
    shard = DataShard(rank, lay.W, rank // lay.D, rank % lay.D, lay.D, lay.batch, lay.tokens,
                      pf.workload.seq_len, pf.model.vocab_size, gbt // per_step, device)
    batches = iter((data or synthetic)(shard))
    losses = []
    try:
        for k in range(steps):
            tokens, targets = next(batches)
            t0 = time.perf_counter()
            loss = step.global_loss(step.step(tokens, targets))
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            losses.append(loss)
            if rank == 0:
                peak = (f" peak_allocated_gib {torch.cuda.max_memory_allocated() / 2**30:.3f}"
                        if device.type == "cuda" else "")
                log(f"step {k + 1} loss {loss:.4f} time_s {dt:.3f}{peak}")
    finally:
        step.close()
    return losses


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(plan: str = typer.Option(..., "--plan", help="Plan file (planner search --out)."),
         steps: int = typer.Option(10, "--steps", help="Optimizer steps."),
         layers: Optional[int] = typer.Option(None, "--layers", help="Truncate the depth to L layers."),
         data: Optional[str] = typer.Option(None, "--data", help="module:fn returning the batches of a DataShard (README: Training step and planner.train)."),
         device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu [default: cuda if present]."),
         lr: Optional[float] = typer.Option(None, "--lr", help="AdamW learning rate."),
         seed: int = typer.Option(0, "--seed", help="Initialisation and synthetic-data seed.")) -> None:
    """Train a plan file's composed step on synthetic tokens (or --data)."""
    try:
        fn = load_data_fn(data) if data else None
        run(plan, steps, layers=layers, data=fn, device_type=device, lr=lr, seed=seed)
    except PlanError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(e.exit_code)
    except ValueError as e:                      # operator argument checks (degrees, shapes)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def cli(argv: list[str] | None = None) -> int:
    """``python -m planner.train``: usage errors (an unknown option, a missing ``--plan``) exit 2
    with one ``error:`` line, as every ``planner`` command does."""
    from planner.errors import INTERRUPTED, usage_exception_types, usage_line

    usage_types, abort_types = usage_exception_types()
    try:
        rv = app(args=argv, prog_name="python -m planner.train", standalone_mode=False)
        return int(rv or 0)
    except typer.Exit as e:
        return e.exit_code
    except (KeyboardInterrupt, *abort_types):
        typer.echo("interrupted", err=True)
        return INTERRUPTED
    except usage_types as e:
        typer.echo(usage_line(e, "python -m planner.train"), err=True)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
