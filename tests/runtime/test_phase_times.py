"""``planner.runtime.phase_times``: one step synchronised at each phase boundary, its windows in the
step's order, adding up to the step; and ``planner validate``'s time lines built from them."""

from __future__ import annotations

import time

import pytest

from planner.runtime import phase_times as pt

SLEEP_S = 0.01


class _Step:
    """Calls ``on_phase`` as the runtime's steps do: forward regions, head, backward, optimizer."""

    order = (("forward", 1), ("forward", 2), ("head", None), ("backward", 2), ("backward", 1), ("optimizer", None))

    def __init__(self):
        self.on_phase = "original"

    def step(self, tokens, targets):
        for name, r in self.order:
            self.on_phase(name, r)
            time.sleep(SLEEP_S if name != "head" else 2 * SLEEP_S)


def test_windows_follow_the_step_and_add_up():
    syncs = []
    st = _Step()
    t0 = time.perf_counter()
    out = pt.phase_seconds(st, None, None, lambda: syncs.append(1))
    wall = time.perf_counter() - t0
    assert list(out) == ["embedding", "forward[1]", "forward[2]", "head", "backward[2]", "backward[1]", "optimizer"]
    assert len(syncs) == len(_Step.order) + 2            # before, at every boundary, after
    assert sum(out.values()) == pytest.approx(wall, abs=5e-3)
    assert out["head"] >= 2 * SLEEP_S * 0.9 and out["forward[1]"] >= SLEEP_S * 0.9
    assert st.on_phase == "original"
    g = pt.grouped(out)
    assert list(g) == ["forward", "head", "backward", "optimizer", "other"]   # embedding under other
    assert g["forward"] == pytest.approx(out["forward[1]"] + out["forward[2]"])


def test_the_hook_is_restored_when_the_step_fails():
    class Bad(_Step):
        def step(self, tokens, targets):
            raise RuntimeError("boom")
    st = Bad()
    with pytest.raises(RuntimeError):
        pt.phase_seconds(st, None, None, lambda: None)
    assert st.on_phase == "original"


def test_validate_prints_the_predicted_components_and_the_phases():
    from types import SimpleNamespace

    from planner.runtime.validate_report import time_lines
    pred = SimpleNamespace(step_s=2.0, step_components={"attention": 0.5, "compute": 1.5, "copies": 0.0})
    meas = SimpleNamespace(phase_s={"embedding": 0.01, "forward[1]": 0.6, "head": 0.2, "backward[1]": 1.2,
                                    "optimizer": 0.1})
    lines = time_lines(pred, meas)
    assert lines[0] == "predicted step 2.000 s: compute 1.500 (75%), attention 0.500 (25%)"
    assert lines[1] == ("measured, one step synchronised at each phase (2.110 s): forward 0.600, head 0.200, "
                        "backward 1.200, optimizer 0.100, other 0.010")
    assert time_lines(SimpleNamespace(step_s=None, step_components=None), SimpleNamespace(phase_s=None)) == []


def test_no_finite_step_time_reads_n_a_and_json_has_no_nan():
    from types import SimpleNamespace

    from planner.runtime.validate import finite_or_none
    from planner.runtime.validate_report import time_lines
    pred = SimpleNamespace(step_s=None, step_components={"compute": 0.18, "attention": float("nan")})
    assert time_lines(pred, SimpleNamespace(phase_s=None)) == [
        "predicted step: n/a (the time model gives no finite step time for this plan)"]
    pred = SimpleNamespace(step_s=1.0, step_components={"compute": 0.5, "attention": float("nan"), "copies": 0.5})
    assert time_lines(pred, SimpleNamespace(phase_s=None)) == ["predicted step 1.000 s: compute 0.500 (50%), copies 0.500 (50%)"]
    assert finite_or_none({"a": float("nan"), "b": 1, "c": float("inf")}) == {"a": None, "b": 1.0, "c": None}
    assert finite_or_none(None) is None


def test_validate_prints_the_timed_steps_spread():
    """A real run's timed steps (the 2nd onwards) are printed with their median and spread, and the
    median leaves out the first step (it builds the optimizer state and the workspaces)."""
    from types import SimpleNamespace

    from planner.runtime.validate import median_step_s
    from planner.runtime.validate_report import time_lines
    times = [9.0, 1.0, 1.25, 1.1]
    assert median_step_s(times) == 1.1
    assert median_step_s([2.5]) == 2.5 and median_step_s([]) is None
    meas = SimpleNamespace(phase_s=None, step_times_s=times, step_s=median_step_s(times))
    assert time_lines(SimpleNamespace(step_s=None, step_components=None), meas) == [
        "timed steps 2..4: median 1.100 s, 1.000–1.250 s (max/min 1.25)"]
    one = SimpleNamespace(phase_s=None, step_times_s=[9.0, 1.0], step_s=1.0)
    assert time_lines(SimpleNamespace(step_s=None, step_components=None), one) == []
    for odd in ([9.0, 1.0, 0.0], [9.0, 1.0, float("nan")]):   # no division by a zero or NaN step
        assert time_lines(SimpleNamespace(step_s=None, step_components=None),
                          SimpleNamespace(phase_s=None, step_times_s=odd, step_s=1.0)) == []
    tight = SimpleNamespace(phase_s=None, step_times_s=[9.0, 1.0], step_s=1.0, alloc_retries=3)
    assert time_lines(SimpleNamespace(step_s=None, step_components=None), tight) == [
        "the allocator freed its cache and retried 3 allocation(s) during the steps (near the card's capacity): "
        "the step time includes those frees"]


def test_validate_prints_the_predicted_phases_beside_the_measured():
    """The time model's seconds by phase kind are printed beside the synchronised windows."""
    from types import SimpleNamespace

    from planner.runtime.validate_report import time_lines
    pred = SimpleNamespace(step_s=2.0, step_components={"compute": 2.0},
                           step_phases={"forward": 0.5, "head": 0.25, "backward": 1.0, "optimizer": 0.25, "other": 0.0})
    meas = SimpleNamespace(phase_s={"embedding": 0.01, "forward[1]": 0.6, "head": 0.2, "backward[1]": 1.2,
                                    "optimizer": 0.1})
    assert time_lines(pred, meas)[-1] == ("by phase, predicted / measured synchronised (s): forward 0.500 / 0.600, "
                                          "head 0.250 / 0.200, backward 1.000 / 1.200, optimizer 0.250 / 0.100, "
                                          "other 0.000 / 0.010")
    assert time_lines(pred, SimpleNamespace(phase_s=None))[-1] == (
        "by phase, predicted (s): forward 0.500, head 0.250, backward 1.000, optimizer 0.250")
