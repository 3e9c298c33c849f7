"""The dispatch plans alone (torch-free): routing profiles, LLEP assignment, chunking bounds, and
the dispatch terms' guarantee against the plan-evaluated expected size (DESIGN §3.2, §7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.budget import dispatch as bd
from planner.budget import dispatch_inventory as inv
from planner.errors import InvalidPlan
from planner.plans import chunking, dispatch, llep, routing

PROPERTY_EXAMPLES = 2500
"""Random and adversarial routings checked by the plan property test."""
GUARANTEE_EXAMPLES = 300
"""Random shapes and knobs checked by guarantee ≥ expected."""
STRIDED_VS_CONTIGUOUS = {"A": 0.4, "B": 0.6}
"""On skewed profiles the strided max/mean send ratio stays below this share of contiguous's
(shape A, K=10: the paper's 2.40 against 6.00; shape B has only K=3 chunks)."""
PROFILES = ("balanced", "30/16", "80/16", "95/16", "50/4", "one_expert", "one_rank")
SHAPES = {"A": dict(N=65536, H=7168, I=2048, E=128, k=8, E_p=8, c=6554),
          "B": dict(N=32768, H=4096, I=4096, E=128, k=4, E_p=8, c=10923)}


# ---- routing profiles ------------------------------------------------------------------------------
def test_profiles_follow_design_definitions():
    ids = routing.expert_ids("balanced", 5, 8, 3)
    assert ids.tolist()[4] == [4, 5, 6]
    ids = routing.expert_ids("80/16", 10, 64, 4)        # first floor(0.8·10) = 8 tokens hot
    assert (ids[:8] == [0, 1, 2, 3]).all()
    assert ids[8].tolist() == [16 + (8 + j) % 48 for j in range(4)]
    assert (routing.expert_ids("one_expert", 7, 16, 2) == 0).all()
    assert set(routing.expert_ids("one_rank", 9, 16, 3, 4).reshape(-1).tolist()) <= {0, 1, 2, 3}
    assert (routing.expert_ids("50/4", 4, 16, 8)[:2] == [0, 1, 2, 3, 0, 1, 2, 3]).all()


def test_bad_profile_is_rejected():
    with pytest.raises(InvalidPlan, match=r"routing \('hot'\) must be"):
        routing.parse_profile("hot")
    with pytest.raises(InvalidPlan, match="hot experts must be <= num_experts"):
        routing.expert_ids("50/99", 4, 16, 2)


def test_counts_match_ids():
    ids = [routing.expert_ids(p, 37, 24, 3, 4) for p in ("balanced", "80/16")]
    c = routing.counts_from_ids(ids, 24)
    assert c.shape == (2, 24) and c.sum() == 2 * 37 * 3
    assert (c[1, 3:16] == 0).all()                        # 80/16 with k=3 uses hot experts 0..2


# ---- chunking -----------------------------------------------------------------------------------------
def test_chunk_count_and_size():
    assert chunking.num_chunks(65536, 6554, 10) == 10 and chunking.chunk_tokens(65536, 10) == 6554
    assert chunking.num_chunks(32768, 10923, 10) == 3
    assert chunking.num_chunks(0, 4096, 10) == 1
    assert chunking.num_chunks(8192, 4096, 10) == 2 and chunking.num_chunks(8193, 4096, 10) == 3
    assert chunking.chunk_tokens(8193, 3) == 2731
    k = chunking.num_chunks(np.array([100, 8193, 10**6]), 4096, 10)
    assert k.tolist() == [1, 3, 10]
    assert chunking.strided_members(10, 3, 1).tolist() == [1, 4, 7]
    assert chunking.contiguous_members(10, 3, 1).tolist() == [4, 5, 6, 7]


# ---- LLEP knobs --------------------------------------------------------------------------------------
def test_llep_rejects_bad_knobs():
    with pytest.raises(InvalidPlan, match=r"llep_alpha \(0.5\) must be >= 1"):
        llep.assign(np.ones(8, np.int64), 2, alpha=0.5)
    with pytest.raises(InvalidPlan, match="must divide model.num_experts"):
        llep.assign(np.ones(9, np.int64), 2)


def test_llep_skipped_below_lambda_and_caps_above():
    a = llep.assign(np.array([10, 10, 12, 10]), 2, min_tokens=1, lam=1.3)
    assert not a.active                                   # max/mean = 22/21 < 1.3
    a = llep.assign(np.array([100, 100, 0, 0]), 2, min_tokens=1, lam=1.3)
    assert a.active and a.load.tolist() == [100, 100] and a.imports == ((), (1,))


# ---- the plan's invariants over many routings ---------------------------------------------------
@st.composite
def routings(draw):
    E_p = draw(st.sampled_from([1, 2, 3, 4, 8]))
    n = draw(st.integers(1, 6))
    E, k = E_p * n, draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["random", "zipf", "one_expert", "one_rank", "profile"]))
    tokens = [draw(st.integers(0, 300)) for _ in range(E_p)]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if kind == "profile":
        prof = draw(st.sampled_from(["balanced", "30/4", "80/2", "95/1", "one_expert", "one_rank"]))
        hot = routing.parse_profile(prof)[2]
        if hot > E:
            prof = "balanced"
        ids = [routing.expert_ids(prof, t, E, k, E_p) for t in tokens]
    elif kind == "random":
        ids = [rng.integers(0, E, (t, k)) for t in tokens]
    elif kind == "zipf":
        p = 1.0 / np.arange(1, E + 1) ** draw(st.floats(0.5, 3.0))
        ids = [rng.choice(E, (t, k), p=p / p.sum()) for t in tokens]
    else:
        ids = [routing.expert_ids(kind, t, E, k, E_p) for t in tokens]
    counts = routing.counts_from_ids(ids, E)
    knobs = dict(token_budget=draw(st.integers(1, 200)), max_chunks=draw(st.integers(1, 12)),
                 alpha=draw(st.sampled_from([1.0, 1.1, 1.5])), min_tokens=draw(st.integers(1, 64)),
                 lam=draw(st.sampled_from([1.0, 1.3, 2.0])), max_imports=draw(st.integers(0, 5)),
                 membership=draw(st.sampled_from(list(chunking.MEMBERSHIPS))))
    return counts, k, knobs


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routings())
def test_plan_bounds_hold_for_every_routing(case):
    counts, k, knobs = case
    p = dispatch.plan_layer(counts, top_k=k, operator="pipelined_llep", **knobs)
    a = p.assignment
    W, E = counts.shape
    n_max = int(counts.sum(1).max()) // k
    K = p.num_chunks
    c_eff = chunking.chunk_tokens(n_max, K)
    assert K == chunking.num_chunks(n_max, knobs["token_budget"], knobs["max_chunks"])
    send = p.send_KWW
    assert (send.sum(2) <= k * c_eff).all()               # a source sends ≤ k·c_eff per chunk
    assert (send.sum(1) <= W * k * c_eff).all()           # a destination receives ≤ E_p·k·c_eff
    assert (p.num_imports_W() <= knobs["max_imports"]).all()
    assert p.seg_WWS.sum() == counts.sum() and (p.chunk_KWWS.sum(0) == p.seg_WWS).all()
    for e, hs in enumerate(a.holders):                    # every route computed exactly once
        assert sum(c for _, c in hs) == counts[:, e].sum()
    assert (p.recv_total_W() == a.load).all()
    for s in range(W):                 # the pieces tile both the expert-sorted and the send order
        pcs = p.source_pieces(s)
        assert pcs[:, 2].sum() == counts[s].sum()
        for col in (0, 1):
            o = pcs[np.argsort(pcs[:, col])]
            assert (o[:, col] == np.cumsum(o[:, 2]) - o[:, 2]).all()
    bound = llep.residue_bound_routes(k, n_max, E, W, knobs["alpha"], knobs["lam"], knobs["min_tokens"])
    if a.unplaced == 0:
        assert a.load.max() <= bound
    if knobs["max_imports"] >= E:                          # enough slots: nothing is left behind
        assert a.unplaced == 0


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("profile", ["30/16", "80/16", "95/16", "50/4"])
def test_strided_chunks_keep_sends_even(shape, profile):
    g = SHAPES[shape]
    counts = routing.profile_counts(profile, g["N"], g["E"], g["k"], g["E_p"])
    ratio = {m: dispatch.plan_layer(counts, top_k=g["k"], operator="pipelined_llep",
                                    token_budget=g["c"], membership=m).max_send_ratio()
             for m in chunking.MEMBERSHIPS}
    assert ratio["strided"] <= STRIDED_VS_CONTIGUOUS[shape] * ratio["contiguous"], ratio


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("profile", PROFILES)
def test_reference_profiles_place_every_excess(shape, profile):
    g = SHAPES[shape]
    counts = routing.profile_counts(profile, g["N"], g["E"], g["k"], g["E_p"])
    p = dispatch.plan_layer(counts, top_k=g["k"], operator="pipelined_llep", token_budget=g["c"])
    assert p.assignment.unplaced == 0
    assert p.num_imports_W().max() <= 4


