"""The checks of one ``lifeline bench fuzz`` trial beyond ``bench chaos``'s verdict.

* :func:`losses` / :func:`loss_problems`: every loss a trainer reported (``step`` and ``replay``
  events, every generation) equals the failure-free reference's loss of that step and rank, and
  every step the reference reported has a report in the faulted run.
* :func:`rung_problems`: each recovery took the cheapest rung the copies allowed — a global restore
  (RestartInPlace, ReplacePods, Rollback) never restores an older step than the latest step every
  shard had a copy of (:class:`._fuzz_copies.Copies`; a Rollback to the initial state while one
  existed is the worst case), a Rollback never happens while the memory tiers held that step or a
  newer one, and a ReplacePods only when a fault lost a pod.
* :func:`extra_recoveries`: every recovery answers a fault not answered before (no second recovery,
  e.g. a ReplacePods after a LocalizedReplay, without a second fault; a flipped copy found corrupt when
  read counts as the second failure of its ``flip``: :func:`replans_after_corruption` counts those).
* :func:`time_problems`: the time lost to each fault (:func:`._chaos_trial.time_lost`) is within
  :func:`time_bound` of its kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lifeline.bench._chaos_trial import time_lost
from lifeline.bench._fuzz_copies import Copies
from lifeline.bench.chaos import STARTUP_GRACE_SECONDS

__all__ = ["TIME_BOUNDS", "PER_RANK_SECONDS", "losses", "loss_problems", "rung_problems", "extra_recoveries",
           "time_bound", "time_problems", "GLOBAL_RUNGS", "replans_after_corruption"]

TIME_BOUNDS = {"trainer": 75.0, "hang": 85.0, "sidecar": 90.0, "node": 90.0, "flip:L0": 75.0,
               "flip:L1": 90.0, "flip:L2": 105.0, "redis": 45.0, "minio": 45.0,
               "preempt": 100.0, "nan": 75.0, "slow": 45.0}
"""Seconds a fault of each kind may cost (fault → every rank past the step reached) with 2 ranks on
two shared cores under load: process starts dominate (a fresh trainer imports torch and builds the
model, a replacement pod starts a sidecar too); the hang timeout (8 s) counts for ``hang``, the
grace (10 s at most) for ``preempt``; a ``slow`` rank calls for no recovery (its delay to the next step). Below the
trials' 120 s start-up grace, so a recovery that waits it out is caught."""
PER_RANK_SECONDS = 5.0
"""Added per rank beyond two (more processes rejoin and restore on the same two cores)."""
DURING_RECOVERY_SECONDS = 30.0
"""Added for a fault armed ``when=recovery`` (its recovery begins again)."""
GLOBAL_RUNGS = ("RestartInPlace", "ReplacePods", "Rollback")
LOSSES_OF_MEMORY = ("sidecar", "node", "preempt")


def losses(logs: Path) -> dict[tuple[int, int], list[float]]:
    """``(step, rank) -> [loss, ...]`` of every ``step`` and ``replay`` event with a loss in the
    trainers' logs (all incarnations)."""
    from lifeline.runtime.events import read_events

    out: dict[tuple[int, int], list[float]] = {}
    for ev in read_events(sorted(Path(logs).glob("*-trainer.log"))):
        if ev.get("event") in ("step", "replay") and ev.get("loss") is not None and ev.get("step") is not None:
            out.setdefault((int(ev["step"]), int(ev["rank"])), []).append(float(ev["loss"]))
    return out


def loss_problems(got: dict[tuple[int, int], list[float]], ref: dict[tuple[int, int], list[float]]) -> list[str]:
    """Loss mismatches and steps without a loss report (see the module docstring); at most a few named."""
    wrong, missing = [], []
    for (step, rank), values in sorted(got.items()):
        want = ref.get((step, rank))
        if want is None:
            wrong.append(f"step {step} rank {rank}: {values[0]!r} (the reference reported none)")
            continue
        bad = [v for v in values if v != want[0]]
        if bad:
            wrong.append(f"step {step} rank {rank}: {bad[0]!r} != {want[0]!r}"
                         + (f" ({len(bad)} of {len(values)} reports)" if len(values) > 1 else ""))
    for key in sorted(ref):
        if key not in got:
            missing.append(f"step {key[0]} rank {key[1]}")
    out = []
    if wrong:
        out.append(f"loss mismatch at {len(wrong)} (step, rank): " + "; ".join(wrong[:4]))
    if missing:
        out.append(f"no loss reported for {len(missing)} (step, rank) the reference reported: "
                   + ", ".join(missing[:6]))
    return out


