"""Synthetic routing profiles and route-count matrices, torch-free (DESIGN §3.2).

Legend:
    N, E, k, E_p   tokens on a rank, routed experts, top-k, expert-parallel degree
    n              experts per rank, ``E/E_p``; rank ``r`` owns experts ``[r·n, (r+1)·n)``
    ids_Nk         expert id of route ``j`` of token ``i`` (int64)
    counts_WE      routes from source rank ``s`` to expert ``e`` (int64, ``W = E_p`` rows)

Profiles (the same routing on every rank, over that rank's own token positions):

- ``balanced``: token ``i`` picks ``{(i+j) mod E : j < k}``.
- ``R/H`` (e.g. ``80/16``): experts ``0..H-1`` are hot; the first ``floor(r·N)`` positions
  (``r = R/100``) pick ``{j mod H : j < k}``; every other token ``i`` picks
  ``{H + ((i+j) mod (E-H)) : j < k}``. As DESIGN §3.2 writes it, ``H < k`` repeats hot experts;
  the planner rejects such profiles (``planner.context.derive.check_routing``), these functions keep
  them for adversarial tests.
- ``one_expert`` (adversarial): every route of every token goes to expert 0.
- ``one_rank`` (adversarial): token ``i`` picks ``{(i+j) mod n : j < k}``, all experts of rank 0
  (repeats when ``k > n``).

Route weights are ``1/k`` in the profiles; the runtime takes real weights from its router.
"""

from __future__ import annotations

import re

import numpy as np

from planner.errors import InvalidPlan

BALANCED = "balanced"
ONE_EXPERT = "one_expert"
ONE_RANK = "one_rank"
ADVERSARIAL = (ONE_EXPERT, ONE_RANK)
_SKEW = re.compile(r"^(\d+)/(\d+)$")
NAMED_SKEW = "80/16"
"""The skew named beside ``balanced`` and ``worst`` in the routing sensitivity, and the DEFAULT
routing of the verdict of every plan whose dispatch has no launch-time bound (standard EP, LLEP's
whole routed batch, the FSDP2 baseline's EP all-to-all; ``default_routing``): 80% of a rank's
tokens on hot experts, their routes on experts ``0..k-1`` (DESIGN §3.2 profiles).

Source: one of the reference benchmark's named profiles (balanced, 30/16, 80/16, 95/16, 50/4;
reference/paper-figures.md, shapes A and B; at shape B it takes standard EP from 21.3 to 64.6 GiB).
It is a benchmark profile, not a measured production-router figure: no per-micro-batch, per-rank
load figure of a real router was found that could be read and cited. What was read supports the
kind of skew only: the LLEP paper (arXiv 2601.17111, abstract) observes that "even well-trained MoE
models exhibit significantly imbalanced routing", and its benchmark command
(SalesforceAIResearch/LeastLoadedEP README) sweeps ``--imbalance_configs "30:4,50:4,80:4,95:4"``.
A model with ``E < 16 + k`` uses the largest ``H`` that leaves cold experts (``named_skew``)."""


def named_skew(num_experts: int, top_k: int) -> str:
    """``NAMED_SKEW`` on a model with ``E`` experts and top-``k``: the same hot share with the
    largest ``H <= 16`` that a top-k router can produce and that leaves the cold tokens their own
    experts (``k <= H <= E - k``; ``planner.context.derive.check_routing``). Where none exists,
    ``H = E`` (every token on the hot experts), or ``worst`` when even ``E < k``."""
    _, share, hot = parse_profile(NAMED_SKEW)
    h = min(hot, num_experts - top_k)
    if h >= top_k:
        return f"{round(share * 100)}/{h}"
    return f"{round(share * 100)}/{num_experts}" if num_experts >= top_k else "worst"


