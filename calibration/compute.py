"""Compute-rate microbenchmarks: dense GEMM, grouped expert GEMM and causal flash attention.

Each returns a ``RateTable`` of achieved FLOP/s on the grid of ``calibration.config``. Operands
are views into buffers allocated once at the largest shape and filled with random values (rates
on zeros are optimistic). FLOP conventions are ``planner.timing.curves``'s.

- GEMM: ``torch.mm(A[m,k], B[k,n])`` in bf16 on a GPU (fp32 on the CPU).
- fp32 GEMM (``gemm_fp32``): the same in fp32 with TF32 off, the rate of the fp32 vocabulary
  heads. Also runnable alone, writing a profile fragment for ``calibration.merge``::

      python3 -m calibration.compute --fp32-gemm [--quick|--smoke] --out $OUT/gemm_fp32.yaml
- Grouped GEMM: ``torch._grouped_mm(A[g·t,k], B[g,k,n], offs)`` when torch has it and it runs
  on this device, else a loop of ``torch.mm``; the table's ``backend`` says which.
- Attention: ``scaled_dot_product_attention(is_causal=True)`` under the flash backend on a GPU
  (the default backend on the CPU), batch 1, ``q, k, v`` of ``[1, h, S, d]``; the backward is
  ``torch.autograd.grad`` of the output for ``q, k, v`` with the graph retained.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable

import torch

from calibration.config import Grid
from planner.runtime.measure import time_rep
from planner.timing.curves import RateTable, attention_flops, gemm_flops, grouped_gemm_flops

Tick = Callable[[int], None]


def _dtype(device: torch.device) -> tuple[torch.dtype, str]:
    return (torch.bfloat16, "bf16") if device.type == "cuda" else (torch.float32, "fp32")


def _nested(values: dict, axes: list[tuple[int, ...]]):
    def build(prefix, depth):
        if depth == len(axes):
            return values[prefix]
        return [build(prefix + (v,), depth + 1) for v in axes[depth]]
    return build((), 0)


def _rand(shape, dtype, device) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, device=device)


def _gemm_rates(ms, ns, ks, dtype, device, grid: Grid, tick: Tick) -> dict:
    """FLOP/s of ``torch.mm`` at every ``(m, n, k)``, on slices of three buffers sized once."""
    a_buf = _rand(max(ms) * max(ks), dtype, device)
    b_buf = _rand(max(ks) * max(ns), dtype, device)
    c_buf = torch.empty(max(ms) * max(ns), dtype=dtype, device=device)
    rates = {}
    for m, n, k in itertools.product(ms, ns, ks):
        a, b = a_buf[: m * k].view(m, k), b_buf[: k * n].view(k, n)
        c = c_buf[: m * n].view(m, n)
        t = time_rep(lambda: torch.mm(a, b, out=c), min_time_s=grid.min_time_s, iters=grid.iters, device=device)
        rates[(m, n, k)] = float(gemm_flops(m, n, k)) / t
        tick(1)
    return rates


def gemm_table(grid: Grid, device: torch.device, prov: dict, tick: Tick) -> RateTable:
    """Dense GEMM rates over ``m × n × k``."""
    dtype, name = _dtype(device)
    rates = _gemm_rates(grid.gemm_m, grid.gemm_n, grid.gemm_k, dtype, device, grid, tick)
    axes = [grid.gemm_m, grid.gemm_n, grid.gemm_k]
    return RateTable(axis_names=["m", "n", "k"], axes=[list(a) for a in axes],
                     flops_per_s=_nested(rates, axes), dtype=name, backend="torch.mm",
                     provenance=prov, note=f"C[m,n] = A[m,k] @ B[k,n], row-major, {name}, random operands")


@contextlib.contextmanager
def _no_tf32():
    """fp32 matmuls in full precision (TF32 off) inside the block; restores the setting. Uses the
    ``fp32_precision`` API where torch has it (mixing it with ``allow_tf32`` is an error there)."""
    mm = torch.backends.cuda.matmul
    key, off = ("fp32_precision", "ieee") if hasattr(mm, "fp32_precision") else ("allow_tf32", False)
    prev = getattr(mm, key)
    setattr(mm, key, off)
    try:
        yield
    finally:
        setattr(mm, key, prev)


def tf32_state():
    """The fp32 matmul setting ``_no_tf32`` changes (for the provenance note and the tests)."""
    mm = torch.backends.cuda.matmul
    return getattr(mm, "fp32_precision", None) or getattr(mm, "allow_tf32")


def gemm_fp32_table(grid: Grid, device: torch.device, prov: dict, tick: Tick) -> RateTable:
    """fp32 GEMM rates (TF32 off) over ``gemm_fp32_m × gemm_fp32_n × gemm_fp32_k``."""
    ms, ns, ks = grid.gemm_fp32_m, grid.gemm_fp32_n, grid.gemm_fp32_k
    assert ms and ns and ks, "this grid measures no fp32 GEMM"
    with _no_tf32():
        rates = _gemm_rates(ms, ns, ks, torch.float32, device, grid, tick)
    axes = [ms, ns, ks]
    return RateTable(axis_names=["m", "n", "k"], axes=[list(x) for x in axes], flops_per_s=_nested(rates, axes),
                     dtype="fp32", backend="torch.mm, TF32 off", provenance=prov,
                     note="C[m,n] = A[m,k] @ B[k,n], row-major, fp32, TF32 off, random operands")


def _grouped_fn(a, b, offs, groups: int, tokens: int):
    """The grouped GEMM as ``torch._grouped_mm`` or, failing that, a loop of ``torch.mm``."""
    def loop():
        return [torch.mm(a[i * tokens:(i + 1) * tokens], b[i]) for i in range(groups)]

    if hasattr(torch, "_grouped_mm"):
        def fused():
            return torch._grouped_mm(a, b, offs=offs)
        return fused, loop
    return None, loop


def grouped_gemm_table(grid: Grid, device: torch.device, prov: dict, tick: Tick) -> RateTable:
    """Grouped expert GEMM rates over ``tokens_per_group × groups × n × k`` (equal groups)."""
    dtype, name = _dtype(device)
    t_max, g_max, nk_max = max(grid.grouped_tokens), max(grid.grouped_groups), max(grid.grouped_nk)
    a_buf = _rand(t_max * g_max * nk_max, dtype, device)
    b_buf = _rand(g_max * nk_max * nk_max, dtype, device)
    rates, backends = {}, set()
    for t, g, n, k in itertools.product(grid.grouped_tokens, grid.grouped_groups,
                                        grid.grouped_nk, grid.grouped_nk):
        a = a_buf[: g * t * k].view(g * t, k)
        b = b_buf[: g * k * n].view(g, k, n)
        offs = torch.arange(1, g + 1, device=device, dtype=torch.int32) * t
        fused, loop = _grouped_fn(a, b, offs, g, t)
        fn, backend = loop, "loop of torch.mm"
        if fused is not None:
            try:
                fused()
                fn, backend = fused, "torch._grouped_mm"
            except (RuntimeError, NotImplementedError):
                pass
        backends.add(backend)
        sec = time_rep(fn, min_time_s=grid.min_time_s, iters=grid.iters, device=device)
        rates[(t, g, n, k)] = float(grouped_gemm_flops(t, g, n, k)) / sec
        tick(1)
    del a_buf, b_buf
    axes = [grid.grouped_tokens, grid.grouped_groups, grid.grouped_nk, grid.grouped_nk]
    return RateTable(axis_names=["tokens_per_group", "groups", "n", "k"], axes=[list(a) for a in axes],
                     flops_per_s=_nested(rates, axes), dtype=name, backend=" + ".join(sorted(backends)),
                     provenance=prov,
                     note=f"A[groups·tokens, k] @ B[groups, k, n] with equal groups, offs int32, {name}")


def _flash_ctx(device: torch.device):
    """Force the flash backend on CUDA (an error, not a silent fallback, if it cannot run)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def attention_tables(grid: Grid, device: torch.device, prov: dict,
                     tick: Tick) -> tuple[RateTable, RateTable]:
    """Causal attention forward and backward rates over ``seq_len × heads × head_dim``."""
    dtype, name = _dtype(device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd, bwd = {}, {}
    backend = "SDPA flash" if device.type == "cuda" else "SDPA default (CPU)"
    for s, h, d in itertools.product(grid.attn_seq, grid.attn_heads, grid.attn_head_dim):
        q, k, v = (_rand((1, h, s, d), dtype, device).requires_grad_() for _ in range(3))
        with _flash_ctx(device):
            with torch.no_grad():
                t_f = time_rep(lambda: sdpa(q, k, v, is_causal=True), min_time_s=grid.min_time_s,
                               iters=grid.iters, device=device)
            out = sdpa(q, k, v, is_causal=True)
            g_out = torch.randn_like(out)
            t_b = time_rep(lambda: torch.autograd.grad(out, (q, k, v), g_out, retain_graph=True),
                           min_time_s=grid.min_time_s, iters=grid.iters, device=device)
        fwd[(s, h, d)] = float(attention_flops(s, h, d)) / t_f
        bwd[(s, h, d)] = float(attention_flops(s, h, d, backward=True)) / t_b
        del q, k, v, out, g_out
        tick(1)
    axes = [grid.attn_seq, grid.attn_heads, grid.attn_head_dim]
    common = dict(axis_names=["seq_len", "heads", "head_dim"], axes=[list(a) for a in axes],
                  dtype=name, backend=backend, provenance=prov)
    note = f"causal, batch 1, q/k/v [1, h, S, d] {name}, heads = kv heads"
    return (RateTable(flops_per_s=_nested(fwd, axes), note=note + "; FLOPs 2·S²·h·d", **common),
            RateTable(flops_per_s=_nested(bwd, axes), note=note + "; FLOPs 5·S²·h·d", **common))


def counts(grid: Grid) -> dict[str, int]:
    """Progress units of each section here."""
    return {"gemm": len(grid.gemm_m) * len(grid.gemm_n) * len(grid.gemm_k),
            "gemm_fp32": len(grid.gemm_fp32_m) * len(grid.gemm_fp32_n) * len(grid.gemm_fp32_k),
            "grouped_gemm": len(grid.grouped_tokens) * len(grid.grouped_groups) * len(grid.grouped_nk) ** 2,
            "attention": len(grid.attn_seq) * len(grid.attn_heads) * len(grid.attn_head_dim)}


def main(argv: list[str] | None = None) -> int:
    """``python -m calibration.compute --fp32-gemm --out FILE [--quick|--smoke]``: measure the fp32
    GEMM table alone and write a profile fragment (``schema_version``, ``curves.gemm_fp32``)
    atomically, for ``python -m calibration.merge PROFILE FILE``."""
    import argparse
    import sys

    from calibration import config
    from calibration.io import command_line, write_yaml_atomic
    from planner.runtime.measure import provenance
    from planner.schema.base import SCHEMA_VERSION

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m calibration.compute", description=main.__doc__)
    ap.add_argument("--fp32-gemm", action="store_true", required=True, help="the fp32 GEMM table")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    grid = config.SMOKE if args.smoke else (config.QUICK if args.quick else config.FULL)
    if not cuda and not args.smoke:
        print("error: --fp32-gemm needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    prov = provenance(command_line("python3 -m calibration.compute", argv))
    table = gemm_fp32_table(grid, device, prov, lambda n: None)
    write_yaml_atomic(args.out, {"schema_version": SCHEMA_VERSION,
                                 "curves": {"gemm_fp32": table.model_dump(mode="json")}})
    print(f"wrote {args.out}: gemm_fp32 {len(grid.gemm_fp32_m)}x{len(grid.gemm_fp32_n)}x{len(grid.gemm_fp32_k)} "
          f"points on {prov['device']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