def _recs(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(summary.get("recoveries", []), key=lambda r: r["timeline"].get("round_at", 0.0))


def _effective(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((f for f in summary.get("faults", []) if f.get("recovers") and not f.get("ineffective")),
                  key=lambda f: f["at"])


def _detected_at(summary: dict[str, Any], f: dict[str, Any]) -> float | None:
    """When a sidecar first reported, after ``f`` fired, one of the copies fault ``f`` (a flip)
    corrupted (the fault's time when only the logs, which carry no time, report it); ``None`` if none
    did. A report from before ``f`` fired is an earlier flip's of the same copy (a step persisted again
    after a rollback and flipped again: fuzz seed 12836737), not this one's."""
    flipped = {(int(c["step"]), int(c["rank"]), str(c["tier"])) for c in f.get("copies") or []}
    times = [r.get("at") for r in summary.get("corruption_reports") or []
             if r.get("step") is not None and (int(r["step"]), int(r["rank"]), str(r["tier"])) in flipped]
    timed = [t for t in times if t is not None and t >= float(f["at"]) - 1e-3]
    if timed:
        return min(timed)
    return float(f["at"]) if None in times else None


def _answers(summary: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]], bool]]:
    """Each recovery with the faults it answers and whether it answers only a detected corruption.

    A recovery answers the faults not answered before that fired before it was planned: those of its
    failed ranks, else the earliest (a hang is seen after faults that came after it). A ``flip`` is
    two failures by construction — the kill that makes Lifeline read the corrupted copy, then the
    corruption found when it is read (the restore of that step cannot succeed: a second plan, to
    another step, is the only way on) — so once a sidecar reported the corruption, a flip answers one
    more recovery."""
    tokens: list[tuple[dict[str, Any], bool, float]] = []
    for f in _effective(summary):
        tokens.append((f, False, float(f["at"])))
        found = _detected_at(summary, f) if f["kind"] == "flip" and f.get("copies") else None
        if found is not None:
            tokens.append((f, True, found))
    out = []
    for rec in _recs(summary):
        tl = rec["timeline"]
        limit = tl.get("planned_at", tl.get("round_at", 0.0)) + 1e-3
        cands, seen = [], set()
        for tok in tokens:
            f, _, at = tok
            if id(f) not in seen and (at <= limit or abs(at - tl.get("failed_at", -1.0)) < 1e-3):
                cands.append(tok)
                seen.add(id(f))
        mine = [t for t in cands if t[0]["rank"] in rec.get("ranks", [])] or cands[:1]
        for t in mine:
            tokens.remove(t)
        out.append((rec, [t[0] for t in mine], bool(mine) and all(t[1] for t in mine)))
    return out


def extra_recoveries(summary: dict[str, Any]) -> list[str]:
    """One line per recovery that answered no fault not answered before (see the module docstring)."""
    out = []
    recs = _recs(summary)
    for i, (rec, faults, _) in enumerate(_answers(summary)):
        if not faults:
            prev = recs[i - 1]["action"] if i else None
            out.append(f"recovery {i + 1} ({rec['action']}, generation {rec['generation']}, failures "
                       f"{rec.get('failures', [])[:2]}) answered no new fault"
                       + (f" (after a {prev})" if prev else ""))
    return out


def replans_after_corruption(summary: dict[str, Any]) -> int:
    """Recoveries that answer only a corruption found while restoring (see :func:`_answers`)."""
    return sum(1 for _, _, only in _answers(summary) if only)


