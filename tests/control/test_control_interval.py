"""Checkpoint interval (Young, Daly, CheckFreq-style adaptation) and ETTR accounting."""

from __future__ import annotations

import math

import pytest

from lifeline.control import (
    AdaptiveInterval,
    checkpoint_interval,
    daly_interval,
    ettr,
    expected_ettr,
    young_interval,
)
from lifeline.errors import ConfigError


def _daly_wall_time(tau: float, c: float, m: float, restart: float = 0.0, solve: float = 1e6) -> float:
    """Daly (2006) eq. (20): expected wall time of a job of ``solve`` seconds, interval ``tau``."""
    return m * math.exp(restart / m) * (math.exp((tau + c) / m) - 1.0) * solve / tau


def _argmin(f, lo: float, hi: float) -> float:
    for _ in range(200):  # golden-section search
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if f(a) < f(b) else (a, hi)
    return (lo + hi) / 2


def test_young_formula():
    assert young_interval(10, 3600) == pytest.approx(math.sqrt(2 * 10 * 3600))


@pytest.mark.parametrize(("c", "m"), [(1, 3600), (60, 3600), (300, 3600), (5, 86400), (600, 1800)])
def test_daly_is_near_the_true_optimum_and_beats_young(c, m):
    best = _argmin(lambda t: _daly_wall_time(t, c, m), 1e-3, 10 * m)
    daly, young = daly_interval(c, m), young_interval(c, m)
    assert daly == pytest.approx(best, rel=0.02)
    assert abs(daly - best) <= abs(young - best)


def test_daly_limits():
    assert daly_interval(5000, 2000) == 2000  # C >= 2M: checkpoint once per MTBF
    assert daly_interval(1e-3, 1e6) == pytest.approx(young_interval(1e-3, 1e6), rel=1e-3)


def test_interval_in_steps():
    # in-memory save: 0.05 s stall, job MTBF 1 h, 0.5 s steps -> Daly ~18.9 s -> 38 steps
    assert checkpoint_interval(0.05, 3600, step_seconds=0.5) == 38
    assert checkpoint_interval(0.05, 3600, step_seconds=0.5, method="young") == 38
    assert checkpoint_interval(0.05, 3600, step_seconds=0.5, max_steps=10) == 10
    assert checkpoint_interval(1e-6, 3600, step_seconds=10) == 1
    with pytest.raises(ConfigError) as info:
        checkpoint_interval(0, 3600, step_seconds=1)
    assert info.value.field == "save_seconds"
    with pytest.raises(ConfigError):
        checkpoint_interval(1, 3600, step_seconds=1, method="guess")


def test_adaptive_interval_keeps_the_stall_within_budget():
    policy = AdaptiveInterval(overhead=0.05, smoothing=1.0)
    policy = policy.observe(stall_seconds=0.01, step_seconds=1.0)
    assert policy.steps == 1  # 1% stall per step already fits a 5% budget
    policy = policy.observe(stall_seconds=0.2, step_seconds=1.0)
    assert policy.steps == 4  # 0.2 / (0.05 * 1.0)
    assert policy.stall_seconds / (policy.steps * policy.step_seconds) <= 0.05
    policy = policy.observe(stall_seconds=0.2, step_seconds=0.5)
    assert policy.steps == 8  # steps got faster: checkpoint less often


def test_adaptive_interval_waits_for_the_previous_checkpoint_to_drain():
    policy = AdaptiveInterval(smoothing=1.0).observe(stall_seconds=0.0, step_seconds=0.25, drain_seconds=1.0)
    assert policy.steps == 4


def test_adaptive_interval_smooths_and_clamps():
    policy = AdaptiveInterval(smoothing=0.5, max_steps=6)
    policy = policy.observe(stall_seconds=0.1, step_seconds=1.0)
    policy = policy.observe(stall_seconds=0.5, step_seconds=1.0)
    assert policy.stall_seconds == pytest.approx(0.3)
    assert policy.steps == 6  # 0.3 / 0.05 = 6
    policy = policy.observe(stall_seconds=5.0, step_seconds=1.0)
    assert policy.steps == 6  # clamped at max_steps


def test_adaptive_interval_uses_daly_when_mtbf_is_known():
    policy = AdaptiveInterval(smoothing=1.0, mtbf_seconds=3600).observe(stall_seconds=0.05, step_seconds=0.5)
    assert policy.steps == checkpoint_interval(0.05, 3600, step_seconds=0.5)


def test_adaptive_interval_rejects_bad_settings():
    with pytest.raises(ConfigError):
        AdaptiveInterval(overhead=0)
    with pytest.raises(ConfigError):
        AdaptiveInterval(min_steps=5, max_steps=2)
    with pytest.raises(ConfigError):
        AdaptiveInterval().observe(stall_seconds=-1, step_seconds=1)


def test_ettr_breakdown_adds_up():
    b = ettr(wall_seconds=100, steps=80, step_seconds=1.0, checkpoint_stall_seconds=2, recovery_seconds=8)
    assert b.ratio == pytest.approx(0.8)
    assert b.productive + b.checkpoint_stall + b.recovery + b.rework == pytest.approx(100)
    assert b.rework == pytest.approx(10)
    with pytest.raises(ConfigError, match="exceed the wall time"):
        ettr(wall_seconds=10, steps=20, step_seconds=1.0)


def test_expected_ettr_peaks_near_the_young_interval():
    c, r, m = 5.0, 30.0, 36000.0
    best = _argmin(lambda t: -expected_ettr(interval_seconds=t, save_seconds=c, restore_seconds=r, mtbf_seconds=m),
                   1.0, m)
    assert best == pytest.approx(young_interval(c, m), rel=0.05)
    assert expected_ettr(interval_seconds=best, save_seconds=c, restore_seconds=r, mtbf_seconds=m) > 0.97
    assert expected_ettr(interval_seconds=2 * m, save_seconds=c, restore_seconds=r, mtbf_seconds=m) == 0.0
