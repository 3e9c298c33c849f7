"""Routings a top-k router can produce, skewed hard enough that small ``n_import_max`` leaves LLEP
routes unplaced: the draws of the dispatch-guarantee properties (``test_guarantee_property``,
``test_dispatch_residue``)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from planner.plans import routing


def _topk_ids(rng, weights, tokens: int, k: int) -> np.ndarray:
    """``[tokens, k]`` distinct expert ids per token, drawn with the Gumbel top-k trick."""
    with np.errstate(divide="ignore"):
        keys = np.log(weights)[None, :] + rng.gumbel(size=(tokens, len(weights)))
    return np.argpartition(-keys, k - 1, axis=1)[:, :k]


def _draw_case(rng, E_p: int, n: int, k: int, kind: str, max_tokens: int = 300):
    E = E_p * n
    tokens = rng.integers(1, max_tokens + 1, E_p)
    if kind == "one_rank":                 # almost everything on rank 0's experts, unevenly
        w = np.full(E, 1e-3)
        w[:n] = rng.dirichlet(np.full(n, 0.5)) + 1e-6
    elif kind == "few_ranks":              # a random subset of ranks is hot
        hot = rng.random(E_p) < 0.4
        hot[rng.integers(E_p)] = True
        w = np.where(np.repeat(hot, n), 1.0, 1e-3) * rng.dirichlet(np.full(E, 0.3))
    else:                                  # zipf-like skew over a random permutation
        w = 1.0 / np.arange(1, E + 1) ** rng.uniform(0.0, 3.0)
        w = rng.permutation(w)
    ids = [_topk_ids(rng, w / w.sum(), int(t), k) for t in tokens]
    return routing.counts_from_ids(ids, E), int(tokens.max())


@st.composite
def cases(draw):
    E_p = draw(st.sampled_from([2, 3, 4, 8]))
    n = draw(st.integers(1, 8))
    k = draw(st.integers(1, min(6, E_p * n)))
    kind = draw(st.sampled_from(["one_rank", "few_ranks", "zipf"]))
    seed = draw(st.integers(0, 2**32 - 1))
    counts, n_max = _draw_case(np.random.default_rng(seed), E_p, n, k, kind)
    knobs = dict(alpha=draw(st.sampled_from([1.0, 1.1, 1.5, 2.0, 4.0])), min_tokens=draw(st.integers(1, 64)),
                 lam=draw(st.sampled_from([1.0, 1.3, 2.0])), max_imports=draw(st.integers(0, 4)))
    return counts, n_max, k, knobs


def draw_import_limited(rng):
    """One random import-limited case of the sweeps: ``(E_p, n, k, counts, n_max, knobs)``, the
    routing concentrated on one rank or a few, with LLEP knobs that can leave routes unplaced."""
    E_p = int(rng.choice([2, 4, 8]))
    n = int(rng.integers(2, 9))
    k = int(rng.integers(1, min(6, E_p * n) + 1))
    counts, n_max = _draw_case(rng, E_p, n, k, str(rng.choice(["one_rank", "few_ranks"])))
    knobs = dict(alpha=1.0, min_tokens=int(rng.integers(1, 8)), lam=1.0, max_imports=int(rng.integers(0, 3)))
    return E_p, n, k, counts, n_max, knobs