def rung_problems(summary: dict[str, Any], logs: Path, *, world: int, keep: int) -> list[str]:
    """Recoveries that did not take the cheapest rung the copies allowed (see the module docstring)."""
    copies = Copies(logs, summary.get("faults", []), world=world, keep=keep)
    out, restores = [], []
    for i, (rec, faults, _) in enumerate(_answers(summary)):
        at = rec["timeline"].get("round_at", 0.0)
        action, step, tier = rec["action"], rec.get("restore_step"), rec.get("tier")
        label = f"recovery {i + 1} ({action} to {'the initial state' if step is None else f'step {step}'}" \
                f"{f' from {tier}' if tier else ''}, generation {rec['generation']})"
        if action in GLOBAL_RUNGS:
            upto = rec.get("from_step")
            best = copies.covered(at, ("L0", "L1", "L2"), restores, upto=upto)
            if best is not None and (step or 0) < best:
                worst = "a Rollback to the initial state" if step is None else "an older step"
                out.append(f"rung: {label} is {worst} although every shard of step {best} had a copy "
                           f"{copies_note(copies, at, restores, best)}")
            mem = copies.covered(at, ("L0", "L1"), restores, upto=upto)
            if action == "Rollback" and mem is not None and mem >= (step or 0):
                out.append(f"rung: {label} although the memory tiers held every shard of step {mem} "
                           "(RestartInPlace or ReplacePods was allowed)")
        if action == "ReplacePods" and faults and all(
                f["kind"] not in LOSSES_OF_MEMORY and not (f["kind"] == "flip" and f.get("tier") in ("L1", "L2"))
                for f in faults):
            out.append(f"rung: {label} although no pod was lost (it answers {[f['fault'] for f in faults]})")
        restores.append((at, step or 0))
    return out


def copies_note(copies: Copies, at: float, restores: list[tuple[float, int]], step: int) -> str:
    """Where each rank's copy of ``step`` was (nearest tier), for a finding's message."""
    tiers = []
    for r in range(copies.world):
        tier = next((t for t in ("L0", "L1", "L2") if step in copies.held(r, at, (t,), restores)), "?")
        tiers.append(tier)
    return f"(per rank: {','.join(tiers)})"


def time_bound(name: str, world: int, fault: str = "") -> float:
    """Seconds a fault named ``name`` (``kind``, ``flip:LX``, ``+recovery`` suffix) may cost in a
    job of ``world`` ranks (``fault``: its text, for a MinIO outage's length)."""
    base, plus = name.partition("+")[0], name.endswith("+recovery")
    bound = TIME_BOUNDS.get(base, 120.0) + PER_RANK_SECONDS * max(0, world - 2)
    if plus:
        bound += DURING_RECOVERY_SECONDS
    if base == "hang" and plus:  # a trainer frozen before it reported in the recovery's generation is told
        # from one still starting only after startupGraceSeconds (docs/fuzz.md "A hang during a recovery")
        bound = max(bound, STARTUP_GRACE_SECONDS + DURING_RECOVERY_SECONDS + PER_RANK_SECONDS * max(0, world - 2))
    if base == "minio" and "seconds=" in fault:
        bound += float(fault.split("seconds=")[1].split(":")[0])
    return bound


def time_problems(summary: dict[str, Any], world: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``(rows, problems)``: time lost per fault (:func:`._chaos_trial.time_lost`, each row with its
    ``bound``) and one line per fault over its bound. A fault whose recoveries chain with those of
    later faults (a fault during its recovery) loses until the chain ends: its bound adds theirs."""
    rows, out = [], []
    lost = time_lost(summary)
    for row in lost:
        bound = time_bound(row["name"], world, row["fault"])
        at = next((f["at"] for f in summary.get("faults", []) if f["fault"] == row["fault"]), None)
        if at is not None and row["seconds"] is not None and row["recoveries"]:
            bound += sum(time_bound(o["name"], world, o["fault"]) for o in lost if o is not row
                         and any(f["fault"] == o["fault"] and at < f["at"] <= at + row["seconds"]
                                 for f in summary.get("faults", [])))
        row = dict(row, bound=round(bound, 1))
        rows.append(row)
        if row["seconds"] is not None and row["seconds"] > row["bound"]:
            out.append(f"time lost to {row['fault']}: {row['seconds']:.1f} s > bound {row['bound']:.0f} s "
                       f"(recoveries {row['recoveries']})")
    return rows, out
