"""The fuzzer's draws and checks without running a job: determinism, coverage of the configuration and
fault space, and each check on a hand-made run (logs and summary) that it must pass or flag."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from lifeline.bench._chaos_schedule import FAULTS
from lifeline.bench.chaos import STARTUP_GRACE_SECONDS
from lifeline.bench._fuzz_check import (
    extra_recoveries,
    loss_problems,
    replans_after_corruption,
    rung_problems,
    time_bound,
    time_problems,
)
from lifeline.bench._fuzz_draw import DRAWS, MAX_FAULTS, SHAPE_BLOCK, STEPS, draw, layouts
from lifeline.bench.fuzz import commit_seed, replay_command
from lifeline.errors import ConfigError
from lifeline.launch.spec import load_for_launch

SEEDS = range(400)


def test_a_trial_is_a_pure_function_of_its_seed():
    for seed in (0, 7, 12345):
        a, b = draw(seed, max_world=8), draw(seed, max_world=8)
        assert a.describe() == b.describe() and a.doc == b.doc


def test_seeds_of_one_block_share_a_shape_and_differ_otherwise():
    trials = [draw(s, max_world=8) for s in range(4 * SHAPE_BLOCK)]
    for k in range(4):
        block = trials[k * SHAPE_BLOCK:(k + 1) * SHAPE_BLOCK]
        assert len({t.shape_key for t in block}) == 1
    assert len({json.dumps(t.spec, sort_keys=True) for t in trials}) == len(trials)


def test_every_drawn_job_is_valid_and_within_the_world_and_fault_limits():
    for seed in SEEDS:
        t = draw(seed, max_world=8)
        load_for_launch(t.doc)  # raises on a layout or setting lifeline run rejects
        assert 2 <= t.world <= 8 and t.steps == STEPS and 1 <= len(t.injections) <= MAX_FAULTS
        assert t.steps % t.spec["checkpoint"]["persist"]["every"] == 0  # the digest is the L2 state
        for inj in t.injections:
            assert 1 <= inj.step < t.steps and 0 <= inj.rank < t.world
            if inj.kind == "flip" and inj.tier == "L2":
                assert inj.step > t.spec["checkpoint"]["persist"]["every"]
            elif inj.kind == "flip":  # a copy to flip exists
                assert inj.step > t.spec["checkpoint"]["every"]
        load_for_launch(t.reference_doc())


def test_the_draws_cover_every_dimension_setting_fault_and_moment():
    seen: dict[str, Counter] = {}
    for seed in SEEDS:
        d = draw(seed, max_world=8).describe()
        for k in ("schedule", "every", "persist_every", "keep", "sparse_window", "localized_replay", "elastic",
                  "compute_dtype"):
            seen.setdefault(k, Counter())[str(d[k])] += 1
        for dim, v in d["layout"].items():
            seen.setdefault(dim, Counter())[v] += 1
        p = d["layout"]["pipeline"]
        seen.setdefault("micro_vs_stages", Counter())[
            "fewer" if d["micro_batches"] < p else "more" if d["micro_batches"] > p else "equal"] += 1
        for f, m in zip(d["faults"], d["moments"]):
            kind = f.split(":")[0]
            seen.setdefault("faults", Counter())[f"flip:{f.split('tier=')[1][:2]}" if kind == "flip" else kind] += 1
            seen.setdefault("moments", Counter())[m] += 1
    for dim in ("tensor", "pipeline", "data", "expert"):
        assert max(seen[dim]) > 1, f"{dim} is never > 1"
    assert set(seen["schedule"]) == {"gpipe", "1f1b"}
    assert set(seen["compute_dtype"]) == {"float32", "bfloat16"}
    assert {"None", "2", "3", "4"} <= set(seen["sparse_window"])
    assert set(seen["localized_replay"]) == set(seen["elastic"]) == {"True", "False"}
    assert {"1", "2", "3"} <= set(seen["keep"]) and {"1", "2", "3"} <= set(seen["every"])
    assert {"fewer", "more"} <= set(seen["micro_vs_stages"])
    assert set(seen["faults"]) == set(FAULTS)
    assert set(seen["moments"]) == {"random", "boundary", "last", "recovery"}


def test_layouts_respect_the_model_and_the_world_size():
    small = layouts(4)
    assert all(2 <= lay["tensor"] * lay["pipeline"] * lay["data"] * lay["expert"] <= 4 for lay in small)
    assert {"tensor": 1, "pipeline": 2, "data": 2, "expert": 1} in small
    assert all(lay["tensor"] != 3 and lay["expert"] != 3 for lay in layouts(8))  # 3 divides neither 4 heads nor 4 experts


def test_draw_version_1_is_version_2_without_the_compute_dtype():
    """Seeds found under version 1 replay the trial they failed (tests/fuzz/regressions.py); version 2
    adds bfloat16 compute to whole shape blocks (one reference each) and changes nothing else."""
    bf16 = set()
    for seed in SEEDS:
        old, new = draw(seed, max_world=4, draws=1), draw(seed, max_world=4)
        assert "compute_dtype" not in old.spec["model"]["args"] and old.draws == 1 and new.draws == DRAWS
        args = dict(new.spec["model"]["args"])
        if args.pop("compute_dtype", "float32") == "bfloat16":
            bf16.add(seed // SHAPE_BLOCK)
            assert new.shape_key != old.shape_key  # another failure-free reference
        assert {**new.spec, "model": {**new.spec["model"], "args": args}} == old.spec
        assert new.injections == old.injections and new.moments == old.moments
    assert 0 < len(bf16) < len(SEEDS) // SHAPE_BLOCK
    with pytest.raises(ConfigError, match="--draws"):
        draw(0, max_world=4, draws=4)


def test_draw_version_3_adds_one_fault_of_a_new_kind_to_version_2():
    from lifeline.bench._fuzz_draw import NEW_KINDS

    seen = Counter()
    for seed in SEEDS:
        v2, v3 = draw(seed, max_world=4), draw(seed, max_world=4, draws=3)
        assert v3.doc == v2.doc and set(v2.injections) < set(v3.injections)
        (extra,) = [i for i in v3.injections if i not in v2.injections]
        assert extra.kind in NEW_KINDS and 2 <= extra.step <= STEPS - 2 and 0 <= extra.rank < v3.world
        assert extra.transient == (extra.kind == "nan") and extra.when is None  # a NaN that repeats is not drawn
        assert [i.step for i in v3.injections] == sorted(i.step for i in v3.injections)
        assert len(v3.moments) == len(v3.injections)
        load_for_launch(v3.doc)
        seen[extra.kind] += 1
    assert set(seen) == set(NEW_KINDS)


def test_which_faults_call_for_a_recovery():
    from lifeline.launch.faults import recovers
    from lifeline.launch.inject import Injection

    assert recovers(Injection("preempt", 0, 3)) and recovers(Injection("nan", 0, 3, transient=True))
    assert not recovers(Injection("nan", 0, 3))  # a repeated NaN skips its batch: no recovery
    assert not recovers(Injection("slow", 0, 3)) and not recovers(Injection("minio", 0, 3))
    assert all(recovers(Injection(k, 0, 3)) for k in ("trainer", "sidecar", "node", "hang"))


def test_replay_command_and_commit_seed(monkeypatch, tmp_path):
    assert replay_command(17) == "lifeline bench fuzz --seed 17 --trials 1"
    assert replay_command(17, 4) == "lifeline bench fuzz --seed 17 --trials 1 --max-world 4"
    assert replay_command(17, 4, draws=1) == "lifeline bench fuzz --seed 17 --trials 1 --max-world 4 --draws 1"
    assert replay_command(17, draws=DRAWS) == "lifeline bench fuzz --seed 17 --trials 1"
    monkeypatch.setenv("LIFELINE_FUZZ_SEED", "4242")
    assert commit_seed() == 4242
    monkeypatch.delenv("LIFELINE_FUZZ_SEED")
    assert commit_seed(tmp_path) == 0  # not a git checkout
    assert commit_seed(Path(__file__).parent) >= 0


def test_loss_check_flags_a_mismatch_and_a_missing_step_but_not_repeats():
    ref = {(1, 1): [5.0], (2, 1): [4.0], (3, 1): [3.0]}
    assert loss_problems({(1, 1): [5.0], (2, 1): [4.0, 4.0], (3, 1): [3.0]}, ref) == []
    found = loss_problems({(1, 1): [5.0], (2, 1): [4.0, 4.5]}, ref)
    assert len(found) == 2 and "step 2 rank 1: 4.5 != 4.0" in found[0] and "step 3 rank 1" in found[1]


# ---------------------------------------------------------------------------------- a hand-made run
T0 = 1_000_000.0


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _logs(tmp_path: Path, saved_until: int, world: int = 2) -> Path:
    """Two ranks saving every step (one per second from T0), each shard replicated to the other rank,
    L2 commits every 4 steps."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(world):
        tr, sc = [], []
        for s in range(1, saved_until + 1):
            t = T0 + s
            tr.append({"event": "save", "rank": r, "step": s, "time": t, "generation": 0})
            sc.append({"time": _iso(t + 0.1), "message": f"replicated shard step {s} to rank {1 - r}", "rank": r,
                       "step": s, "target": 1 - r})
            if s % 4 == 0 and r == 0:
                sc.append({"time": _iso(t + 0.2), "message": f"committed step {s} to L2 (manifest written last)",
                           "rank": 0})
        (logs / f"rank-{r}-node-{r}-trainer.log").write_text("".join(json.dumps(e) + "\n" for e in tr))
        (logs / f"rank-{r}-node-{r}-sidecar.log").write_text("".join(json.dumps(e) + "\n" for e in sc))
    return logs


