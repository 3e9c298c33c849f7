"""Live set ``ffn``: the working set of a dense FFN region and of a MoE region's shared experts
(composed stack, checkpointed regions).

Legend: ``N`` tokens per rank, ``H`` hidden, ``I_d`` dense FFN width, ``I_s`` shared-expert width
(all shared experts together), ``b`` bytes per scalar. Counted off the tensor inventory of the
decoder's gated FFN (``planner/runtime/model_layers.GatedMLP``: ``down(silu(gate(x)) ⊙ up(x))``)
inside a non-reentrant region checkpoint:

    forward[r]   normed input x N·H, gate(x), silu(gate(x)), up(x): 3·N·I        (b)
    backward[r]  saved gate, silu, up and the gradients of silu·up, silu and up: 6·N·I  (b)
                 (the recomputed normed input takes the place of the region input); a dense
                 FFN's later moments hold less activation beside more weight gradients, and
                 the larger binds (``dense_backward_moment``)

Every MLP-side region's backward first recomputes its input RMSNorm with grad, which saves the
fp32 input ``x.float()`` ``N·H`` (fp32) and the cast ``y.to(b)`` ``N·H`` (b) for the norm's
backward, live through the dispatch or FFN backward: the ``ffn_norm recompute`` terms. In a MoE
region the normed output and the gradient into it take the places of the region input and the
outgoing boundary gradient, which ``boundaries`` still counts there; a dense FFN region's backward
holds the normed output (gate's and up's saved input) as its own term, its restored input freed and
its outgoing gradient not yet made (``boundaries.PAST_RECOMPUTE``).

(the region's input, output and boundary gradients are ``boundaries``; its weights and their
unreduced gradients ``gathered``). Dense regions: ``I = I_d``; the forward is confirmed by the
region trace (``tests/trace/test_step_trace.py``), the backward by the H200 allocator history
of ``planner validate`` (deepseek-v2-lite backward[2]). Shared experts (``I = I_s``) run after the
routed experts, beside the routed output ``N·H`` (the region output): a MoE region holds the larger
of the shared experts' and the dispatch's sub-steps, so their terms are the excess over
``dispatch``. Their backward runs first (created last), and the gradient they send to the router's
input ``x_NH`` (``N·H``) waits in autograd's input buffer through the dispatch's backward.

The MLP-side forward's input RMSNorm (fp32 input, fp32 normed copy, cast, output) can exceed the
FFN/dispatch sub-step: its excess is a term (``_norm_forward_substep``); the router's input ``x_NH``
(the normed output) is held through the dispatch.

Without checkpointing these tensors are saved activations (``boundaries``); the FSDP2 baseline's
FFN sub-steps are in ``planner.budget.fsdp2_layer``.
"""

from __future__ import annotations

import numpy as np

from planner.context.ctx import Ctx
from planner.budget.dispatch_edges import books_own_grads, books_region_io
from planner.budget.terms import Phase, Term

SOURCE = "tensor inventory of planner/runtime/model_layers.py GatedMLP in a region checkpoint"
GATED_BWD = ("; H200 allocator history of planner validate, deepseek-v2-lite W1 backward[2] (dense FFN): "
             "model_layers.py:109 3 × 1368 MiB (gate, silu, up = N·I_d each), MulBackward0 2 × 1368, "
             "MmBackward0 1368 (the gradient of silu·up); the recomputed normed input takes the place of "
             "the region input, which is not live then")
SHARED_SRC = ("; the shared experts run after the routed experts (moe_block.py:143), so the phase holds the "
              "larger of the two sub-steps: deepseek-v2-lite W1 forward[4] holds model_layers.py:109 3 × 352 MiB "
              "beside the dispatcher's output and no dispatch buffer; backward[4] 3 × 352 + MulBackward0 2 × 352 "
              "+ MmBackward0 352; the routed output is the region output (boundaries)")
SHARED_HELD = ("; the shared experts ran after the routed experts, so autograd runs their backward first and "
               "holds the gradient they send to x_NH in the input buffer of x_NH until the dispatcher's backward "
               "adds its own: the H200 validate run of deepseek-v2-lite at W = 8 and 64 (the dispatch sub-step "
               "binds) measured backward[4] above a budget without it by 61, 35, 32 and 17 MiB at N = 16384, "
               "8192, 8192 and 4096 (N·H·b = 64, 32, 32, 16 MiB)")
DENSE_NORMED = ("; deepseek-v2-lite-W1 backward[2] (dense FFN): model_layers.py:74 2 × 256 MiB (the cast and "
                "the normed output) beside one incoming boundary gradient and one SCO prefetch: the region input "
                "is freed and the outgoing gradient not yet made (boundaries.PAST_RECOMPUTE)")
