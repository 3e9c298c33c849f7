"""``planner.runtime.validate.run_steps``: a real run steps on past ``--steps`` until its timed steps
add up to ``TIME_WINDOW_S`` (bounded by ``MAX_STEPS``); the last step is the one compared."""

from __future__ import annotations

import pytest

from planner.errors import InvalidPlan
from planner.runtime import validate as v


class _Step:
    def __init__(self):
        self.n, self.on_phase = 0, None

    def step(self, tokens, targets):
        self.n += 1
        return _Loss(self.n)


class _Loss:
    def __init__(self, n):
        self.n = n

    def detach(self):
        return self

    def float(self):
        return self

    def cpu(self):
        return self

    def __float__(self):
        return float(self.n)


class _Recorder:
    _start = 0

    def __init__(self):
        self.finished = 0

    def start(self):
        pass

    def finish(self):
        self.finished += 1
        return {"step": self.finished}


def _timer(seconds):
    return lambda: (lambda: seconds)


def _run(step_s, steps, window):
    st, rec = _Step(), _Recorder()
    samples, _, times, losses = v.run_steps(st, rec, None, None, steps=steps, timer=_timer(step_s), min_timed_s=window)
    return st.n, samples, times, losses


def test_a_short_step_is_timed_over_the_window():
    n, samples, times, losses = _run(0.3, 3, 2.0)
    assert n == 8 and len(times) == 8           # 7 timed steps of 0.3 s: the first ≥ 2 s
    assert samples == {"step": 8} and losses[-1] == 8.0


def test_a_long_step_runs_the_steps_asked_for():
    assert _run(5.0, 3, 2.0)[0] == 3
    assert _run(0.3, 3, 0.0)[0] == 3            # emulated runs: no window


def test_the_window_is_bounded():
    assert _run(1e-6, 3, 2.0)[0] == v.MAX_STEPS
    assert _run(1e-6, v.MAX_STEPS + 5, 2.0)[0] == v.MAX_STEPS + 5


def test_without_a_timer_nothing_is_added():
    st = _Step()
    v.run_steps(st, _Recorder(), None, None, steps=2, timer=None, min_timed_s=2.0)
    assert st.n == 2


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_bad_steps_are_refused(steps):
    with pytest.raises(InvalidPlan, match="--steps"):
        v.run_steps(_Step(), _Recorder(), None, None, steps=steps, timer=_timer(0.1))


@pytest.mark.parametrize("window", [float("nan"), float("inf"), -1.0, None])
def test_bad_windows_are_refused(window):
    with pytest.raises(InvalidPlan, match="min_timed_s"):
        v.run_steps(_Step(), _Recorder(), None, None, steps=2, timer=_timer(0.1), min_timed_s=window)


@pytest.mark.parametrize("seconds", [float("nan"), -0.1])
def test_a_bad_timing_is_an_error_not_a_window(seconds):
    with pytest.raises(RuntimeError, match="timer must return finite seconds"):
        v.run_steps(_Step(), _Recorder(), None, None, steps=2, timer=_timer(seconds), min_timed_s=2.0)
