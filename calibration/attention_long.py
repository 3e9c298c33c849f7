"""Causal attention forward and backward at long ``S`` for the per-rank head counts of the shipped
models under Ulysses: the ``attention_long`` tables (``planner.schema.curves.LongAttentionTable``).

Variants: ``flash128`` (SDPA flash, ``d = 128``, ``h = h_kv``), ``mla`` (``d_qk = 192``,
``d_v = 128`` through the runtime's ``causal_attention``: the kernel it picks), ``sinks64``
(gpt-oss global layers: GQA 8:1, ``d = 64``, sink channels) and ``sliding64`` (gpt-oss local
layers, ``w = 128``, sinks). Points run in ascending ``S`` across variants, so a budget cut leaves
the same ``S`` range for all; a point that would pass the budget is skipped and named (the model
then applies its listed rule there). Points of ≥ ``wall_budget.ONE_SHOT_S`` are timed by one call.
"""

from __future__ import annotations

from calibration.wall_budget import Clock, timed

VARIANTS = {"sliding64": dict(heads=(1, 8), kv_div=8, d=64, dv=64, kind="runtime", sinks=True, window=128),
            "flash128": dict(heads=(1, 2, 8), kv_div=1, d=128, dv=128, kind="flash"),
            "mla": dict(heads=(1, 8), kv_div=1, d=192, dv=128, kind="runtime"),
            "sinks64": dict(heads=(1, 8), kv_div=8, d=64, dv=64, kind="runtime", sinks=True)}
"""Head counts per rank: 1 and 8 (2 for flash) span the shipped models' ``h/(tp·cp)`` at long context."""

FULL = dict(seqs=(65536, 131072, 262144, 524288, 1048576), beyond=(), variants=VARIANTS,
            beyond_variants=(), beyond_heads=())
BEYOND = dict(beyond=(2097152,), beyond_variants=("flash128", "mla"), beyond_heads=None)
"""Points past the complete grid (2M, at every head count of the variant: a table keeps only the
``S`` measured at all of them) that ``bench/calibrate_coverage.py`` adds where time is left;
``planner calibrate`` does not spend its budget on them."""
QUICK = dict(seqs=(65536, 131072, 262144), beyond=(), variants=VARIANTS, beyond_variants=(), beyond_heads=())
SMOKE = dict(seqs=(64, 128), beyond=(256,),
             variants={"flash128": dict(heads=(1, 2), kv_div=1, d=16, dv=16, kind="flash"),
                       "mla": dict(heads=(1, 2), kv_div=1, d=24, dv=16, kind="runtime"),
                       "sinks64": dict(heads=(2,), kv_div=2, d=8, dv=8, kind="runtime", sinks=True),
                       "sliding64": dict(heads=(2,), kv_div=2, d=8, dv=8, kind="runtime", sinks=True, window=16)},
             beyond_variants=("flash128",), beyond_heads=(1,))
GRIDS = {"full": FULL, "quick": QUICK, "smoke": SMOKE}
BUDGET_S = {"full": 240.0, "quick": 60.0, "smoke": 60.0}
"""Default wall budget of the section per grid (``planner calibrate --attention-budget-s``; a
policy). Measured before lengths were grouped by variant (fd1c3a1, which also timed three 1M
points no table kept): on an H100 (d700f3ef) 148 s of a 160 s budget reached every variant at
524,288 and the sliding window at 1,048,576; MLA at 8 heads and 1,048,576 alone took about 233 s of
wall time on an H200 (27 s forward + 151 s backward timed, the rest warm-up;
``bench/results/calibration/coverage/``). What the default 240 s reaches with the grouping is not
measured yet."""
MIN_TIME_S = {"full": 0.02, "quick": 0.02, "smoke": 0.002}
NOTE = ("causal, batch 1, [1, h, S, d]; fwd_s under no_grad, bwd_s = autograd.grad of the output for q, k, v "
        "(and the sink logits) with a random upstream gradient; causal_flops_* = "
        "planner.timing.curves.attention_flops × (d_qk + d_v)/(2·d_qk) (the dense causal work, not the band's "
        "for sliding64)")