NORM_SOURCE = ("planner/runtime/model_layers.py RMSNorm recomputed with grad in the region's backward; "
               "H200 allocator history of planner validate (gpt-oss-W8 backward[4], [2]: model_layers.py:72 "
               "180 MiB = N·H fp32, :74 2 × 90 MiB = the cast and the normed output)")


RETAINED_NORMED = ("; a MoE region's recomputed normed output takes the place of SCO's restored input, which is "
                   "freed after the recompute, but not of a retained one (per_layer, or r > n_off): H200 allocator "
                   "history of gpt-oss-20b W = 16 S = 32768 per_layer backward[4] (bench/results/memory_snapshot/"
                   "gptoss-W16-S32768-per-layer.json: model_layers.py:74 2 × N·H beside the four retained boundaries; "
                   "validate_heldout_r4.json 0.988 without it)")
MOE_NORM_BWD = ("; H200 allocator histories of planner validate (qwen3-W1-S65536 backward[4], "
                "deepseek-v2-lite-W1-S65536 backward[4], qwen3-W8-S131072 backward[4] and [2]) at the MoE "
                "region's norm backward: PowBackward0 3 × N·H fp32, MulBackward0 and MeanBackward1 N·H fp32 each, "
                "model_layers.py:72 N·H fp32, one ToCopyBackward0 N·H (b) and one sco.py restore block (the "
                "prefetch); no second gradient and no restored region input")


DENSE_LATE = ("; at small N a later moment binds: DeepSeek-V2-Lite W = 16, S = 8192 (N = 512) backward[2] "
              "measured 675.1 MiB on the H200 (validate_heldout_r2.json) and in the whole-step trace, where "
              "6·N·I_d beside all three weight gradients had booked 723.2")
DENSE_BWD_FORMULA = ("the larger moment of the backward (activations + the weight gradients made then): "
                     "6·N·I_d + H·I_d (mul's backward: gate, silu, up and the gradients of silu·up, silu, up; "
                     "w_down's gradient) or N·H + N·max(I_d, H) + 3·H·I_d (gate's backward: the gradient of "
                     "gate and the two input gradients, then their sum; all three weight gradients); the "
                     "activations of the binding one here, its gradients in gathered")


def dense_backward_moment(ctx: Ctx):
    """The gated MLP backward's binding moment (``down(silu(gate(x)) ⊙ up(x))``; autograd runs down,
    mul, up, silu, gate): its activations beyond the booked incoming gradient, and the weight
    gradients not yet made then, in elements (``DENSE_BWD_FORMULA``). The incoming gradient
    (``boundaries``) is freed after down's backward and up's input gradient takes its place; gate's
    input gradient and then their sum (gate's own gradient freed) follow it; up's
    own moment (``3·N·I_d + 2·H·I_d``) is never the larger of the two: above mul's it needs
    ``H > 3·N``, above gate's ``2·N·I_d > H·(N + I_d)``, which ``H > 3·N`` rules out."""
    N = np.asarray(ctx.tokens_per_rank)
    H, I = ctx.hidden_size, ctx.dense_ffn
    late = N * H + N * max(I, H)             # gate's backward, or the sum of the two input gradients
    gate = late + 2 * H * I > 6 * N * I      # above mul's moment (ties: mul's)
    act, missing = np.where(gate, late, 6 * N * I), np.where(gate, 0, 2 * H * I)
    return (act, missing) if N.ndim else (int(act), int(missing))


