"""ETTR of a large job: shared costs, each system's description, one formula (lifeline.control.ettr)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lifeline.control import expected_ettr
from lifeline.control.ettr import (
    SharedCosts,
    SystemCosts,
    checkfreq,
    ettr_at_scale,
    ettr_table,
    failure_terms,
    gemini,
    lifeline_costs,
    modeled_peers,
    moevement,
    moevement_window,
    pipeline_replay_pace,
    rollback_lost_seconds,
    window_rework_seconds,
)
from lifeline.errors import ConfigError

GB = 10**9
# one GPU of an MoE job: 30 GB of fp32 weights + Adam moments; 2 s iterations; 16,384 GPUs failing
# once every 10 minutes
SHARED = SharedCosts(iteration_seconds=2.0, gpus=16384, gpu_mtbf_seconds=16384 * 600.0, detection_seconds=5.0,
                     restart_seconds=20.0, rendezvous_seconds=5.0, dense_bytes=30 * GB,
                     host_bytes_per_second=12 * GB, network_bytes_per_second=3 * GB,
                     storage_bytes_per_second=GB // 2, replay_pace=0.5)


def system(**kw) -> SystemCosts:
    base = {"name": "x", "interval_iterations": 5, "stall_seconds": 1.0, "checkpoint_bytes": 30 * GB,
            "restore_tier": "peer", "restore_bytes": 30 * GB, "recompute": "rollback", "lost_seconds": 5.5}
    return SystemCosts(**{**base, **kw})


def test_one_formula_for_every_system():
    # u = 10 / 11; per failure D + S + Z = 30 s, restore 30 GB / 3 GB/s = 10 s, rework 5.5 s; M = 600 s
    s = system()
    terms = failure_terms(s, SHARED)
    assert terms == pytest.approx({"useful": 10 / 11, "restore_s": 10.0, "recovery_s": 40.0, "rework_s": 5.5,
                                   "lost_per_failure_s": 45.5})
    assert ettr_at_scale(s, SHARED) == pytest.approx(10 / 11 * (1 - 45.5 / 600))


def test_replay_is_charged_in_wall_clock_seconds_of_the_whole_job():
    # survivors wait: the replay costs its wall time (lost x pace) for every GPU, not rank-seconds
    replay = system(recompute="replay", lost_seconds=40.0)
    assert failure_terms(replay, SHARED)["rework_s"] == 40.0 * SHARED.replay_pace == 20.0
    assert ettr_at_scale(replay, SHARED) == pytest.approx(10 / 11 * (1 - (40 + 20) / 600))
    # at pace 1 a localized replay costs the job what a rollback of the same progress does
    full = replace(SHARED, replay_pace=1.0)
    assert ettr_at_scale(replay, full) == ettr_at_scale(replace(replay, recompute="rollback"), SHARED)


def test_restore_tier_sets_the_bandwidth():
    seconds = {tier: failure_terms(system(restore_tier=tier), SHARED)["restore_s"]
               for tier in ("host", "peer", "storage")}
    assert seconds == pytest.approx({"host": 2.5, "peer": 10.0, "storage": 60.0})


def test_periodic_rollback_reduces_to_expected_ettr():
    s = system(lost_seconds=rollback_lost_seconds(10.0 + 1.0))
    r = SHARED.fixed_recovery_seconds + 10.0
    assert ettr_at_scale(s, SHARED) == pytest.approx(
        expected_ettr(interval_seconds=10.0, save_seconds=1.0, restore_seconds=r, mtbf_seconds=600.0))


def test_failure_rate_follows_the_gpu_count():
    # the job's MTBF is the GPU's over the GPU count: the GPU count changes the ETTR
    assert SHARED.job_mtbf_seconds == 600.0 and SHARED.failure_rate == pytest.approx(1 / 600)
    s = system()
    twice = replace(SHARED, gpus=2 * 16384)
    assert twice.job_mtbf_seconds == 300.0
    assert ettr_at_scale(s, twice) < ettr_at_scale(s, SHARED)
    assert SHARED.with_job_mtbf(20).gpu_mtbf_seconds == 16384 * 1200.0
    assert ettr_at_scale(s, SHARED.with_job_mtbf(10)) == ettr_at_scale(s, SHARED)


def test_clamped_to_unit_interval():
    assert ettr_at_scale(system(lost_seconds=10_000.0), SHARED) == 0.0
    free = replace(SHARED, detection_seconds=0.0, restart_seconds=0.0, rendezvous_seconds=0.0)
    assert ettr_at_scale(system(stall_seconds=0.0, restore_bytes=0.0, lost_seconds=0.0), free) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.floats(0, 10), st.floats(0, 500), st.floats(0, 1e11), st.floats(1, 1000),
       st.floats(1, 1000))
def test_monotone_in_mtbf(k, c, lost, restore, m1, m2):
    s = system(interval_iterations=k, stall_seconds=c, lost_seconds=lost, restore_bytes=restore)
    lo, hi = sorted((m1, m2))
    a, b = (ettr_at_scale(s, SHARED.with_job_mtbf(m)) for m in (lo, hi))
    assert 0.0 <= a <= b + 1e-12 <= 1.0 + 1e-12


def test_lost_progress_formulas():
    assert rollback_lost_seconds(4.0, 1.5) == 3.5  # half a period, plus the durability lag
    assert window_rework_seconds(6, 0.5) == (1.5 * 6 - 1) * 0.5 == 4.0  # W - 1 to consistency + W / 2
    assert window_rework_seconds(1, 2.0) == rollback_lost_seconds(2.0)  # W = 1 is a dense checkpoint
    assert window_rework_seconds(4, 1.0, 0.25) == 5.25
    assert pipeline_replay_pace(4, 8) == 8 / 11 and pipeline_replay_pace(1, 1) == 1.0


def test_checkfreq_follows_its_design():
    snap, persist = 30 / 12, 30 / 0.5
    own = checkfreq(SHARED)
    # its interval: the smallest with stall <= 3.5 % of training; the persist ends before the next snapshot
    assert own.stall_seconds <= 0.035 * own.interval_iterations * 2.0
    assert checkfreq(SHARED, interval_iterations=own.interval_iterations - 1).stall_seconds > 0.035 * (
        own.interval_iterations - 1) * 2.0
    assert (own.restore_tier, own.restore_bytes, own.recompute) == ("storage", 30 * GB, "rollback")
    every = checkfreq(SHARED, interval_iterations=1)
    assert every.stall_seconds == pytest.approx(snap + persist - 2.0)
    assert every.lost_seconds == pytest.approx((2.0 + every.stall_seconds) / 2 + snap + persist)


def test_gemini_follows_its_design():
    transfer = 30 / 3
    own = gemini(SHARED)
    assert own.interval_iterations == 5 and own.stall_seconds == pytest.approx(30 / 12 - 2.0)  # hides the transfer
    assert (own.restore_tier, own.recompute) == ("peer", "rollback")
    every = gemini(SHARED, interval_iterations=1)
    assert every.stall_seconds == pytest.approx(transfer - 2.0)
    assert gemini(SHARED, interval_iterations=1, peer_copies=2).stall_seconds == pytest.approx(2 * transfer - 2.0)
    small = gemini(replace(SHARED, dense_bytes=GB))
    assert (small.interval_iterations, small.stall_seconds) == (1, 0.0)


def test_moevement_follows_its_design():
    m = moevement(SHARED, window=8, sparse_bytes=4 * GB)
    busy = 4 / 3  # the slot's send to a peer, overlapped with the next iteration
    assert (m.interval_iterations, m.stall_seconds, m.recompute, m.restore_tier) == (1, 0.0, "replay", "peer")
    assert m.restore_bytes == 8 * 4 * GB and m.lost_seconds == pytest.approx((1.5 * 8 - 1) * 2.0 + busy)
    # a slot b(W) = d (1/W + (1 - 1/W) 2/12) = 5 GB + 25 GB / W must cross the 3 GB/s link in 2.1 s: W >= 19.2
    w, b = moevement_window(replace(SHARED, iteration_seconds=2.1), frozen_fraction=2 / 12)
    assert (w, b) == (20, pytest.approx(5 * GB + 25 * GB / 20))
    assert moevement_window(SHARED, frozen_fraction=0.5, max_window=4) == (4, 30 * GB * (0.25 + 0.75 * 0.5))


def test_every_system_pays_the_same_shared_costs():
    systems = (*modeled_peers(SHARED, window=8, sparse_bytes=4 * GB), lifeline_costs(SHARED, stall_seconds=0.05))
    slower = replace(SHARED, restart_seconds=SHARED.restart_seconds + 10.0)
    for s in systems:
        assert failure_terms(s, slower)["recovery_s"] == pytest.approx(failure_terms(s, SHARED)["recovery_s"] + 10.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 64), st.integers(1, 16), st.floats(0.05, 20), st.floats(0.1, 1.0))
def test_localized_replay_loses_no_more_than_a_rollback(stages, window, step, pace):
    shared = replace(SHARED, iteration_seconds=step, replay_pace=pace)
    local = lifeline_costs(shared, stall_seconds=0.01, window=window, sparse_bytes=GB)
    rollback = replace(local, recompute="rollback")
    for m in (10, 20, 60):
        ours, theirs = (ettr_at_scale(c, shared.with_job_mtbf(m)) for c in (local, rollback))
        assert ours >= theirs


def test_lifeline_costs_from_measurements():
    dense = lifeline_costs(SHARED, stall_seconds=0.02)
    assert (dense.name, dense.interval_iterations, dense.stall_seconds, dense.recompute) == (
        "Lifeline", 1, 0.02, "replay")
    assert dense.restore_bytes == 30 * GB and dense.lost_seconds == pytest.approx(2.02 / 2 + 10.0)
    sparse = lifeline_costs(SHARED, stall_seconds=0.02, window=6, sparse_bytes=3 * GB, name="sparse")
    assert sparse.restore_bytes == 18 * GB and sparse.lost_seconds == pytest.approx(8 * 2.02 + 1.0)


def test_ettr_table_is_json_ready():
    ours = lifeline_costs(SHARED, stall_seconds=0.05)
    table = ettr_table((*modeled_peers(SHARED, window=8, sparse_bytes=4 * GB), ours), SHARED)
    assert json.loads(json.dumps(table)) == table
    assert table["gpus"] == 16384 and table["mtbf_minutes"] == [10.0, 20.0, 60.0]
    assert table["gpu_mtbf_hours"]["10"] == pytest.approx(16384 * 10 / 60)
    assert table["at_gpu_mtbf"] == pytest.approx({"gpu_mtbf_hours": 16384 / 6, "job_mtbf_minutes": 10.0})
    assert list(table["systems"]) == ["CheckFreq", "Gemini", "MoEvement", "Lifeline"]
    row = table["systems"]["Lifeline"]
    assert row["ettr"]["10"] == ettr_at_scale(ours, SHARED) == row["ettr_at_gpu_mtbf"]
    assert row["ettr"]["10"] <= row["ettr"]["20"] <= row["ettr"]["60"]
    assert (row["interval_s"], row["stall_s"], row["recompute"], row["restore_tier"]) == (2.0, 0.05, "replay", "peer")
    assert row["recovery_s"] == pytest.approx(30 + 10) and row["rework_s"] == pytest.approx((2.05 / 2 + 10) * 0.5)
    assert list(ettr_table([ours], SHARED, mtbf_minutes=(7.5,))["systems"]["Lifeline"]["ettr"]) == ["7.5"]


def test_bench_rows_charge_every_system_the_measured_costs():
    from lifeline.bench._moe_ettr import GPU_MTBF_HOURS, ettr_rows, measured_recovery_seconds

    checkpoint = [{"experts_per_layer": 32, "step_seconds": 0.2, "window": 2, "dense_bytes_per_step": 40_000_000,
                   "sparse_bytes_per_step": 12_000_000, "copy_bytes_per_second": 4e9,
                   "dense_overlapped_stall_seconds": 0.001, "sparse_stall_seconds": 0.004}]
    recovery = {"stages": 3, "localized": {"to_failure_step_seconds": 9.0, "rank_seconds_recomputed": 1.0,
                                           "rank_steps_recomputed": 5, "step_seconds": 0.25}}
    bench = {"replace_l1": {"detect_seconds": 1.5, "breakdown": {"noticed": 1.4, "joined": 6.0},
                            "join_seconds": {"rendezvous": 0.5, "barrier": 0.2, "process_group": 0.3, "connect": None}}}
    assert measured_recovery_seconds(recovery, bench) == pytest.approx(
        {"detection_seconds": 1.5, "restart_seconds": 3.5, "rendezvous_seconds": 1.0,
         "source": "lifeline bench recovery (replace_l1)"})
    assert measured_recovery_seconds(recovery)["restart_seconds"] == 8.0
    assert measured_recovery_seconds(None)["source"] == "assumed"
    table = ettr_rows(checkpoint, recovery, bench)
    assert json.loads(json.dumps(table)) == table
    assert table["shared"]["replay_pace"] == pytest.approx(1.0 / 5 / 0.25)
    assert table["shared"]["gpu_mtbf_seconds"] == GPU_MTBF_HOURS * 3600 and table["gpus"] == 16384
    assert table["at_gpu_mtbf"]["job_mtbf_minutes"] == pytest.approx(54 * 24 * 60 / 419)
    assert set(table["systems"]) == {"CheckFreq", "Gemini", "MoEvement", "Lifeline",
                                     "Lifeline (sparse slots, copied before the next step)"}
    fixed = 1.5 + 3.5 + 1.0
    for row in table["systems"].values():  # the same detection + restart + rendezvous for every system
        assert row["recovery_s"] - row["restore_s"] == pytest.approx(fixed)
    assert table["target"]["lifeline_at_mtbf_10_minutes"] == table["systems"]["Lifeline"]["ettr"]["10"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: system(name=""), "name"),
        (lambda: system(interval_iterations=0), "interval_iterations"),
        (lambda: system(stall_seconds=-1.0), "stall_seconds"),
        (lambda: system(lost_seconds=float("inf")), "lost_seconds"),
        (lambda: system(restore_tier="tape"), "restore_tier"),
        (lambda: system(recompute="pray"), "recompute"),
        (lambda: system(restore_bytes=-1), "restore_bytes"),
        (lambda: replace(SHARED, gpus=0), "gpus"),
        (lambda: replace(SHARED, gpu_mtbf_seconds=0.0), "gpu_mtbf_seconds"),
        (lambda: replace(SHARED, detection_seconds=-1.0), "detection_seconds"),
        (lambda: replace(SHARED, network_bytes_per_second=-1.0), "network_bytes_per_second"),
        (lambda: replace(SHARED, replay_pace=1.5), "replay_pace"),
        (lambda: replace(SHARED, replay_pace=0.0), "replay_pace"),
        (lambda: SHARED.with_job_mtbf(0), "mtbf_minutes_per_job"),
        (lambda: window_rework_seconds(0, 1.0), "window"),
        (lambda: pipeline_replay_pace(0, 4), "stages"),
        (lambda: checkfreq(SHARED, overhead=1.0), "checkfreq_overhead"),
        (lambda: checkfreq(SHARED, interval_iterations=0), "checkfreq_interval"),
        (lambda: gemini(SHARED, peer_copies=0), "gemini_peer_copies"),
        (lambda: moevement(SHARED, window=0, sparse_bytes=GB), "window"),
        (lambda: moevement(SHARED, window=2, sparse_bytes=0), "sparse_bytes"),
        (lambda: moevement_window(SHARED, frozen_fraction=1.0), "frozen_fraction"),
        (lambda: lifeline_costs(SHARED, stall_seconds=-1.0), "stall_seconds"),
        (lambda: lifeline_costs(SHARED, stall_seconds=0.0, window=0), "window"),
        (lambda: ettr_table([], SHARED), "systems"),
        (lambda: ettr_table([system(), system()], SHARED), "systems"),
        (lambda: ettr_table([{"name": "x"}], SHARED), "systems"),
        (lambda: ettr_table([system()], {"gpus": 8}), "shared"),
        (lambda: ettr_table([system()], SHARED, mtbf_minutes=()), "mtbf_minutes"),
        (lambda: ettr_table([system()], SHARED, mtbf_minutes=(10, -1)), "mtbf_minutes_per_job"),
    ],
)
def test_bad_input_raises_config_error_naming_the_field(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field and field in str(err.value)
