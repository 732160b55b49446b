"""Chaos parts that need no processes: the new ``--inject-failure`` kinds, the schedules, the trial
verdict and the time-lost attribution (issue 15)."""

from __future__ import annotations

import threading

import pytest

from lifeline._poll import wait_for
from lifeline.bench._chaos_audit import corruption_outcomes
from lifeline.bench._chaos_schedule import FAULTS, fault_name, schedule
from lifeline.bench._chaos_trial import time_lost, verdict
from lifeline.errors import CatalogError, ConfigError
from lifeline.launch.inject import Injection, due, hold_steps, parse_injection
from lifeline.launch.preflight import check_run
from lifeline.launch import _holds
from lifeline.runtime import _hold

from ._jobs import job_doc, write_job


def test_new_kinds_parse_and_print_back():
    cases = {"redis:step=4": Injection("redis", 0, 4),
             "minio:step=3:seconds=2.5": Injection("minio", 0, 3, seconds=2.5),
             "flip:rank=1:step=5:tier=L2": Injection("flip", 1, 5, "L2"),
             "hang:rank=0:step=2:when=recovery": Injection("hang", 0, 2, when="recovery")}
    for text, inj in cases.items():
        assert parse_injection(text, world_size=2, steps=12) == inj
        assert parse_injection(str(inj)) == inj
    assert Injection("flip", 1, 5, "L0").kills == ("trainer",) and not Injection("flip", 1, 5, "L0").loses_node
    assert Injection("flip", 1, 5, "L1").loses_node and Injection("node", 1, 5).loses_node


@pytest.mark.parametrize("text, words", [
    ("redis:rank=0:step=3", ["redis", "rank"]), ("flip:rank=1:step=3", ["missing tier"]),
    ("flip:rank=1:step=3:tier=L3", ["L3"]), ("trainer:rank=1:step=3:tier=L0", ["tier applies to flip"]),
    ("minio:step=3:seconds=0", ["seconds"]), ("minio:step=3:seconds=x", ["seconds must be a number"]),
    ("node:rank=1:step=3:when=later", ["when=recovery"]), ("redis:step=0", ["step 0"]),
])
def test_bad_new_kinds_name_the_flag_and_the_problem(text, words):
    with pytest.raises(ConfigError) as err:
        parse_injection(text, world_size=2, steps=12)
    assert err.value.field == "--inject-failure" and all(w in err.value.message for w in words), err.value.message


def test_due_fires_service_faults_on_any_rank_and_recovery_faults_only_during_one():
    pending = [Injection("redis", 0, 5), Injection("trainer", 1, 3, when="recovery"), Injection("node", 1, 4)]
    assert due(pending, {0: 5, 1: 3}) == [Injection("redis", 0, 5)]
    assert due(pending, {0: 5, 1: 4}) == [Injection("node", 1, 4)]
    assert due(pending, {0: 5, 1: 4}, recovering=True) == [Injection("trainer", 1, 3, when="recovery")]
    assert pending == []


def test_held_faults_fire_at_their_hold_together_and_fall_back_on_a_later_step():
    """Issue 22: a fault due at step S fires when its trainer holds at S, not when a step report is seen;
    faults due at one step wait for each other; a rank past S (no hold) fires by the reports."""
    kill, hang = Injection("trainer", 1, 4), Injection("hang", 2, 4)
    late, during = Injection("redis", 0, 9), Injection("trainer", 0, 3, when="recovery")
    pending = [kill, hang, late, during]
    assert hold_steps(pending, 0) == (9,) and hold_steps(pending, 1) == (4,) and hold_steps(pending, 3) == ()
    assert not during.holds and kill.holds
    assert due(pending, {0: 4, 1: 4, 2: 4}, held=set()) == [], "step 4 reported: no hold yet, nothing fires"
    assert due(pending, {0: 4, 1: 4, 2: 4}, held={(1, 4)}) == [], "rank 2 is not holding at step 4 yet"
    assert due(pending, {0: 4, 1: 4, 2: 4}, held={(1, 4), (2, 4)}) == [kill, hang]
    assert due(pending, {0: 9, 1: 9}, held=set()) == [], "reported step 9 without a hold"
    assert due(pending, {0: 9, 1: 9}, held=set(), recovering=True) == [during]
    assert due(pending, {0: 9, 1: 10}, held=set()) == [late], "a step past 9 (the hold timed out): fallback"
    assert pending == []
    assert due([Injection("node", 1, 4)], {1: 4}) == [Injection("node", 1, 4)], "without holds: the reports"