def launch_time_bound(plan) -> bool:
    """Whether the plan's dispatch has a launch-time bound: PipelinedLLEP sized under its guarantee
    (DESIGN §3.2). Standard EP, LLEP's routed batch, PipelinedLLEP's ``expected`` size and the
    FSDP2 baseline's EP all-to-all are sized by the routing the router draws."""
    return plan.stack == "composed" and plan.composed.dispatch == "pipelined_llep" and \
        plan.dispatch_bound == "guarantee"


def default_routing(model, plan) -> tuple[str, str]:
    """``(routing, why)`` for a plan that names no routing: ``balanced`` where the routing cannot
    move the verdict's dispatch (a dense model, or a launch-time bound), else the named skew."""
    if not model.is_moe:
        return BALANCED, "default: the model has no routed experts"
    if launch_time_bound(plan):
        return BALANCED, "default: PipelinedLLEP's guarantee holds for every routing"
    op = ("the FSDP2 baseline's expert dispatch" if plan.stack != "composed" else
          {"ep": "standard EP", "llep": "LLEP's routed batch"}.get(plan.composed.dispatch,
                                                                     "PipelinedLLEP's expected size"))
    skew = named_skew(model.num_experts, model.top_k)
    return skew, f"default: {op} has no launch-time bound, so the named skew (a benchmark profile; README: routing)"


def routing_basis(model, plan) -> dict:
    """``{"routing", "default", "why"}``: the routing the verdict of ``plan`` uses and why."""
    if plan.routing is not None:
        return {"routing": plan.routing, "default": False, "why": "given (--routing or the plan file)"}
    r, why = default_routing(model, plan)
    return {"routing": r, "default": True, "why": why}


def with_routing(model, plan):
    """``plan`` with its routing filled in (``default_routing`` when it names none)."""
    if plan.routing is not None:
        return plan
    return plan.model_copy(update={"routing": default_routing(model, plan)[0]})


def parse_profile(profile: str) -> tuple[str, float, int]:
    """``balanced`` | ``one_expert`` | ``one_rank`` | ``R/H`` → (kind, hot share r, hot experts h).

    Raises:
        InvalidPlan: not a profile name.
    """
    if profile in (BALANCED, *ADVERSARIAL):
        return profile, 0.0, 0
    m = _SKEW.match(profile)
    if not m or not 0 <= int(m.group(1)) <= 100 or int(m.group(2)) < 1:
        raise InvalidPlan("routing", profile, "must be balanced, one_expert, one_rank or R/H",
                          "write e.g. 80/16")
    return "skew", int(m.group(1)) / 100.0, int(m.group(2))


def profile_name(kind: str, hot_share: float, hot_experts: int) -> str:
    """Inverse of ``parse_profile`` for a ``Ctx``'s routing fields (``worst`` maps to ``one_rank``)."""
    if kind == "skew":
        return f"{round(hot_share * 100)}/{hot_experts}"
    return ONE_RANK if kind == "worst" else kind