def _rec(action: str, round_at: float, restore: int | None, ranks: list[int], tier: str | None = "L0",
         from_step: int = 9, caught: float | None = None) -> dict:
    return {"action": action, "generation": 1, "failures": ["x"], "ranks": ranks, "from_step": from_step,
            "restore_step": restore, "tier": tier, "timeline": {"round_at": round_at, "caught_up_at": caught}}


def _fault(kind: str, rank: int, at: float, tier: str | None = None, recovers: bool = True) -> dict:
    return {"fault": f"{kind}:rank={rank}", "kind": kind, "rank": rank, "tier": tier, "when": None, "at": at,
            "step": 9, "recovers": recovers, "copies": [], "nodes": [], "note": "", "ineffective": False}


def test_rung_check_passes_the_cheapest_restore_and_flags_a_needless_rollback(tmp_path):
    logs = _logs(tmp_path, 9)
    fault = _fault("trainer", 1, T0 + 9.5)
    good = {"recoveries": [_rec("RestartInPlace", T0 + 10, 9, [1])], "faults": [fault]}
    assert rung_problems(good, logs, world=2, keep=2) == []
    initial = {"recoveries": [_rec("Rollback", T0 + 20, None, [1], tier=None)], "faults": [fault]}
    (found,) = [p for p in rung_problems(initial, logs, world=2, keep=2) if "is a Rollback to the initial state although" in p]
    assert "step 9 had a copy" in found
    older = {"recoveries": [_rec("Rollback", T0 + 20, 8, [1], tier="L2")], "faults": [fault]}
    assert any("memory tiers held" in p for p in rung_problems(older, logs, world=2, keep=2))