def test_a_trainer_holds_until_the_launcher_releases_it_once_per_step(tmp_path):
    """The launcher's side (launch/_holds.py) and the trainer's (runtime/_hold.py) of one protocol."""
    events: list[tuple[str, int | None]] = []

    class Ctx:
        rank, generation = 1, 0

        def report(self, event, *, record=True, **fields):
            events.append((event, fields.get("step")))

    for name in ("HOLD_ENV", "HOLD_DIR_ENV"):
        assert getattr(_holds, name) == getattr(_hold, name)
    assert _holds.hold_path(tmp_path, 4) == _hold.hold_path(tmp_path, 4)
    assert _holds.release_path(tmp_path, 4) == _hold.release_path(tmp_path, 4)
    env = _holds.hold_env([Injection("trainer", 1, 7), Injection("sidecar", 1, 4), Injection("node", 0, 2),
                           Injection("hang", 1, 9, when="recovery")], 1, tmp_path)
    assert env == {_hold.HOLD_ENV: "4,7", _hold.HOLD_DIR_ENV: str(tmp_path / "holds" / "rank-1")}
    assert _holds.hold_env([Injection("redis", 0, 5)], 1, tmp_path) == {}
    assert _hold.Hold.from_env({_hold.HOLD_ENV: "4"}) is None
    assert _hold.Hold.from_env({_hold.HOLD_ENV: "x", _hold.HOLD_DIR_ENV: "/d"}) is None
    hold = _hold.Hold.from_env({**env, _hold.HOLD_DIR_ENV: str(tmp_path)})
    assert hold is not None and hold.steps == {4, 7}
    hold.at(Ctx(), 3)
    assert events == [] and not list(tmp_path.iterdir())

    def launcher():  # what the supervisor does: see the marker, fire, release
        wait_for(_holds.hold_path(tmp_path, 4).exists, timeout=30, what="the trainer's hold-4 marker")
        _holds.release(tmp_path, 4)

    settled = []
    thread = threading.Thread(target=launcher)
    thread.start()
    hold.at(Ctx(), 4, settle=lambda: settled.append(True))
    thread.join()
    assert settled == [True] and [e for e, _ in events] == ["hold", "held"]
    assert _holds.release_path(tmp_path, 4).exists() and not _holds.hold_path(tmp_path, 4).exists()
    events.clear()
    again = _hold.Hold.from_env({**env, _hold.HOLD_DIR_ENV: str(tmp_path)})  # a restarted trainer re-runs step 4
    again.at(Ctx(), 4)
    assert events == [], "a released step does not hold again"
    again.timeout = 0.05
    again.at(Ctx(), 7)  # nobody releases: it goes on after the timeout, and holds step 7 no more
    assert events == [("hold", 7), ("hold_timeout", 7)] and not _holds.hold_path(tmp_path, 7).exists()
    again.at(Ctx(), 7)
    assert events == [("hold", 7), ("hold_timeout", 7)]


def test_preflight_refuses_faults_the_run_cannot_carry_out(tmp_path):
    doc = job_doc("pre", pipeline=2, data=1)
    doc["spec"]["checkpoint"]["peerReplicas"] = 0
    job = write_job(tmp_path / "j.yaml", doc)
    with pytest.raises(ConfigError) as err:
        check_run(job, inject=["minio:step=3", "flip:rank=1:step=3:tier=L1"], persist_uri=str(tmp_path / "l2"),
                  state_dir=tmp_path / "s")
    assert "starts no MinIO" in err.value.message and "no L1 copies" in err.value.message
    assert not (tmp_path / "s").exists()


def test_schedules_are_seeded_and_draw_every_fault():
    a = [schedule(s, world_size=2, steps=12, persist_every=4) for s in range(200)]
    assert a == [schedule(s, world_size=2, steps=12, persist_every=4) for s in range(200)]
    names = {fault_name(i) for t in a for i in t.injections}
    assert {f for f in FAULTS} <= names and any(n.endswith("+recovery") for n in names)
    for t in a:
        assert all(2 <= i.step <= 10 for i in t.injections)
        assert all(i.step > 4 for i in t.injections if i.kind == "flip" and i.tier == "L2")


