"""``lowest_peak`` reports "nothing fits the host" as ``Infeasible`` (exit 1), not as an assertion that
``python -O`` would strip; ``sweep`` falls back to the stack's default plan on it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner.errors import Infeasible
from planner.schema import Workload
from planner.schema.io import load_model
from planner.search.rank import lowest_peak
from planner.search.sweep import best_plans

TINY_HOST_RAM = 1 << 20
"""1 MiB of host RAM per node: no plan's host budget fits."""


@pytest.fixture(scope="module")
def starved(h200):
    return h200.model_copy(update={"topology": h200.topology.model_copy(update={"host_ram_bytes": TINY_HOST_RAM})})


@pytest.mark.parametrize("stack", ["composed", "fsdp2"])
def test_nothing_fits_the_host_is_infeasible(starved, stack):
    wl = Workload(seq_len=8192, global_batch_tokens=8192 * 64)
    with pytest.raises(Infeasible, match=f"no {stack} candidate fits the host RAM at W=64") as e:
        lowest_peak(load_model("gpt-oss-20b"), starved, wl, world_size=64, stack=stack)
    assert e.value.exit_code == 1
    plan, peak, fitting = lowest_peak(load_model("gpt-oss-20b"), starved, wl, world_size=64, stack=stack,
                                      host_fallback=True)
    assert plan.stack == stack and peak > 0 and fitting == 0


def test_sweep_falls_back_to_the_default_plan(starved):
    (pt,) = best_plans(load_model("gpt-oss-20b"), starved, world_size=64, seq_lens=[8192],
                       global_batch_tokens=8192 * 64)
    assert pt.composed_candidate is None and pt.baseline_candidate is None
    assert pt.composed.stack == "composed" and pt.baseline.stack == "fsdp2"


def test_raised_under_python_O():
    code = ("from planner.schema.io import load_model, load_cluster; from planner.schema import Workload; "
            "from planner.search.rank import lowest_peak; from planner.errors import Infeasible; "
            "c = load_cluster('h200'); c = c.model_copy(update={'topology': c.topology.model_copy("
            f"update={{'host_ram_bytes': {TINY_HOST_RAM}}})}}); "
            "wl = Workload(seq_len=8192, global_batch_tokens=8192 * 64)\n"
            "try:\n lowest_peak(load_model('gpt-oss-20b'), c, wl, world_size=64, stack='composed')\n"
            "except Infeasible as e:\n print('Infeasible:', e)")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Infeasible: no composed candidate fits the host RAM"), out.stdout
