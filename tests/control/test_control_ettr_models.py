"""ETTR of a large job from each system's costs (lifeline.control.ettr: models at scale)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lifeline.control import (
    SystemCosts,
    ettr_at_scale,
    ettr_table,
    expected_ettr,
    lifeline_costs,
    modeled_peers,
    window_rework_seconds,
)
from lifeline.errors import ConfigError

GB = 10**9
# one rank of an MoE job: 2.5 B params -> 30 GB of fp32 weights + Adam moments; 2 s steps
PEERS = {"step_seconds": 2.0, "stages": 8, "window": 8, "dense_bytes": 30 * GB, "sparse_bytes": 4 * GB,
         "snapshot_bytes_per_second": 12 * GB, "network_bytes_per_second": 3 * GB,
         "storage_bytes_per_second": GB // 2, "restart_seconds": 30.0}


def costs(**kw) -> SystemCosts:
    base = {"name": "x", "interval_seconds": 10.0, "stall_seconds": 1.0, "recovery_seconds": 30.0,
            "recompute_fraction": 1.0, "rework_seconds": 5.5}
    return SystemCosts(**{**base, **kw})


def test_first_order_formula():
    # useful 10 / 11; per failure 30 s recovery + 5.5 s rework, one failure per 600 s
    assert ettr_at_scale(costs(), gpus=16384, mtbf_minutes_per_job=10) == pytest.approx(10 / 11 * (1 - 35.5 / 600))
    # only a quarter of the job recomputes: a quarter of the rework is lost
    local = costs(recompute_fraction=0.25, rework_seconds=40.0)
    assert ettr_at_scale(local, gpus=16384, mtbf_minutes_per_job=10) == pytest.approx(10 / 11 * (1 - 40 / 600))


def test_periodic_costs_reduce_to_expected_ettr():
    c = costs(rework_seconds=(10.0 + 1.0) / 2)
    assert ettr_at_scale(c, gpus=8, mtbf_minutes_per_job=20) == pytest.approx(
        expected_ettr(interval_seconds=10.0, save_seconds=1.0, restore_seconds=30.0, mtbf_seconds=1200.0))


def test_gpu_mtbf_scales_with_the_job():
    c = costs()
    # 16 384 GPUs of 2 730.67 h MTBF each: one failure every 10 minutes
    per_gpu_hours = 16384 * 10 / 60
    assert ettr_at_scale(c, gpus=16384, gpu_mtbf_hours=per_gpu_hours) == pytest.approx(
        ettr_at_scale(c, gpus=16384, mtbf_minutes_per_job=10))
    assert ettr_at_scale(c, gpus=2 * 16384, gpu_mtbf_hours=per_gpu_hours) < ettr_at_scale(
        c, gpus=16384, gpu_mtbf_hours=per_gpu_hours)


def test_clamped_to_unit_interval():
    assert ettr_at_scale(costs(recovery_seconds=10_000.0), gpus=1, mtbf_minutes_per_job=10) == 0.0
    assert ettr_at_scale(costs(stall_seconds=0.0, recovery_seconds=0.0, rework_seconds=0.0), gpus=1,
                         mtbf_minutes_per_job=1) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 100), st.floats(0, 10), st.floats(0, 500), st.floats(0.01, 1), st.floats(0, 500),
       st.floats(1, 1000), st.floats(1, 1000))
def test_monotone_in_mtbf(t, c, r, f, x, m1, m2):
    s = SystemCosts("p", t, c, r, f, x)
    lo, hi = sorted((m1, m2))
    a, b = (ettr_at_scale(s, gpus=16384, mtbf_minutes_per_job=m) for m in (lo, hi))
    assert 0.0 <= a <= b + 1e-12 <= 1.0 + 1e-12


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 64), st.integers(1, 64), st.floats(0.05, 20))
def test_localized_replay_loses_less_than_global_rollback(stages, window, step):
    local = lifeline_costs(step_seconds=step, stall_seconds=0.01, recovery_seconds=20.0, window=window, stages=stages)
    assert local.recompute_fraction == pytest.approx(1 / stages) and local.recompute_fraction < 1.0
    rollback = SystemCosts("global", local.interval_seconds, local.stall_seconds, local.recovery_seconds, 1.0,
                           local.rework_seconds)
    for m in (10, 20, 60):
        ours, theirs = (ettr_at_scale(c, gpus=16384, mtbf_minutes_per_job=m) for c in (local, rollback))
        assert ours > theirs or ours == theirs == 0.0


def test_lifeline_costs_from_measurements():
    c = lifeline_costs(step_seconds=0.5, stall_seconds=0.02, recovery_seconds=4.0, window=6, stages=3)
    assert (c.name, c.interval_seconds, c.stall_seconds, c.recovery_seconds) == ("Lifeline", 0.5, 0.02, 4.0)
    assert c.rework_seconds == window_rework_seconds(6, 0.5) == 4.5  # 1.5 windows of 0.5 s steps
    measured = lifeline_costs(step_seconds=0.5, stall_seconds=0.02, recovery_seconds=4.0, window=6, stages=3,
                              recompute_fraction=0.3)
    assert measured.recompute_fraction == 0.3


def test_modeled_peers_follow_their_mechanisms():
    checkfreq, gemini, moevement = modeled_peers(**PEERS)
    assert (checkfreq.name, gemini.name, moevement.name) == ("CheckFreq", "Gemini", "MoEvement")
    snapshot, persist, transfer = 30 / 12, 30 / 0.5, 30 / 3
    # CheckFreq: stall = the snapshot beyond one step; period >= snapshot + persist; stall <= 3.5 %
    assert checkfreq.stall_seconds == pytest.approx(snapshot - 2.0)
    assert checkfreq.interval_seconds >= snapshot + persist
    assert checkfreq.stall_seconds / checkfreq.interval_seconds <= 0.035
    assert checkfreq.recovery_seconds == pytest.approx(30 + persist) and checkfreq.recompute_fraction == 1.0
    # Gemini: in-memory, as often as the transfer to a peer allows, recovery from a peer's memory
    assert gemini.interval_seconds == 10.0 >= transfer
    assert gemini.recovery_seconds == pytest.approx(30 + transfer)
    assert gemini.recovery_seconds < checkfreq.recovery_seconds
    assert gemini.rework_seconds == pytest.approx((gemini.interval_seconds + gemini.stall_seconds) / 2)
    # MoEvement: every step, only the failed stage replays 1.5 windows
    assert moevement.interval_seconds == 2.0 and moevement.stall_seconds == 0.0
    assert moevement.recompute_fraction == 1 / 8 and moevement.rework_seconds == 1.5 * 8 * 2.0
    at10 = {s.name: ettr_at_scale(s, gpus=16384, mtbf_minutes_per_job=10) for s in (checkfreq, gemini, moevement)}
    assert at10["CheckFreq"] < at10["Gemini"] < at10["MoEvement"]


def test_gemini_checkpoints_every_step_when_the_transfer_fits():
    _, gemini, _ = modeled_peers(**{**PEERS, "dense_bytes": GB})
    assert gemini.interval_seconds == 2.0 and gemini.stall_seconds == 0.0


def test_smaller_state_never_hurts_the_periodic_peers():
    big, small = modeled_peers(**PEERS), modeled_peers(**{**PEERS, "dense_bytes": 10 * GB})
    for b, s in zip(big[:2], small[:2]):
        assert ettr_at_scale(s, gpus=16384, mtbf_minutes_per_job=10) >= ettr_at_scale(
            b, gpus=16384, mtbf_minutes_per_job=10)


def test_ettr_table_is_json_ready():
    ours = lifeline_costs(step_seconds=2.0, stall_seconds=0.05, recovery_seconds=20.0, window=8, stages=8)
    table = ettr_table((*modeled_peers(**PEERS), ours))
    assert json.loads(json.dumps(table)) == table
    assert table["gpus"] == 16384 and table["mtbf_minutes"] == [10.0, 20.0, 60.0]
    assert list(table["systems"]) == ["CheckFreq", "Gemini", "MoEvement", "Lifeline"]
    row = table["systems"]["Lifeline"]
    assert row["ettr"]["10"] == ettr_at_scale(ours, gpus=16384, mtbf_minutes_per_job=10)
    assert row["ettr"]["10"] <= row["ettr"]["20"] <= row["ettr"]["60"]
    assert (row["interval_s"], row["stall_s"], row["recovery_s"], row["recompute_fraction"], row["rework_s"]) == (
        2.0, 0.05, 20.0, 1 / 8, 24.0)
    assert list(ettr_table([ours], mtbf_minutes=(7.5,), gpus=64)["systems"]["Lifeline"]["ettr"]) == ["7.5"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: costs(name=""), "name"),
        (lambda: costs(interval_seconds=0.0), "interval_seconds"),
        (lambda: costs(stall_seconds=-1.0), "stall_seconds"),
        (lambda: costs(recovery_seconds=float("inf")), "recovery_seconds"),
        (lambda: costs(recompute_fraction=0.0), "recompute_fraction"),
        (lambda: costs(recompute_fraction=1.5), "recompute_fraction"),
        (lambda: costs(rework_seconds=-0.1), "rework_seconds"),
        (lambda: ettr_at_scale(costs(), gpus=0, mtbf_minutes_per_job=10), "gpus"),
        (lambda: ettr_at_scale(costs(), gpus=8), "mtbf_minutes_per_job"),
        (lambda: ettr_at_scale(costs(), gpus=8, mtbf_minutes_per_job=10, gpu_mtbf_hours=5), "mtbf_minutes_per_job"),
        (lambda: ettr_at_scale(costs(), gpus=8, mtbf_minutes_per_job=0), "mtbf_minutes_per_job"),
        (lambda: ettr_at_scale(costs(), gpus=8, gpu_mtbf_hours=-1), "gpu_mtbf_hours"),
        (lambda: window_rework_seconds(0, 1.0), "window"),
        (lambda: modeled_peers(**{**PEERS, "dense_bytes": 0}), "dense_bytes"),
        (lambda: modeled_peers(**{**PEERS, "stages": 0}), "stages"),
        (lambda: modeled_peers(**{**PEERS, "network_bytes_per_second": -1.0}), "network_bytes_per_second"),
        (lambda: modeled_peers(**PEERS, checkfreq_overhead=1.0), "checkfreq_overhead"),
        (lambda: modeled_peers(**PEERS, gemini_peer_copies=0), "gemini_peer_copies"),
        (lambda: lifeline_costs(step_seconds=1.0, stall_seconds=0.0, recovery_seconds=1.0, window=0, stages=2),
         "window"),
        (lambda: lifeline_costs(step_seconds=1.0, stall_seconds=-1.0, recovery_seconds=1.0, window=2, stages=2),
         "stall_seconds"),
        (lambda: lifeline_costs(step_seconds=1.0, stall_seconds=0.0, recovery_seconds=1.0, window=2, stages=2,
                                recompute_fraction=2.0), "recompute_fraction"),
        (lambda: ettr_table([]), "systems"),
        (lambda: ettr_table([costs(), costs()]), "systems"),
        (lambda: ettr_table([{"name": "x"}]), "systems"),
        (lambda: lifeline_costs(step_seconds=1.0, stall_seconds=0.0, recovery_seconds=1.0, window=2, stages=0,
                                recompute_fraction=0.5), "stages"),
        (lambda: ettr_table([costs()], mtbf_minutes=()), "mtbf_minutes"),
        (lambda: ettr_table([costs()], mtbf_minutes=(10, -1)), "mtbf_minutes_per_job"),
    ],
)
def test_bad_input_raises_config_error_naming_the_field(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field and field in str(err.value)