def test_rung_check_counts_lost_sidecars_and_keep(tmp_path):
    logs = _logs(tmp_path, 9)
    # both nodes lost before the plan: only L2 (step 8) is left, a Rollback to 8 is the cheapest
    faults = [_fault("node", 0, T0 + 9.5), _fault("node", 1, T0 + 9.6)]
    rec = {"recoveries": [_rec("Rollback", T0 + 20, 8, [0, 1], tier="L2")], "faults": faults}
    assert rung_problems(rec, logs, world=2, keep=2) == []
    # a ReplacePods answering only a trainer kill is not the cheapest rung
    rp = {"recoveries": [_rec("ReplacePods", T0 + 20, 9, [1], tier="L1")], "faults": [_fault("trainer", 1, T0 + 9.5)]}
    assert any("no pod was lost" in p for p in rung_problems(rp, logs, world=2, keep=2))


def test_a_second_recovery_without_a_second_fault_is_counted(tmp_path):
    f1 = _fault("trainer", 1, T0 + 5)
    one = {"recoveries": [_rec("LocalizedReplay", T0 + 6, 4, [1]), _rec("ReplacePods", T0 + 30, 4, [1])],
           "faults": [f1]}
    (line,) = extra_recoveries(one)
    assert "recovery 2 (ReplacePods" in line and "after a LocalizedReplay" in line
    two = dict(one, faults=[f1, _fault("node", 1, T0 + 20)])
    assert extra_recoveries(two) == []
    redis = dict(one, faults=[f1, _fault("redis", 0, T0 + 20, recovers=False)])
    assert len(extra_recoveries(redis)) == 1