def _summary(**over):
    s = {"phase": "Succeeded", "digest": {"sha256": "a"}, "complete_step": {"regressions": []},
         "audit": {"torn": [], "flipped_visible": [], "stale": [], "checked": {}}, "faults": [],
         "corruption_reports": [], "recoveries": [], "step_samples": [], "step_seconds": 0.1, "error": None}
    s.update(over)
    return s


def test_verdict_names_each_failed_check():
    ref = {"digest": {"sha256": "a"}}
    assert verdict(_summary(), ref) == []
    flip = {"fault": "flip:rank=0:step=3:tier=L1", "kind": "flip", "copies": [{"step": 2, "rank": 0, "tier": "L1"}],
            "note": "", "at": 10.0, "step": 3, "recovers": True, "tier": "L1"}
    bad = verdict(_summary(phase="Failed", digest={"sha256": "b"}, complete_step={"regressions": [{"from": 3, "to": 1}]},
                           audit={"torn": [{"step": 1}], "flipped_visible": [], "stale": [], "checked": {}},
                           faults=[flip], restores=[{"step": 2, "rank": 0, "tier": "L1", "at": 11.0}]), ref)
    text = " | ".join(bad)
    for words in ("ended Failed", "differs", "moved backwards", "torn", "restored without a report"):
        assert words in text, text
    ok = _summary(faults=[flip], corruption_reports=[{"step": 2, "rank": 0, "tier": "L1"}],
                  restores=[{"step": 2, "rank": 0, "tier": "L1", "at": 9.0}])  # restored before the flip: fine
    assert verdict(ok, ref) == [] and ok["corruption"]["detected"] == 1
    unread = _summary(faults=[flip], audit={"torn": [], "flipped_visible": [{"step": 2, "rank": 0, "tier": "L1"}],
                                            "stale": [], "checked": {}})
    assert verdict(unread, ref) == [] and unread["corruption"]["visible_unread"] == 1
    nothing = dict(flip, copies=[], note="no L1 copy")
    assert any("corrupted no copy" in r for r in verdict(_summary(faults=[nothing]), ref))
    assert verdict(_summary(faults=[dict(nothing, ineffective=True)]), ref) == []
    assert verdict(_summary(faults=[dict(nothing, moot=True)]), ref) == []  # the catalog recorded none


def test_corruption_outcomes_tell_detected_used_gone_and_unread():
    copies = [{"step": s, "rank": 0, "tier": "L1"} for s in (1, 2, 3, 4)]
    out = corruption_outcomes(copies, [{"step": 1, "rank": 0, "tier": "L1"}], [{"step": 3, "rank": 0, "tier": "L1"}],
                              [{"step": 4, "rank": 0, "tier": "L1", "at": 5.0}], {(4, 0, "L1"): 4.0})
    assert (out["detected"], out["gone_unread"], out["visible_unread"]) == (1, 1, 1)
    assert out["used"] == [{"step": 4, "rank": 0, "tier": "L1"}]


def test_time_lost_counts_from_the_fault_through_chained_recoveries():
    def rec(action, round_at, caught):
        return {"action": action, "timeline": {"round_at": round_at, **({"caught_up_at": caught} if caught else {})}}

    faults = [{"fault": "node:rank=1:step=3", "kind": "node", "at": 10.0, "step": 3, "recovers": True},
              {"fault": "trainer:rank=0:step=3:when=recovery", "kind": "trainer", "when": "recovery", "at": 14.0,
               "step": 3, "recovers": True},
              {"fault": "redis:step=8", "kind": "redis", "at": 40.0, "step": 8, "recovers": False}]
    s = _summary(faults=faults, recoveries=[rec("ReplacePods", 12.0, None), rec("RestartInPlace", 15.0, 30.0)],
                 step_samples=[(39.0, 8), (41.0, 8), (42.5, 9)])
    rows = {r["name"]: r for r in time_lost(s)}
    assert rows["node"]["seconds"] == 20.0 and rows["node"]["recoveries"] == ["ReplacePods", "RestartInPlace"]
    assert rows["trainer+recovery"]["seconds"] == 16.0
    assert rows["redis"]["seconds"] == pytest.approx(2.4) and rows["redis"]["recoveries"] == []


