"""Bounds on the planner's own work: the expected dispatch size builds the integer plan of every
layer shape on the routing profile, whose cost grows as ``E_p³`` (rank classes × the ``E_p × E_p``
send matrix) plus ``K·E_p·(E + E_p·n_import_max)`` plan cells per shape. Beyond a bound it would run
for minutes and use gigabytes (``E_p = 512``: 46 s for one shape), so it is refused in one line.
"""

from __future__ import annotations

import numpy as np

from planner.errors import InvalidPlan

MAX_EXPECTED_WORK = 1 << 25
"""Most work units (see ``expected_work``) the expected dispatch bound may take: one shape at
``E_p = 256`` (about 3 s on one core), or 256 small shapes."""
SHAPE_OVERHEAD = 1 << 17
"""Work units charged per distinct shape (the Python overhead of one plan)."""


def expected_work(E_p, K, E: int, n_imp) -> int:
    """Work units of the expected bound over distinct shapes (arrays of ``E_p``, ``K``, ``n_imp``)."""
    Ep = np.asarray(E_p, dtype=np.int64).reshape(-1)
    Kk = np.broadcast_to(np.asarray(K, dtype=np.int64).reshape(-1), Ep.shape)
    n = np.broadcast_to(np.asarray(n_imp, dtype=np.int64).reshape(-1), Ep.shape)
    per = Ep ** 3 + Kk * Ep * (E + Ep * n) + SHAPE_OVERHEAD
    return int(sum(int(x) for x in per))


class TooCostly(InvalidPlan):
    """The expected dispatch size would take minutes to plan (the search skips such candidates)."""


def check_expected_work(E_p, K, E: int, n_imp, op: str = "pipelined_llep", profile: str = "") -> None:
    """Refuse an expected dispatch size whose work exceeds ``MAX_EXPECTED_WORK``.

    Raises:
        TooCostly: naming ``--dispatch-bound`` (LLEP, PipelinedLLEP), ``--dispatch`` (standard EP,
            which is only sized on the routing profile) or ``--routing`` (the FSDP2 baseline's EP)
            and the fixes.
    """
    work = expected_work(E_p, K, E, n_imp)
    if work > MAX_EXPECTED_WORK:
        shapes, top = int(np.asarray(E_p).size), int(np.max(np.asarray(E_p)))
        what = (f"needs the integer dispatch plan of {shapes} shape(s) at E_p up to {top} "
                f"(work {work:.3g} > {MAX_EXPECTED_WORK:.3g}, minutes of planning)")
        if op == "fsdp2_ep":   # the baseline's EP all-to-all: sized on the routing profile only
            raise TooCostly("--routing", profile, f"sizes the FSDP2 baseline's expert dispatch, which {what}",
                            "use --routing worst (an upper bound that needs no plan), fewer grid points or lengths, "
                            "or a smaller ep")
        if op == "ep":
            raise TooCostly("--dispatch", "ep", f"is sized on the routing profile, which {what}",
                            "use --dispatch pipelined_llep (its guarantee needs no plan), a smaller "
                            "--expert-parallel, or fewer grid points")
        raise TooCostly("--dispatch-bound", "expected", what,
                        "use --dispatch-bound guarantee (it holds for every routing), a smaller "
                        "--expert-parallel, or fewer grid points")