def terms(ctx: Ctx) -> list[Term]:
    """FFN working-set terms of one rank (composed stack, checkpointed regions)."""
    if ctx.stack == "fsdp2":   # the baseline's FFN sub-steps: planner.budget.fsdp2_layer
        return []
    if ctx.checkpoint == "none":
        return []
    from planner.budget import dispatch

    N, H, b, m = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes, ctx.model
    disp = dispatch.terms(ctx)      # evaluated once: the shared experts' and the norms' sub-steps read it
    mlp = tuple(k for k in ("moe", "dense_mlp") if k in set(ctx.regions))
    out: list[Term] = [
        Term("ffn_norm recompute: saved fp32 input x.float()", "ffn", N * H, 4, "N·H (fp32)", ("backward",),
             regions=mlp, source=NORM_SOURCE),
        Term("ffn_norm recompute: saved cast y.to(b)", "ffn", N * H, b, "N·H", ("backward",), regions=mlp,
             source=NORM_SOURCE),
    ] if mlp else []
    if "dense_mlp" in set(ctx.regions):
        I_d = ctx.dense_ffn
        out += [
            Term("dense FFN forward: normed input, gate, silu, up", "ffn", N * (H + 3 * I_d), b,
                 "N·(H + 3·I_d)", ("forward",), regions=("dense_mlp",), source=SOURCE),
            Term("dense FFN backward: the gated MLP's binding moment (activations beside the gradients made)",
                 "ffn", dense_backward_moment(ctx)[0], b, DENSE_BWD_FORMULA, ("backward",), regions=("dense_mlp",),
                 source=SOURCE + GATED_BWD + DENSE_LATE),
            Term("ffn_norm recompute: saved normed output (gate and up's input)", "ffn", N * H, b, "N·H",
                 ("backward",), regions=("dense_mlp",), source=NORM_SOURCE + DENSE_NORMED),
        ]
    if "moe" in set(ctx.regions):
        out.append(Term("ffn_norm output x_NH (the router's and dispatcher's input)", "ffn", N * H, b, "N·H",
                        ("forward",), regions=("moe",), source=NORM_SOURCE + "; forward[2]: model_layers.py:74 "
                        "90 MiB beside the dispatch buffers"))
        n_off = np.asarray(ctx.num_offloaded if ctx.checkpoint == "sco" else 0)
        out.append(Term("ffn_norm recompute: normed output x_NH, beside a retained region input", "ffn",
                        np.where(np.asarray(ctx.num_boundaries) > n_off, N * H, 0), b,
                        "N·H if r > n_off (per_layer: every region)", ("backward",), regions=("moe",),
                        at=lambda ph: np.where(ph.region > n_off, N * H, 0), source=NORM_SOURCE + RETAINED_NORMED))
    I_s = m.shared_expert_ffn
    if I_s and "moe" in set(ctx.regions):
        d_fwd, d_bwd = (_interior(ctx, disp, k, "moe") for k in ("forward", "backward"))
        # freed gradients: the routed experts' gradients of this region first exist in the dispatch's
        # backward, after the shared experts' (persistent counts them in the whole backward[r], but
        # under LLEP and standard EP dispatch does, from when they are made)
        eg = (_own_expert_grad_bytes(ctx) if ctx.grad_lifetime == "freed" and not books_own_grads(ctx)
              else 0)
        fw = _excess(3 * N * I_s * b, d_fwd, b)
        # the region's outgoing boundary gradient (counted by ``boundaries``, but by dispatch under LLEP
        # and standard EP) is made only at the norm's backward, after the experts: not live at the
        # shared experts' backward
        out_g = 0 if books_region_io(ctx) else N * H * b
        bw = _excess(6 * N * I_s * b - out_g, d_bwd + eg + N * H * b, b)
        out += [
            Term("shared experts' input gradient, held through the dispatch backward", "ffn", N * H, b, "N·H",
                 ("backward",), regions=("moe",), source=SOURCE + SHARED_HELD),
            Term("shared experts forward: gate, silu, up (excess over the dispatch sub-step)", "ffn", fw, b,
                 "max(0, 3·N·I_s·b − dispatch forward)/b", ("forward",), regions=("moe",), source=SOURCE
                 + SHARED_SRC),
            Term("shared experts backward: saved gate, silu, up and 3 gradients (excess over the dispatch)",
                 "ffn", bw, b, "max(0, 6·N·I_s·b − N·H·b (outgoing gradient not yet made) − dispatch backward − N·H·b [− b·Θ_exp_layer/E_p, freed])/b", ("backward",), regions=("moe",),
                 source=SOURCE + SHARED_SRC + GATED_BWD),
        ]
    return out + _norm_forward_substep(ctx, out, disp) + _norm_backward_substep(ctx, out, disp)