# ---- guarantee ≥ expected ------------------------------------------------------------------------
@st.composite
def shapes_and_knobs(draw):
    E_p = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(1, 8))
    g = dict(N=draw(st.integers(1, 4000)), H=draw(st.sampled_from([64, 256, 1024])),
             I=draw(st.sampled_from([32, 128, 768])), E=E_p * n, k=draw(st.integers(1, 6)),
             E_p=E_p, c=draw(st.integers(16, 2000)), K_max=draw(st.integers(1, 10)),
             alpha=draw(st.sampled_from([1.0, 1.2])), lam=draw(st.sampled_from([1.0, 1.3])),
             m=draw(st.integers(1, 256)), n_imp=draw(st.integers(1, 4)))
    hot = draw(st.integers(1, g["E"]))
    prof = draw(st.sampled_from(["balanced", f"{draw(st.integers(0, 100))}/{hot}", "one_expert",
                                 "one_rank"]))
    return g, prof, draw(st.sampled_from(["pipelined_llep", "llep"])), draw(
        st.sampled_from(["standalone", "checkpointed", "saved"]))


@settings(max_examples=GUARANTEE_EXAMPLES, deadline=None)
@given(shapes_and_knobs())
def test_guarantee_is_at_least_expected(case):
    g, prof, op, reg = case
    ex = bd.expected(op, prof, g["N"], g["H"], g["I"], g["E"], g["k"], 2, g["E_p"], g["c"],
                     g["K_max"], g["alpha"], g["m"], g["lam"], g["n_imp"], reg, reg == "standalone")
    counts = routing.profile_counts(prof, g["N"], g["E"], g["k"], g["E_p"])
    a = dispatch.plan_layer(counts, top_k=g["k"], operator=op, token_budget=g["c"],
                            max_chunks=g["K_max"], alpha=g["alpha"], min_tokens=g["m"],
                            lam=g["lam"], max_imports=g["n_imp"]).assignment
    if a.unplaced:                                          # outside the guarantee's condition
        return
    shape = inv.Shape(g["N"], g["H"], g["I"], g["E"], g["k"], 2)
    gm = bd.phase_moments(bd.guarantee_moments(op, shape, g, standalone=reg == "standalone"), reg)
    for kind, (pk, _, d) in ex.items():
        assert bd.peak(gm[kind])[0] >= pk, (kind, d)


