"""``planner.runtime.host_cores``: every allowed core timed, the calling thread pinned to the fastest
for the block only, the intra-op pool started first so its workers keep every core."""

from __future__ import annotations

import os
import threading

import pytest

from planner.runtime import host_cores

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")


def test_every_core_is_timed_and_the_affinity_restored():
    before = os.sched_getaffinity(0)
    speeds = host_cores.time_cores(repeats=1)
    assert sorted(speeds) == sorted(before)
    assert all(s > 0 for s in speeds.values())
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("repeats", [0, -1, 1.5, 2.0, True, "3", None])
def test_bad_repeats_are_refused(repeats):
    with pytest.raises(ValueError, match="repeats = .*must be an integer >= 1"):
        host_cores.time_cores(repeats=repeats)


@pytest.mark.parametrize("cores", [[], 3, "0", [-1], [2 ** 40], [True], [0.0], ["1"]])
def test_bad_cores_are_refused(cores):
    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match="cores"):
        host_cores.time_cores(cores=cores, repeats=1)
    assert os.sched_getaffinity(0) == before


def test_a_core_outside_the_affinity_is_refused():
    before = os.sched_getaffinity(0)
    outside = max(before) + 1
    with pytest.raises(ValueError, match=r"os.sched_getaffinity\(0\)"):
        host_cores.time_cores(cores=[outside], repeats=1)


def test_the_thread_is_pinned_to_the_fastest_core_for_the_block_only(monkeypatch):
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("one core: nothing to choose")
    cores = sorted(before)
    fastest = cores[-1]                           # not the first, so the choice is the speed's
    monkeypatch.setattr(host_cores, "time_cores", lambda c: {k: (1.0 if k == fastest else 2.0) for k in c})
    with host_cores.pinned() as hc:
        assert os.sched_getaffinity(0) == {fastest}
        assert hc.core == fastest and hc.spread == 2.0
        assert f"pinned to core {fastest} (" in hc.line() and f"of {len(cores)}, probe" in hc.line()
        assert "(2.00×)" in hc.line()
        seen = []
        t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        t.start()
        t.join()
        assert seen == [{fastest}]                # a thread started inside inherits the pin
    assert os.sched_getaffinity(0) == before


def test_workers_started_before_the_pin_keep_every_core():
    torch = pytest.importorskip("torch")
    before = os.sched_getaffinity(0)
    if len(before) < 2 or torch.get_num_threads() < 2:
        pytest.skip("one core: nothing to choose")
    with host_cores.pinned(torch) as hc:
        assert os.sched_getaffinity(0) == {hc.core}
        masks = [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{os.getpid()}/task")
                 if int(t) != threading.get_native_id()]
        assert before in masks                    # the intra-op pool (and torch's other workers)


def test_the_record_is_json_ready():
    hc = host_cores.HostCores({0: 0.003, 3: 0.006}, 0)
    d = hc.to_json()
    assert d == {"probe_s": {"0": 0.003, "3": 0.006}, "core": 0, "reason": "", "spread": 2.0}
    assert host_cores.HostCores(reason="one core").line() == "host cores: not timed (one core)"
    for bad in ({0: 0.0}, {0: -1.0}, {0: float("nan"), 1: 1e-3}, {1: 1e-3, 0: float("nan")}):
        assert host_cores.HostCores(bad).spread is None
        assert host_cores.HostCores(bad).line().startswith("host cores: ")
        assert "not usable" in host_cores.HostCores(bad).line()
    assert "pinned" not in host_cores.HostCores({0: 1e-3}, core=3).line()   # a core it did not time


def test_the_survey_pins_nothing():
    before = os.sched_getaffinity(0)
    hc = host_cores.survey()
    assert hc.core is None and sorted(hc.probe_s) == sorted(before)
    assert os.sched_getaffinity(0) == before
    assert hc.line().startswith(f"host cores: {len(before)}, probe ")
