"""``bench/vocab.py`` on a GPU smaller than a row's formula peak (the dense head at N = 32768 on an
H100 ended the whole run with an out-of-memory error): the row is recorded as skipped, with its
reason, and the rows of the same N still get their checks."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import vocab  # noqa: E402

GiB = 2**30


def test_a_row_over_the_free_memory_is_named_with_both_sizes():
    assert vocab.over_capacity(79 * GiB, 79 * GiB) is None
    why = vocab.over_capacity(98 * GiB + 1, 78 * GiB)
    assert why == "formula peak 98.00 GiB > 78.00 GiB free on this GPU"


def test_a_skipped_dense_row_leaves_the_ring_rows_checked():
    dense = dict(kind="dense", N=32768, P=1, vocab_blocks=1, move="—", formula_bytes=98 * GiB,
                 trace_bytes=98 * GiB, skipped=vocab.over_capacity(98 * GiB, 78 * GiB))
    ring = dict(kind="ring_dtp", N=32768, P=4, vocab_blocks=1, move="weights", formula_bytes=GiB + 10,
                trace_bytes=GiB, peak_allocated_bytes=GiB, fwd_s=0.9, fwdbwd_s=3.6)
    vocab.checks([dense, ring])
    assert dense["checks"] == {}
    assert ring["checks"]["formula vs measured (2%, ≥ −1%)"] is True
    assert "fwd_vs_dense" not in ring   # no dense time to compare with
    lines = vocab.table([dense, ring]).splitlines()
    assert lines[2].endswith("| skipped: formula peak 98.00 GiB > 78.00 GiB free on this GPU |")
    assert lines[3].endswith("| ok |")
