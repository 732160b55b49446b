"""``bench moe --model pipelining-moe``: its jobs are the example's TrainingJob, and its checkpoint row."""

from __future__ import annotations

from lifeline.bench._moe_pipelining import EXAMPLE, pipelining_checkpoint_row
from lifeline.bench._moe_recovery import job_doc
from lifeline.launch.spec import load_for_launch


def test_the_recovery_jobs_run_the_example_script_with_the_rows_settings():
    dense = job_doc("d", steps=12, every=4, localized=True, l2="file:///tmp/l2", model="pipelining-moe")
    sparse = job_doc("s", steps=12, every=4, localized=False, l2="file:///tmp/l2", sparse=3, model="pipelining-moe")
    for doc in (dense, sparse):
        load_for_launch(doc)  # a valid TrainingJob
        (trainer,) = doc["spec"]["template"]["spec"]["containers"]
        assert trainer["command"] == ["python", str(EXAMPLE / "train.py")]
        assert doc["spec"]["layout"]["pipeline"] == 3 and doc["spec"]["steps"] == 12
    assert dense["spec"]["checkpoint"]["every"] == 4 and "sparse" not in dense["spec"]["checkpoint"]
    assert dense["spec"]["recovery"]["localizedReplay"] is True
    assert sparse["spec"]["checkpoint"]["every"] == 12 and sparse["spec"]["checkpoint"]["sparse"] == {"window": 3}
    assert sparse["spec"]["recovery"]["localizedReplay"] is False


def test_the_checkpoint_row_compares_each_stages_dense_state_with_the_slot_bytes():
    row = pipelining_checkpoint_row({"localized_sparse": {"window": 3, "slot_bytes_per_rank_step": 1000}})
    first, middle, last = row["dense_bytes_per_stage"]
    assert middle < first and middle < last, "the first stage embeds and the last predicts: both are larger"
    assert row["bytes_reduction"] == round(sorted(row["dense_bytes_per_stage"])[1] / 1000, 3)
    assert pipelining_checkpoint_row(None)["bytes_reduction"] is None