def _norm_backward_substep(ctx: Ctx, own: list[Term], disp: list[Term]) -> list[Term]:
    """The MLP-side region's backward ends with its input RMSNorm's backward in fp32: the saved fp32
    input and five fp32 temporaries over ``N·H`` (as QK-norm's over q: PowBackward0 3×, MulBackward0,
    MeanBackward1 in qwen3-W1 backward[3]), beside the gradients it holds: in a MoE region one
    (``N·H`` b, the input gradient's cast, ToCopyBackward0; the incoming boundary gradient, the
    normed output's gradient and the restored region input are freed by then: ``MOE_NORM_BWD``), in
    a dense FFN region two. The interior it follows holds the norm's saved fp32 input and cast, the
    region input and the boundary gradients (``boundaries``) and the FFN/dispatch backward; the term
    is the norm backward's excess over that interior, per kind."""
    N, H, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    ts = [t for t in (*own, *disp) if not t.name.startswith("ffn_norm recompute")]
    # (sub-step, what the interior phase already counts beside the interior), bytes per N·H: a MoE
    # region counts the norm's fp32 input and cast, the region input and 2 boundary gradients; a
    # dense one the fp32 input, cast and normed output and the incoming gradient, its sub-step the
    # outgoing gradient too (boundaries.PAST_RECOMPUTE)
    # (LLEP, standard EP: one boundary gradient; with freed gradients the region's own expert
    # gradients, which persistent leaves to dispatch, are made by then: dispatch_edges)
    io = books_region_io(ctx)
    per = {"moe": (24 + b, 4 + 3 * b if io else 4 + 4 * b,
                   "max(0, N·H·(24 + b) − N·H·(4 + 4b) − interior)/b" if not io else
                   "max(0, N·H·(24 + b) [+ b·Θ_exp_layer/E_p, freed] − N·H·(4 + 3b) − interior)/b"),
           "dense_mlp": (24 + 3 * b, 4 + 3 * b, "max(0, N·H·(24 + 3b) − N·H·(4 + 3b) − interior)/b")}
    out = []
    for kind in _mlp_kinds(ctx):
        sub, held, text = per[kind]
        eg = _own_expert_grad_bytes(ctx) if kind == "moe" and books_own_grads(ctx) else 0
        v = _excess(N * H * sub + eg, N * H * held + _interior(ctx, ts, "backward", kind), b)
        out.append(Term(f"ffn_norm backward sub-step: fp32 input and 5 fp32 temporaries, 2 gradients (excess, {kind})",
                        "ffn", v, b, text + "  (interior: ffn + dispatch backward of the region)", ("backward",),
                        regions=(kind,), provisional=kind != "moe",
                        source=NORM_SOURCE + "; the fp32 backward of planner/runtime/model_layers.py RMSNorm"
                        + (MOE_NORM_BWD if kind == "moe" else "")))
    return out


def _own_expert_grad_bytes(ctx: Ctx):
    """Bytes of one MoE region's expert gradients on this rank, ``b·Θ_exp_layer/E_p``."""
    m = ctx.model
    return m.num_experts * m.expert_params() // np.asarray(ctx.expert_parallel) * ctx.act_bytes


def _mlp_kinds(ctx: Ctx) -> list[str]:
    """The MLP-side region kinds of ``ctx``, MoE first."""
    return [k for k in ("moe", "dense_mlp") if k in set(ctx.regions)]


def _interior(ctx: Ctx, ts: list[Term], phase_kind: str, kind: str):
    """Bytes of ``ts`` in ``phase_kind`` of the first region of ``kind``."""
    ph = Phase(phase_kind, 1 + ctx.regions.index(kind), kind)
    return sum((np.asarray(t.bytes_in(ph), dtype=np.int64) for t in ts), np.int64(0))


def _excess(sub, other, b):
    v = np.maximum(np.asarray(sub, dtype=np.int64) - np.asarray(other, dtype=np.int64), 0)
    v = -(-v // b)
    return int(v) if np.ndim(v) == 0 else v


def _norm_forward_substep(ctx: Ctx, own: list[Term], disp: list[Term]) -> list[Term]:
    """The MLP-side region's forward holds the larger of two sub-steps: its input RMSNorm (the fp32
    input and the fp32 normed copy, the cast and the weighted output: ``N·H`` fp32 ×2 and ``N·H`` b
    ×2, the region output not yet made) and the FFN/dispatch sub-step (the region output, which
    ``boundaries`` counts, and the interior: these ``ffn`` terms and ``dispatch``). The term is the
    norm sub-step's excess, per region kind."""
    N, H, b = ctx.tokens_per_rank, ctx.hidden_size, ctx.act_bytes
    norm = N * H * (8 + 2 * b)                          # bytes
    ts = [*own, *disp]   # the shared experts' term is already their excess over dispatch
    out = []
    for kind in _mlp_kinds(ctx):
        # the region output, booked by boundaries (by dispatch under LLEP and standard EP)
        region_out = 0 if kind == "moe" and books_region_io(ctx) else N * H * b
        v = _excess(norm, region_out + _interior(ctx, ts, "forward", kind), b)
        out.append(Term(f"ffn_norm forward sub-step: fp32 input and normed copy, cast, output (excess, {kind})",
                        "ffn", v, b,
                        "max(0, N·H·(8 + 2b) − N·H·b − interior)/b  (interior: ffn + dispatch of the region)",
                        ("forward",), regions=(kind,), source=NORM_SOURCE + "; qwen3-W1 forward[2]: the peak "
                        "is inside ffn_norm, model_layers.py:72/73/74 = 512 + 512 + 2 × 256 MiB"))
    return out