def expert_ids(profile: str, num_tokens: int, num_experts: int, top_k: int,
               expert_parallel: int = 1) -> np.ndarray:
    """Expert ids ``[N, k]`` (int64) of one rank's tokens under ``profile``.

    Raises:
        InvalidPlan: ``H > E`` in ``R/H``, or ``E`` not divisible by ``E_p`` for ``one_rank``.
    """
    kind, share, hot = parse_profile(profile)
    n_tok, n_exp, k = int(num_tokens), int(num_experts), int(top_k)
    i = np.arange(n_tok, dtype=np.int64)[:, None]
    j = np.arange(k, dtype=np.int64)[None, :]
    if kind == BALANCED:
        return (i + j) % n_exp
    if kind == ONE_EXPERT:
        return np.zeros((n_tok, k), dtype=np.int64)
    if kind == ONE_RANK:
        if n_exp % expert_parallel:
            raise InvalidPlan("expert_parallel", expert_parallel,
                              f"must divide num_experts ({n_exp})", "choose a divisor of E")
        return (i + j) % (n_exp // expert_parallel)
    if hot > n_exp:
        raise InvalidPlan("routing", profile, f"hot experts must be <= num_experts ({n_exp})",
                          "lower H in R/H")
    n_hot = int(np.floor(share * n_tok + 1e-9))
    ids = np.empty((n_tok, k), dtype=np.int64)
    ids[:n_hot] = (j % hot)
    cold = n_exp - hot
    if n_tok > n_hot:
        if cold <= 0:
            ids[n_hot:] = j % hot if hot else 0
        else:
            ids[n_hot:] = hot + (i[n_hot:] + j) % cold
    return ids


def counts_from_ids(ids_per_rank, num_experts: int) -> np.ndarray:
    """Route-count matrix ``counts_WE`` from each rank's expert ids (any shape, ids in ``[0, E)``)."""
    rows = [np.bincount(np.asarray(ids).reshape(-1), minlength=num_experts)[:num_experts]
            for ids in ids_per_rank]
    return np.stack(rows).astype(np.int64) if rows else np.zeros((0, num_experts), np.int64)


def _cyclic_counts(start: int, stop: int, modulus: int, k: int) -> np.ndarray:
    """``bincount`` of ``(i + j) mod modulus`` over ``i ∈ [start, stop)``, ``j < k``, without building
    the ``[N, k]`` ids: ``O(modulus·k)``."""
    out = np.zeros(modulus, dtype=np.int64)
    n = max(stop - start, 0)
    if n == 0 or modulus == 0:
        return out
    full, rest = divmod(n, modulus)
    out += full * k
    if rest:
        e = np.arange(modulus, dtype=np.int64)
        for j in range(k):
            first = (start + j) % modulus          # residue of the first leftover position
            out += ((e - first) % modulus < rest).astype(np.int64)
    return out


def rank_counts(profile: str, num_tokens: int, num_experts: int, top_k: int,
                expert_parallel: int = 1) -> np.ndarray:
    """Route counts per expert ``[E]`` of one rank under ``profile``: the same numbers as
    ``bincount(expert_ids(...))``, computed in ``O(E·k)`` (the search calls it for ``N`` up to 16M)."""
    kind, share, hot = parse_profile(profile)
    n_tok, n_exp, k = int(num_tokens), int(num_experts), int(top_k)
    out = np.zeros(n_exp, dtype=np.int64)
    if kind == BALANCED:
        return _cyclic_counts(0, n_tok, n_exp, k)
    if kind == ONE_EXPERT:
        out[0] = n_tok * k
        return out
    if kind == ONE_RANK:
        if n_exp % expert_parallel:
            raise InvalidPlan("expert_parallel", expert_parallel,
                              f"must divide num_experts ({n_exp})", "choose a divisor of E")
        out[: n_exp // expert_parallel] = _cyclic_counts(0, n_tok, n_exp // expert_parallel, k)
        return out
    if hot > n_exp:
        raise InvalidPlan("routing", profile, f"hot experts must be <= num_experts ({n_exp})",
                          "lower H in R/H")
    n_hot = int(np.floor(share * n_tok + 1e-9))
    for j in range(k):
        out[j % hot] += n_hot
    cold = n_exp - hot
    if n_tok > n_hot:
        if cold <= 0:
            for j in range(k):
                out[j % hot if hot else 0] += n_tok - n_hot
        else:
            out[hot:] += _cyclic_counts(n_hot, n_tok, cold, k)
    return out


def profile_counts(profile: str, tokens_per_rank, num_experts: int, top_k: int,
                   expert_parallel: int) -> np.ndarray:
    """``counts_WE`` of ``profile`` on every rank; ``tokens_per_rank`` is an int or one per rank."""
    tokens = np.broadcast_to(np.asarray(tokens_per_rank, dtype=np.int64), (expert_parallel,))
    cache: dict[int, np.ndarray] = {}
    rows = []
    for n in tokens.tolist():
        if n not in cache:
            cache[n] = rank_counts(profile, n, num_experts, top_k, expert_parallel)
        rows.append(cache[n])
    return np.stack(rows)
