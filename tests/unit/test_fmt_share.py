"""``units.fmt_share``: a headroom share keeps its digits in every message (``:.0%`` printed a
0.4% headroom as "0%" and 99.9% as "100%")."""

from __future__ import annotations

import pytest

from planner.units import fmt_share


@pytest.mark.parametrize("x, text", [(0.03, "3%"), (0.004, "0.4%"), (0.999, "99.9%"), (0.0315, "3.15%"), (0.0, "0%")])
def test_shares_print_their_digits(x, text):
    assert fmt_share(x) == text


def test_the_search_tally_names_a_small_headroom():
    from planner import api

    rep = api.search(model="gpt-oss-20b", cluster="h100", gpus=4, seq_len=1 << 20, stack="composed",
                     min_headroom=0.004)
    assert "under 0.4% headroom (--min-headroom)" in rep.result.tally.text()