def test_a_flipped_copy_found_corrupt_when_read_may_call_for_one_more_plan(tmp_path):
    flip = dict(_fault("flip", 1, T0 + 5, tier="L1"), copies=[{"step": 4, "rank": 1, "tier": "L1", "holder": 0}])
    recs = [_rec("ReplacePods", T0 + 6, 4, [1], tier="L1"), _rec("RestartInPlace", T0 + 20, 3, [1], tier="L1")]
    unreported = {"recoveries": recs, "faults": [flip]}
    assert len(extra_recoveries(unreported)) == 1 and replans_after_corruption(unreported) == 0
    reported = dict(unreported, corruption_reports=[{"step": 4, "rank": 1, "tier": "L1", "by": 0, "at": T0 + 15}])
    assert extra_recoveries(reported) == [] and replans_after_corruption(reported) == 1
    late = dict(unreported, corruption_reports=[{"step": 4, "rank": 1, "tier": "L1", "by": 0, "at": T0 + 25}])
    assert len(extra_recoveries(late)) == 1  # found after the second plan: not its cause


def test_the_same_copy_flipped_twice_calls_for_one_more_plan_each_time():
    """A step persisted again after a rollback and flipped again (fuzz seed 12836737): the first flip's
    report, from before the second flip fired, is not the second one's detection."""
    copy = [{"step": 6, "rank": 1, "tier": "L2", "holder": None}]
    f1, f2 = (dict(_fault("flip", 1, T0 + t, tier="L2"), copies=copy) for t in (5, 40))
    recs = [_rec("Rollback", T0 + 6, 6, [1], tier="L2"), _rec("Rollback", T0 + 20, None, [1], tier=None),
            _rec("Rollback", T0 + 41, 6, [1], tier="L2"), _rec("Rollback", T0 + 60, None, [1], tier=None)]
    reports = [{"step": 6, "rank": 1, "tier": "L2", "by": 1, "at": T0 + t} for t in (15, 50)]
    both = {"recoveries": recs, "faults": [f1, f2], "corruption_reports": reports}
    assert extra_recoveries(both) == [] and replans_after_corruption(both) == 2
    once = dict(both, corruption_reports=reports[:1])  # the second flip's copy was never found corrupt
    (line,) = extra_recoveries(once)
    assert "recovery 4" in line


def test_a_copy_logged_as_its_holder_died_does_not_count(tmp_path):
    from lifeline.bench._fuzz_copies import Copies

    logs = _logs(tmp_path, 9)
    # rank 1's node dies 0.5 s before rank 0's replication of step 9 to it is logged
    c = Copies(logs, [_fault("node", 1, T0 + 9.0)], world=2, keep=2)
    assert 9 not in c.held(0, T0 + 30, ("L1",), []) and 8 not in c.held(0, T0 + 30, ("L1",), [])
    assert c.held(0, T0 + 30, ("L0",), []) == {8, 9} and c.held(1, T0 + 30, ("L0", "L1"), []) == {8, 9}


def test_time_bounds_grow_with_the_world_and_flag_a_slow_recovery():
    assert time_bound("trainer", 4) > time_bound("trainer", 2)
    assert time_bound("hang+recovery", 2) > time_bound("hang", 2)
    # a hang during a recovery may hit a trainer before it reported: found after the start-up grace
    assert time_bound("hang+recovery", 4) >= STARTUP_GRACE_SECONDS + 30 > time_bound("trainer+recovery", 4)
    assert time_bound("minio", 2, "minio:step=3:seconds=5") == time_bound("minio", 2) + 5
    s = {"faults": [_fault("trainer", 1, T0)], "recoveries": [_rec("RestartInPlace", T0 + 1, 8, [1],
                                                                     caught=T0 + 500)]}
    rows, problems = time_problems(s, 2)
    assert rows[0]["seconds"] == 500 and len(problems) == 1 and "bound" in problems[0]


def test_the_cli_rejects_bad_flags():
    from typer.testing import CliRunner

    from lifeline.bench.cli import app
    from lifeline.errors import ConfigError

    res = CliRunner().invoke(app, ["fuzz", "--trials", "0", "--max-world", "9"])
    assert isinstance(res.exception, ConfigError)
    assert "--trials" in str(res.exception) and "--max-world" in str(res.exception)


@pytest.mark.parametrize("seed", [0, 1])
def test_shape_reference_doc_keeps_the_numbers_and_drops_the_recovery_settings(seed):
    t = draw(seed, max_world=8)
    ref = t.reference_doc()["spec"]
    assert ref["layout"] == t.spec["layout"] and ref["steps"] == t.steps
    assert {k: v for k, v in ref["model"]["args"].items()} == \
        {k: v for k, v in t.spec["model"]["args"].items() if k != "schedule"}
    assert "sparse" not in ref["checkpoint"] and not ref["recovery"].get("localizedReplay")