# ---- terms(ctx) ----------------------------------------------------------------------------------
def _ctx(**kw):
    from planner.context.ctx import Ctx
    from planner.schema import ModelSpec

    g = SHAPES["A"]
    m = ModelSpec(name="shape-a", num_layers=2, hidden_size=g["H"], vocab_size=1000, num_heads=8,
                  num_kv_heads=8, head_dim=64, num_experts=g["E"], top_k=g["k"], expert_ffn=g["I"])
    base = dict(model=m, cluster=None, stack="composed", num_layers=2, num_boundaries=4,
                hidden_size=g["H"], expert_ffn=g["I"], dense_ffn=0, num_experts=g["E"], top_k=g["k"],
                vocab_size=1000, num_heads=8, num_kv_heads=8, head_dim=64, v_head_dim=64, params={},
                num_params=0, seq_len=g["N"], seqs_per_microbatch=1, tokens_per_rank=g["N"],
                world_size=8, act_bytes=2, routing="balanced", routing_hot_share=0.0,
                routing_hot_experts=0, routing_text="balanced", dispatch_bound="expected",
                expert_parallel=g["E_p"], token_budget=g["c"], max_chunks=10, checkpoint="sco")
    base.update(kw)
    from planner.context.derive import chunk_symbols

    K, c_eff = chunk_symbols(base["tokens_per_rank"], base["token_budget"], base["max_chunks"])
    return Ctx(**base, num_chunks=K, chunk_tokens=c_eff)   # as derive_context fills them


def _phase_bytes(terms, kind):
    return sum(np.asarray(t.bytes) for t in terms if kind in t.phases)


