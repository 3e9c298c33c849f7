"""Facts the budget and the runtime share, checked against the runtime (needs torch)."""

from __future__ import annotations


def test_chunked_local_types_match_the_runtime_families():
    """The budget's list of chunked-local model types is the runtime's (one fact, two layers)."""
    from planner.budget.attention_sliding import CHUNKED_LOCAL_TYPES
    from planner.runtime.model_layers import FAMILIES

    assert set(CHUNKED_LOCAL_TYPES) == {t for t, f in FAMILIES.items() if f.local_kind == "chunked"}