class _DownCatalog:
    """A catalog whose Redis is down until the round's service watch restarts it (unit double; the real
    path is fuzz regression seed 3027)."""

    def __init__(self) -> None:
        self.down = True

    def is_registered(self, rank: int) -> bool:
        if self.down:
            raise CatalogError("Redis catalog unavailable: connection refused")
        return True


class _Sup:
    def __init__(self, restarts: bool) -> None:
        self.catalog, self.ticks, self.restarts = _DownCatalog(), 0, restarts
        self.watch = self

    def tick(self) -> None:  # the service watch: restarts Redis when it can
        self.ticks += 1
        if self.restarts:
            self.catalog.down = False


def test_a_flip_after_a_redis_restart_waits_for_the_catalog_and_restarts_redis_itself():
    """Fuzz seed 3027: ``redis:step=6`` and ``flip:...:step=6`` fire in one supervisor round; the flip read
    the catalog while Redis was down, and the round's watch that restarts Redis never ran meanwhile."""
    from lifeline.launch.faults import Faults

    sup = _Sup(restarts=True)
    assert Faults(sup)._await_catalog(2, limit=5.0) and sup.ticks == 1
    never = _Sup(restarts=False)
    assert not Faults(never)._await_catalog(2, limit=0.2) and never.ticks >= 2


def test_an_l2_flip_waits_out_the_minio_outage_of_its_round():
    """Fuzz seed 3077: ``minio:step=6`` and ``flip:...:step=6:tier=L2`` fire in one round; the flip listed
    the storage while MinIO was down. It now waits for the outage's restart, ticking the round's watch."""
    import time as _time

    from lifeline.launch.faults import Faults

    class _Watch:
        def __init__(self, faults_ref: list) -> None:
            self.ticks, self.faults_ref = 0, faults_ref

        def tick(self) -> None:  # the watch restarts MinIO once the outage is over, then clears the mark
            self.ticks += 1
            f = self.faults_ref[0]
            if f.minio_down_until is not None and _time.time() >= f.minio_down_until:
                f.minio_down_until = None

    ref: list = []
    sup = type("Sup", (), {})()
    sup.watch = _Watch(ref)
    faults = Faults(sup)
    ref.append(faults)
    faults.minio_down_until = _time.time() + 0.3
    faults._await_minio(limit=5.0)
    assert faults.minio_down_until is None and sup.watch.ticks >= 2
    faults.minio_down_until = _time.time() + 60  # an outage longer than the limit: the wait ends anyway
    t0 = _time.monotonic()
    faults._await_minio(limit=0.2)
    assert _time.monotonic() - t0 < 2.0 and faults.minio_down_until is not None


def test_a_flip_finds_copies_only_in_live_sidecars():
    """Seed 3220: a node loss took rank 2's sidecar, the only holder of rank 1's L1 copy, just before
    an L1 flip of rank 1; the catalog still recorded the copy, so the flip that found nothing was
    counted as a failed corruption instead of a moot one."""
    from lifeline.api.recovery import Holding
    from lifeline.launch.faults import held_copies

    holdings = {Holding(8, 1, "L0", 1), Holding(8, 1, "L1", 2), Holding(6, 1, "L1", 2), Holding(8, 0, "L1", 1),
                Holding(4, 1, "L2")}
    assert {h.step for h in held_copies(holdings, 1, "L1", {0, 1, 2})} == {6, 8}
    assert held_copies(holdings, 1, "L1", {0, 1}) == []  # rank 2's sidecar is gone: its memory with it
    assert held_copies(holdings, 1, "L0", {1}) == [Holding(8, 1, "L0", 1)]
    assert held_copies(holdings, 1, "L0", {0, 2}) == []
    assert held_copies(holdings, 1, "L2", set()) == [Holding(4, 1, "L2")]