def _case(v: dict, S: int, h: int, dev, dt):
    """``(forward, backward setup, backward, backend, kv heads)`` of one variant at ``(S, h)``."""
    import torch
    import torch.nn.functional as F

    from planner.runtime.sdpa import causal_attention

    hkv = max(1, h // v["kv_div"])
    q = torch.randn(1, h, S, v["d"], device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(1, hkv, S, v["d"], device=dev, dtype=dt, requires_grad=True)
    val = torch.randn(1, hkv, S, v["dv"], device=dev, dtype=dt, requires_grad=True)
    sink = torch.zeros(h, device=dev, dtype=torch.float32, requires_grad=True) if v.get("sinks") else None
    scale = v["d"] ** -0.5
    if v["kind"] == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [SDPBackend.FLASH_ATTENTION] if dev.type == "cuda" else [SDPBackend.MATH]

        def f():
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q, k, val, is_causal=True, scale=scale)
        backend = "SDPA flash" if dev.type == "cuda" else "SDPA math (CPU dry run)"
    else:
        def f():
            return causal_attention(q, k, val, scale=scale, window=v.get("window"), sink_h=sink)
        backend = "planner.runtime.sdpa.causal_attention (flash / memory-efficient)"
    inputs = [t for t in (q, k, val, sink) if t is not None]

    def fwd():
        with torch.no_grad():
            f()
    state = {}

    def bwd_setup():
        state["out"] = f()
        state["g"] = torch.randn_like(state["out"])

    def bwd():
        torch.autograd.grad(state["out"], inputs, state["g"], retain_graph=True)
    return fwd, bwd_setup, bwd, backend, hkv


def _guess(prev: tuple, S: int, v: dict) -> float:
    """Wall seconds of the next point from the previous ``(S, t_fwd, t_bwd)`` of the same variant
    and heads: ``∝ S²`` (``∝ S`` with a window); a forward with grad, then the timed forward and
    backward, each one call when it lasts ≥ ``ONE_SHOT_S``, else about four."""
    from calibration.wall_budget import ONE_SHOT_S

    S0, t_f, t_b = prev
    r = (S / S0) ** (1 if v.get("window") else 2)
    f, b = t_f * r, t_b * r
    return f + sum(t if t >= ONE_SHOT_S else 4 * t + 0.06 for t in (f, b))


def plan(cfg: dict) -> list[tuple[int, str, tuple[int, ...]]]:
    """``(S, variant, heads)`` groups in run order: ascending ``S`` across variants, the beyond points
    last. A table keeps an ``S`` only where every head count of its variant was measured, so a group
    is measured whole or skipped whole."""
    out = [(S, name, tuple(v["heads"])) for S in cfg["seqs"] for name, v in cfg["variants"].items()]
    return out + [(S, name, tuple(cfg["beyond_heads"] or cfg["variants"][name]["heads"]))
                  for S in cfg["beyond"] for name in cfg["beyond_variants"]]


def _point_guess(last: dict, name: str, h: int, S: int, v: dict) -> float:
    """``_guess`` from the same variant's last point at ``h`` heads, else from its nearest head count
    (``∝ h``); 0 for a variant not yet measured."""
    if (name, h) in last:
        return _guess(last[(name, h)], S, v)
    near = min((k for k in last if k[0] == name), key=lambda k: abs(k[1] - h), default=None)
    if near is None:
        return 0.0
    S0, t_f, t_b = last[near]
    return _guess((S0, t_f * h / near[1], t_b * h / near[1]), S, v)


def measure(cfg: dict, dev, clock: Clock, min_time_s: float, *, median_of: int = 1, partial=None, log=print) -> dict:
    """The section document ``{"rows", "note", "variants"}``; ``partial(section)`` after every point,
    so that a run cut short by a wall-clock kill keeps every point measured."""
    import torch

    from planner.timing.curves import attention_flops

    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows, last = [], {}
    for S, name, heads in plan(cfg):
        v = cfg["variants"][name]
        guess = sum(_point_guess(last, name, h, S, v) for h in heads)
        if not clock.fits(guess):   # the whole group: a table cannot use part of it
            clock.skip(f"attention {name} S={S} h={','.join(map(str, heads))}: "
                       + (f"~{guess:.1f} s would pass the section's budget" if guess > 0
                          else "the section's budget is spent"))
            continue
        for h in heads:
            prev = last.get((name, h))
            with clock.point(f"attention {name} S={S} h={h}", dev) as done:
                fwd, bwd_setup, bwd, backend, hkv = _case(v, S, h, dev, dt)
                if prev is None:       # first time at this (variant, h): load the kernels
                    fwd()
                t_f, n_f = timed(fwd, dev, min_time_s, median_of)
                bwd_setup()
                t_b, n_b = timed(bwd, dev, min_time_s, median_of)
                del fwd, bwd_setup, bwd
            if not done:
                continue
            last[(name, h)] = (S, t_f, t_b)
            widen = (v["d"] + v["dv"]) / (2 * v["d"])
            f_f = float(attention_flops(S, h, v["d"])) * widen
            f_b = float(attention_flops(S, h, v["d"], backward=True)) * widen
            row = dict(variant=name, seq_len=S, heads=h, kv_heads=hkv, d_qk=v["d"], d_v=v["dv"], window=v.get("window"),
                       sinks=bool(v.get("sinks")), backend=backend, fwd_s=t_f, bwd_s=t_b, fwd_calls=n_f, bwd_calls=n_b,
                       causal_flops_fwd=f_f, causal_flops_bwd=f_b,
                       fwd_tflops=f_f / t_f / 1e12, bwd_tflops=f_b / t_b / 1e12)
            rows.append(row)
            if partial is not None:
                partial({"rows": rows, "partial": True})
            log(f"attention {name:9s} S={S:>8d} h={h} (kv {hkv}): "
                f"fwd {t_f * 1e3:9.2f} ms ({row['fwd_tflops']:6.1f} TF/s), bwd {t_b * 1e3:9.2f} ms "
                f"({row['bwd_tflops']:6.1f} TF/s)")
    return {"rows": rows, "note": NOTE, "variants": cfg["variants"]}
