"""How the one-line errors print the numbers they repeat."""

from __future__ import annotations

import numpy as np

from planner.errors import InvalidPlan, ProfileGap


def test_profile_gap_prints_plain_numbers_not_numpy_reprs():
    msg = str(ProfileGap("gpu_adamw", np.float64(19947.0), np.float64(1048576.0), np.inf, "calibrate"))
    assert msg == ("profile curve gpu_adamw has no measurement at 19947 (measured range 1.04858e+06 to ∞); "
                   "fix: calibrate")
    assert "np.float64" not in str(ProfileGap("c", "any", None, None))


def test_an_integer_past_repr_limit_is_named_by_its_size():
    msg = str(InvalidPlan("workload.seq_len", 10 ** 5000 - 1, "must be <= 4294967296"))
    assert msg.startswith("workload.seq_len (an integer of 5000 digits) must be")


def test_a_long_count_is_parsed_exactly():
    from planner.units import parse_count

    assert parse_count("12345678901234567890123456789") == 12345678901234567890123456789
    assert parse_count("9" * 40 + "k") == (10 ** 40 - 1) * 1024
