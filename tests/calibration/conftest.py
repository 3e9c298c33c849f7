"""Fixtures of the calibration tests (these need torch)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_profile(tmp_path_factory):
    """The CPU quick profile of this machine (``calibration.run(quick=True)``, a few seconds)."""
    import calibration

    out = tmp_path_factory.mktemp("cpuprof") / "cpu.yaml"
    return calibration.run(out, quick=True, progress=False, command="pytest: timing tests")
