"""Fixtures of the torch-free unit tests (``tests/unit`` runs without torch installed)."""

from __future__ import annotations

import pytest
from synthetic_profiles import flat_cluster


@pytest.fixture(scope="session")
def flat():
    """The flat synthetic profile (``tests/synthetic_profiles.py``)."""
    return flat_cluster()