def test_the_run_summary_accounts_overlapping_recoveries_within_the_wall_time():
    """Seed 3314: recoveries that overlap (a failure during a recovery) summed more than the wall time;
    the summary's ETTR raised ConfigError and the run ended without a summary."""
    from lifeline.launch.summary import ettr_terms

    b = ettr_terms(wall_seconds=30.0, kept=12, step_seconds=0.2, stall_seconds=0.5, recovery_seconds=41.0)
    assert b is not None and 0 <= b.ratio <= 1
    assert b.productive > 0 and b.productive + b.checkpoint_stall + b.recovery <= 30.0 + 1e-9
    ok = ettr_terms(wall_seconds=30.0, kept=12, step_seconds=0.2, stall_seconds=0.5, recovery_seconds=10.0)
    assert (ok.productive, ok.checkpoint_stall, ok.recovery) == (12 * 0.2, 0.5, 10.0)  # terms that fit are kept as they are
    assert ettr_terms(wall_seconds=30.0, kept=0, step_seconds=0.2, stall_seconds=0.0, recovery_seconds=0.0) is None


def test_a_trainer_that_has_not_reported_since_it_started_is_starting_not_stuck():
    """Seed 3386: rank 0's trainer, restarted for generation 1, was still importing when generation 2
    was published; it was killed as stuck just after it began hosting generation 2's rendezvous
    store, and the survivors connected to it failed (a third recovery without a fault)."""
    from dataclasses import dataclass

    from lifeline.catalog.documents import ProgressReport
    from lifeline.launch._records import RecoveryRecord, stuck_ranks

    @dataclass
    class Pod:  # the two members stuck_ranks reads of a pod
        trainer_started_at: float
        exit: int | None = None

        def exit_code(self, role: str) -> int | None:
            return self.exit

    rec = RecoveryRecord(generation=2, action="Rollback", failures=[], ranks=[1], from_step=2, restore_step=None,
                         tier=None, started_at=100.0)

    def report(rank: int, at: float, generation: int, **fields) -> ProgressReport:
        return ProgressReport("step", "j", rank, generation, at, 2, fields)

    pods = {0: Pod(98.0), 2: Pod(10.0), 3: Pod(10.0), 4: Pod(10.0), 5: Pod(101.0), 6: Pod(10.0, exit=1)}
    reports = {0: report(0, 50.0, 0),                      # restarted at 98 s, its last report from the old process
               2: report(2, 99.0, 1),                      # a survivor of generation 1 that never read the plan
               3: report(3, 99.0, 1, plan_generation=2),   # read the plan
               4: report(4, 100.5, 2),                     # joined generation 2
               5: report(5, 50.0, 0), 6: report(6, 50.0, 0)}  # started for this plan; dead
    assert stuck_ranks(rec, pods, reports) == [2]
    reports[0] = report(0, 99.0, 1)  # the restarted process reported in generation 1, then stayed there
    assert stuck_ranks(rec, pods, reports) == [0, 2]


def test_an_l0_flip_reaches_every_slot_that_holds_the_step(tmp_path):
    """Seed 3405: a step trained again after a rollback is saved again, with the same bytes, into
    another slot; the sidecar holds the newer copy. The flip must find both slots (and a slot holding
    other bytes or too few of them is not a copy)."""
    import torch

    from lifeline.checkpoint import Layout, PatternRules, plan_shard, seal_shard, write_shard
    from lifeline.launch import find_slots, flip_file, flip_offset

    state = {"w": torch.arange(4096, dtype=torch.float32)}
    plan = plan_shard(state, Layout(), 0, PatternRules())
    blob = bytearray(plan.nbytes)
    write_shard(plan, state, memoryview(blob))
    meta = seal_shard(plan, blob, job="j", step=3)
    slot_bytes = plan.nbytes + 4096
    for name, data in [("slot-000.bin", blob), ("slot-001.bin", b"\0" * plan.nbytes), ("slot-002.bin", blob),
                       ("slot-003.bin", blob[: plan.nbytes // 2])]:
        (tmp_path / name).write_bytes(bytes(data) + b"\0" * (slot_bytes - len(data)))
    found = find_slots(tmp_path, meta)
    assert [p.name for p, _ in found] == ["slot-000.bin", "slot-002.bin"]
    assert all(data == bytes(blob) for _, data in found)
    for path, _ in found:
        flip_file(path, flip_offset(meta))
    assert find_slots(tmp_path, meta) == []
