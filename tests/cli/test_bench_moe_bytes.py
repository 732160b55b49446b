"""``bench moe``'s checkpoint rows: what a slot copies, and dense copies beside the slots."""

from __future__ import annotations

import pytest

from lifeline.bench._moe_sparse import checkpoint_rows, with_dense


@pytest.mark.parametrize("dense, sparse, window", [(1200, 400, 4), (1200, 1100, 8), (1000, 999.5, 2)])
def test_dense_beside_the_slots_breaks_even_at_the_interval_it_names(dense, sparse, window):
    out = with_dense(dense, sparse, window)
    d = out["dense_every_break_even"]
    assert dense / d + sparse < dense <= dense / (d - 1) + sparse  # the smallest such interval
    for row in out["with_dense_every"]:
        total = dense / row["dense_every"] + sparse
        assert row["total_bytes_per_step"] == round(total)
        assert (row["reduction_vs_dense_every_step"] > 1) == (row["dense_every"] >= d)
    assert [r["dense_every"] for r in out["with_dense_every"]] == [window, 4 * window, 16 * window]


def test_a_slot_as_large_as_the_dense_state_never_breaks_even():
    assert with_dense(1000, 1000, 4)["dense_every_break_even"] is None


def test_measured_rows_are_consistent_with_the_trainer_s_state():
    """One small expert count, measured: the slots copy less than the dense state and each window's
    dense + sparse totals follow from its own measured bytes."""
    (row,) = checkpoint_rows(experts=(4,), steps=2, windows=(4,))
    assert row["experts_per_layer"] == 4 and row["dense_bytes_per_step"] > 0
    for w in [row, *row["by_window"]]:
        assert 0 < w["sparse_bytes_per_step"] <= w["sparse_max_slot_bytes"] <= row["dense_bytes_per_step"]
        expect = with_dense(row["dense_bytes_per_step"], w["sparse_bytes_per_step"], w["window"])
        assert w["dense_every_break_even"] == expect["dense_every_break_even"]
        assert w["with_dense_every"] == expect["with_dense_every"]
    (w4,) = row["by_window"]
    assert w4["window"] == 4 and w4["bytes_reduction"] > 1 and w4["dense_every_break_even"] is not None
    # FROZEN copies in the bfloat16 compute dtype (the default) cost less than fp32 ones of the same schedule
    assert row["compute_dtype"] == "bfloat16" and row["frozen_bytes_per_param"] == 2
    (fp32,) = row["frozen_fp32"]["by_window"]
    assert fp32["window"] == 4 and w4["sparse_bytes_per_step"] < fp32["sparse_bytes_per_step"] < row["dense_bytes_per_step"]