@pytest.mark.parametrize("op", ["pipelined_llep", "llep", "ep"])
@pytest.mark.parametrize("bound", ["expected", "guarantee"])
def test_terms_vectorise_like_scalars(op, bound):
    N, c = np.array([8192, 65536, 65536]), np.array([4096, 6554, 16384])
    vec = bd.terms(_ctx(dispatch=op, dispatch_bound=bound, tokens_per_rank=N, token_budget=c))
    for i in range(3):
        one = bd.terms(_ctx(dispatch=op, dispatch_bound=bound, tokens_per_rank=int(N[i]),
                            token_budget=int(c[i])))
        for kind in ("forward", "backward"):
            assert _phase_bytes(vec, kind)[i] == _phase_bytes(one, kind)
    for t in vec:
        assert t.live_set == "dispatch" and t.regions == ("moe",) and not t.provisional
        assert (np.asarray(t.count) >= 0).all() and t.formula


@pytest.mark.parametrize("routing_", [("balanced", 0.0, 0), ("skew", 0.8, 16), ("skew", 0.3, 16),
                                      ("worst", 0.0, 0)])
@pytest.mark.parametrize("ckpt", ["sco", "none"])
def test_guarantee_terms_cover_expected_terms(routing_, ckpt):
    kind, r, h = routing_
    for op in ("pipelined_llep", "llep"):
        ex, gu = (bd.terms(_ctx(dispatch=op, dispatch_bound=b, routing=kind, routing_hot_share=r,
                                routing_hot_experts=h, checkpoint=ckpt))
                  for b in ("expected", "guarantee"))
        for ph in ("forward", "backward"):
            assert _phase_bytes(gu, ph) >= _phase_bytes(ex, ph) > 0


def test_checkpointed_forward_keeps_no_residue():
    names = {t.name for t in bd.terms(_ctx()) if "forward" in t.phases}
    assert not any("residue" in n for n in names)
    names = {t.name for t in bd.terms(_ctx(checkpoint="none", dispatch_residue="destination"))
             if "forward" in t.phases}
    assert any("residue rows" in n for n in names)
    # the source-side variant (the default) keeps no residue in any phase or regime
    for ckpt in ("none", "sco"):
        assert not any("residue" in t.name for t in bd.terms(_ctx(checkpoint=ckpt)))


def test_standard_ep_worst_routes_to_one_rank():
    g = SHAPES["A"]
    q = g["E_p"] * g["N"] * min(g["k"], g["E"] // g["E_p"])
    terms = bd.terms(_ctx(dispatch="ep", routing="worst"))
    rows = [t for t in terms if t.name.endswith("slot-major rows") and "backward" in t.phases]
    assert rows and int(rows[0].count) == q * g["H"]


def test_fsdp2_baseline_and_dense_models():
    ep = bd.terms(_ctx(stack="fsdp2", ep=8, ac="full"))
    comp = bd.terms(_ctx(dispatch="ep"))
    assert _phase_bytes(ep, "backward") == _phase_bytes(comp, "backward")
    assert all(t.name.startswith("standard EP") for t in ep)
    from planner.schema import ModelSpec

    dense = ModelSpec(name="d", num_layers=2, hidden_size=64, vocab_size=100, num_heads=4,
                      num_kv_heads=4, head_dim=16, dense_ffn=128)
    assert bd.terms(_ctx(model=dense, num_experts=0)) == []


@pytest.mark.parametrize("op,residue", [("pipelined_llep", "source"), ("pipelined_llep", "destination"),
                                        ("llep", "source"), ("ep", "source")])
@pytest.mark.parametrize("bound", ["expected", "guarantee"])
@pytest.mark.parametrize("ckpt", ["none", "sco"])
def test_dispatch_terms_carry_their_buffers_formula(op, residue, bound, ckpt):
    """Every dispatch term's formula is the one declared with its buffer (``dispatch_buffers``), never
    its bare name: the inventories key their moments by ``Buf``, so no buffer goes without one."""
    from planner.budget import dispatch_buffers

    declared = {b.name: b.formula for b in vars(dispatch_buffers).values() if isinstance(b, dispatch_buffers.Buf)}
    terms = bd.terms(_ctx(dispatch=op, dispatch_residue=residue, dispatch_bound=bound, checkpoint=ckpt))
    assert terms
    for t in terms:
        buf = t.name.split(": ", 1)[1]
        assert t.formula == declared[buf] and t.formula != buf, t.name
