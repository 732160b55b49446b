"""The engine's rule for a rank frozen during a recovery (issue 22; docs/control.md "Hangs during a
recovery"): trainers beat every second while they start or recover, so while another rank beats, a
rank whose *current incarnation* spoke and then stayed silent for ``hangTimeoutSeconds`` is frozen,
found in seconds instead of after ``startupGraceSeconds``. A rank whose current incarnation has not
spoken yet is starting, whoever started it: fuzz seed 606 had one created by the previous plan and
one restarted by the runner as a straggler, and took both for frozen survivors (the first try of
this rule, reverted in 3b7f714)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from lifeline.api import FailureKind, RecoveryAction, load_trainingjob
from lifeline.api.recovery import RecoveryPlan
from lifeline.catalog import ProgressReport
from lifeline.control import CatalogFacts, ClusterState, NodeState, Observed, Progress, Record, SidecarState, decide

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"
T = 1_000_000.0  # when the current plan was acted on
NODES = ("n0", "n1", "n2", "n3")
LONG_AGO = T - 100  # when the first incarnations started


def _spec():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["recovery"].update(hangTimeoutSeconds=8, startupGraceSeconds=60)
    return load_trainingjob(body).spec


def _observed(times: dict[int, float], beats: dict[int, float], started: dict[int, float] | None = None,
              generation: int = 1) -> Observed:
    """Ranks' latest reports at ``times`` (a ``plan`` report from ``T`` on), their beats, their trainers'
    starts (default: all long ago)."""
    reports = [ProgressReport("plan" if at >= T else "step", "j", r, generation if at >= T else generation - 1, at, 5)
               for r, at in times.items()]
    return Observed(node_of_rank=NODES, cluster=ClusterState(tuple(NodeState(n, capacity=1) for n in NODES)),
                    sidecars=tuple(SidecarState(r, NODES[r], LONG_AGO, T) for r in range(4)),
                    ready=frozenset(range(4)), restarts_trainers=True,
                    trainer_started=dict.fromkeys(range(4), LONG_AGO) if started is None else started,
                    catalog=CatalogFacts(generation=generation, progress=Progress.of(reports, generation, beats),
                                         registered={r: NODES[r] for r in range(4)}))


def _restarting(*ranks: int) -> Record:
    """Recovering generation 1 since ``T``, its plan restarting the trainers of ``ranks`` in their pods."""
    plan = dataclasses.replace(RecoveryPlan.restore_all(1, 3, _spec().layout), create_pods=(), restart_ranks=ranks,
                               action=RecoveryAction.RESTART_IN_PLACE)
    return Record(phase="Recovering", generation=1, acted_at=T, plan=plan)


def _failed(d) -> list[tuple[FailureKind, tuple[int, ...]]]:
    return [(f.kind, f.ranks) for f in d.failures]


def test_a_survivor_frozen_as_the_plan_came_is_found_after_the_hang_timeout_not_the_grace():
    """Chaos test ``hang:rank=0:step=5:when=recovery``: rank 0, a survivor, froze as the plan came and
    never read it; ranks 2 and 3 beat while they wait for rank 1, which the plan restarted and which is
    still starting. Rank 0 is frozen once ``hangTimeoutSeconds`` passed since the plan."""
    spec, record = _spec(), _restarting(1)
    started = {0: LONG_AGO, 1: T + 0.1, 2: LONG_AGO, 3: LONG_AGO}

    def observed(now: float) -> Observed:
        return _observed({0: T - 0.5, 1: T - 3, 2: T + 0.4, 3: T + 0.3}, {2: now - 0.5, 3: now - 0.7}, started)

    assert not decide(spec, record, observed(T + 7.9), now=T + 7.9).failures  # within the hang timeout
    d = decide(spec, record, observed(T + 9.2), now=T + 9.2)
    assert _failed(d) == [(FailureKind.HANG, (0,))], d.failures  # its sidecar heartbeats: restarted in its pod
    assert "silent 9s during the recovery" in d.failures[0].detail


def test_a_restarted_trainer_that_beat_then_froze_is_found_after_the_hang_timeout():
    spec, record = _spec(), _restarting(1)
    started = {0: LONG_AGO, 1: T + 0.1, 2: LONG_AGO, 3: LONG_AGO}
    beats = {1: T + 20, 0: T + 29.4, 2: T + 29.5, 3: T + 29.6}  # rank 1 beat from T + 5 to T + 20, then froze
    times = {0: T + 1, 1: T - 3, 2: T + 1, 3: T + 1}
    assert not decide(spec, record, _observed(times, beats, started), now=T + 27.9).failures  # 7.9 s < 8 s
    d = decide(spec, record, _observed(times, beats, started), now=T + 29.8)
    assert _failed(d) == [(FailureKind.HANG, (1,))], d.failures


def test_ranks_started_by_an_earlier_plan_or_as_stragglers_are_starting_until_they_speak():
    """Fuzz seed 606: plan 1 (at T - 1.1) created rank 2's pod; plan 2 (at T) restarted rank 0; the runner
    then restarted ranks 2 and 3 as stragglers (T + 1.5). None of the new incarnations of 2 and 3 has
    spoken at T + 9.2 (their last words, at T - 3 and T - 0.4, are their old incarnations'): starting,
    not frozen, until the start-up grace; ranks 0 and 1 beat meanwhile."""
    spec, record = _spec(), _restarting(0)
    started = {0: T + 0.2, 1: LONG_AGO, 2: T + 1.5, 3: T + 1.5}
    times = {0: T - 5, 1: T + 0.5, 2: T - 3, 3: T - 1.1}

    def observed(now: float) -> Observed:
        return _observed(times, {0: now - 0.3, 1: now - 0.6, 3: T - 0.4}, started)

    for now in (T + 9.2, T + 30, T + 60.5):
        assert not decide(spec, record, observed(now), now=now).failures, now
    assert not decide(spec, record, observed(T + 61), now=T + 61).failures  # the grace counts from T + 1.5
    late = decide(spec, record, observed(T + 61.6), now=T + 61.6)  # past the grace, still nothing: frozen
    assert _failed(late) == [(FailureKind.HANG, (2,)), (FailureKind.HANG, (3,))], late.failures
    assert "since the recovery began" in late.failures[0].detail or "during the recovery" in late.failures[0].detail


def test_a_survivor_silent_since_before_the_plan_gets_the_timeout_from_the_plan():
    """A node loss: the survivors sat in a collective with the lost rank (no report since their last
    step, 12 s before the plan); ranks 2 and 3 broke out and beat, rank 0 not yet. Rank 0 is not frozen
    until ``hangTimeoutSeconds`` after the plan."""
    spec, record = _spec(), _restarting()
    times = {0: T - 12, 1: T - 12.5, 2: T - 12, 3: T - 12}
    assert not decide(spec, record, _observed(times, {2: T + 0.5, 3: T + 0.4}), now=T + 1).failures
    late = decide(spec, record, _observed(times, {2: T + 8.9, 3: T + 8.8}), now=T + 9)
    assert _failed(late) == [(FailureKind.HANG, (0,)), (FailureKind.HANG, (1,))], late.failures


def test_ranks_that_beat_while_they_wait_are_neither_frozen_nor_stalled():
    """Every rank's last report is the plan's, long ago; all still beat (a slow restore): no rank is
    frozen, and the step stall counts from the newest beat, not from the last report."""
    spec, record = _spec(), _restarting(1)
    now = T + 50
    d = decide(spec, record, _observed({r: T + 1 for r in range(4)}, {r: now - 0.5 for r in range(4)}), now=now)
    assert not d.failures, d.failures


def test_without_a_beat_or_a_known_start_the_engine_keeps_the_grace():
    """No rank beats (all frozen, or an older trainer image): no rank is singled out. A runner that
    does not say when a trainer started gets the old rule: the grace, never less."""
    spec, record = _spec(), _restarting(1)
    times = {0: T - 0.5, 1: T - 3, 2: T + 0.4, 3: T + 0.3}
    assert not decide(spec, record, _observed(times, {}), now=T + 9).failures
    unknown = _observed(times, {2: T + 8.5, 3: T + 8.4}, started={})
    assert not decide(spec, record, unknown, now=T + 9.2).failures


def test_alive_at_takes_the_newer_of_report_and_beat():
    p = Progress.of([ProgressReport("plan", "j", 0, 1, T, 3)], 1, {0: T + 2, 1: T - 1})
    assert p.alive_at(0) == T + 2 and p.alive_at(1) == T - 1 and p.alive_at(2) is None
    assert p.last_beat == T + 2 and p.silent_since(T, 3) == frozenset({1, 2})


def test_a_trainer_restarted_after_its_old_incarnation_spoke_since_the_plan_is_starting_not_unseen():
    """Fuzz ``--model pipelining-moe`` seed 23: rank 1's old process reported ``plan`` at T + 0.1, then the
    runner restarted it (T + 0.2) and the new process froze before it said anything, while ranks 0 and 2
    beat at the rendezvous. The old word after the plan hid the new incarnation's silence: neither rule
    saw rank 1, and the beats kept the step stall off, for 180 s. It is starting: frozen after the grace."""
    spec, record = _spec(), _restarting(0, 1, 2)
    started = {0: T + 0.2, 1: T + 0.2, 2: T + 0.2, 3: LONG_AGO}
    times = {0: T - 8, 1: T + 0.1, 2: T - 8, 3: T + 0.3}

    def observed(now: float) -> Observed:
        return _observed(times, {0: now - 0.4, 1: T + 0.1, 2: now - 0.6, 3: now - 0.5}, started)

    assert not decide(spec, record, observed(T + 30), now=T + 30).failures  # within the grace
    late = decide(spec, record, observed(T + 60.5), now=T + 60.5)  # 60.3 s since it started
    assert _failed(late) == [(FailureKind.HANG, (1,))], late.failures
