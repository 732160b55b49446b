"""One trial of ``lifeline bench chaos``: a ``lifeline run`` supervisor with a fault schedule, watched.

:func:`run_trial` runs :class:`~lifeline.launch.supervisor.Supervisor` in this process (what
``lifeline run`` runs) and, after every supervision round, samples the job's step and gathers the
catalog's corruption reports (a Redis restart would lose them); after the last round, while every
sidecar still runs, it audits every tier (:mod:`._chaos_audit`). :func:`verdict` turns the result into
the checks of issue 15, :func:`time_lost` into seconds lost per fault.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from lifeline.bench._chaos_audit import (
    audit_tiers,
    corruption_outcomes,
    report_key,
    reports_in_logs,
    restores_in_logs,
)
from lifeline.bench._chaos_schedule import TrialSpec, fault_name

__all__ = ["run_trial", "verdict", "time_lost"]

REPORT_POLL_SECONDS = 0.5


def run_trial(doc: dict, trial: TrialSpec, state_dir: Path, *, persist_uri: str | None, timeout: float,
              extra_env: dict[str, str] | None = None, spares_per_node: int = 0,
              templates: bool = False) -> dict[str, Any]:
    """Run ``doc`` (a TrainingJob document) with ``trial``'s injections; returns the summary of
    ``lifeline run`` plus ``audit``, ``corruption_reports``, ``step_samples`` and ``error`` (an
    exception that ended the run, ``None`` if none). ``templates``: fork the rank processes from
    template processes (``LaunchOptions.templates``); off by default here: see docs/fuzz.md, "Open
    finding: seed 606 with forked processes"."""
    from lifeline.launch.services import prepare_binaries
    from lifeline.launch.spec import load_for_launch
    from lifeline.launch.summary import summarize
    from lifeline.launch.supervisor import LaunchOptions, Supervisor

    job = load_for_launch(doc)
    prepare_binaries(job, persist_uri=persist_uri)
    world = job.spec.layout.world_size
    options = LaunchOptions(state_dir=state_dir, injections=trial.injections, persist_uri=persist_uri,
                            spare_nodes=world + trial.lost_nodes + 1, slot_bytes=8 << 20, timeout_seconds=timeout,
                            extra_env=dict(extra_env or {}), spares_per_node=spares_per_node,
                            templates=templates)
    box: dict[str, Any] = {"reports": {}, "samples": [], "audit": None, "last_poll": 0.0}
    holder: list[Supervisor] = []

    def on_update(snap) -> None:
        sup = holder[0]
        now = time.time()
        if not box["samples"] or box["samples"][-1][1] != snap.step:
            box["samples"].append((now, snap.step))
        if sup.catalog is not None and now - box["last_poll"] >= REPORT_POLL_SECONDS:
            box["last_poll"] = now
            _gather_reports(sup, box["reports"])
        if snap.phase == "Succeeded" and sup.digest is not None and box["audit"] is None:
            _gather_reports(sup, box["reports"])
            flipped = {report_key(c["step"], c["rank"], c["tier"]) for f in sup.faults.fired for c in f.copies}
            try:
                box["audit"] = audit_tiers(sup, flipped)
            except Exception as err:  # noqa: BLE001 - an audit that cannot run fails the trial, named
                box["audit"] = {"error": f"{type(err).__name__}: {err}"[:500]}

    sup = Supervisor(job, options, on_update=on_update)
    holder.append(sup)
    t0 = time.monotonic()
    error = None
    try:
        phase = sup.run()
    except Exception as err:  # noqa: BLE001 - a trial that crashes is a failed trial, with its reason
        phase, error = "Failed", f"{type(err).__name__}: {err}"[:1000]
    summary = summarize(sup, phase=phase, wall_seconds=time.monotonic() - t0, digest=sup.digest)
    logged = reports_in_logs(state_dir / "logs")
    reports = list(box["reports"].values()) + logged
    summary.update(audit=box["audit"], corruption_reports=reports, step_samples=box["samples"], error=error,
                   restores=restores_in_logs(state_dir / "logs"))
    return summary


def _gather_reports(sup: Any, into: dict[str, dict]) -> None:
    from lifeline.errors import CatalogError

    try:
        for r in sup.catalog.corrupt_reports():
            doc = {"step": r.step, "rank": r.rank, "tier": r.tier, "by": r.by, "where": r.where, "at": r.time}
            into[json.dumps(doc, sort_keys=True)] = doc
    except CatalogError:
        pass


def verdict(summary: dict[str, Any], reference: dict[str, Any] | None) -> list[str]:
    """The checks of issue 15 that failed (empty: the trial passed): the job finished; its final state
    equals the failure-free run's (``reference``: its digest); the latest complete step never moved
    backwards; no torn copy was visible at any tier; no corrupted copy was restored without being
    reported (with verified reads a corrupt copy is found when read: one nothing read is counted, not
    failed); every flip corrupted a copy, unless it fired after the job had finished."""
    out = []
    if summary.get("error"):
        out.append(f"the run raised {summary['error']}")
    if summary.get("phase") != "Succeeded":
        out.append(f"the job ended {summary.get('phase')}")
    if reference is not None and summary.get("digest") != reference.get("digest"):
        out.append(f"final state differs from the failure-free run: {summary.get('digest')} != {reference.get('digest')}")
    regressions = (summary.get("complete_step") or {}).get("regressions") or []
    if regressions:
        out.append(f"the latest complete step moved backwards: {regressions[:3]}")
    audit = summary.get("audit")
    if audit and not audit.get("error") and audit["torn"]:
        out.append(f"torn copies visible: {audit['torn'][:3]}")
    elif summary.get("phase") == "Succeeded" and (not audit or audit.get("error")):
        out.append(f"the tiers could not be audited: {(audit or {}).get('error', 'no audit ran')}")
    copies = [c for f in summary.get("faults", []) for c in f["copies"]]
    at = {report_key(c["step"], c["rank"], c["tier"]): f["at"] for f in summary.get("faults", []) for c in f["copies"]}
    outcome = corruption_outcomes(copies, summary.get("corruption_reports", []),
                                  (audit or {}).get("flipped_visible", []), summary.get("restores", []), at)
    summary["corruption"] = outcome
    if outcome["used"]:
        out.append(f"corrupted copies restored without a report: {outcome['used'][:3]}")
    for f in summary.get("faults", []):
        if f["kind"] == "flip" and not f["copies"] and not f.get("ineffective") and not f.get("moot"):
            out.append(f"{f['fault']} corrupted no copy: {f['note']}")
    return out


def time_lost(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Seconds lost to each fault that fired, measured from the fault (not from its detection).

    Recoveries form chains: one that starts before the previous one caught up (a failure during a
    recovery, or a restore that failed) continues its chain. A fault that calls for a recovery loses the
    time from the fault to the moment its chain caught up (every rank past the step reached): the first
    recovery planned after the fault, through the end of its chain — two faults whose recoveries chain
    lose until the same moment. A fault that calls for none (Redis restart, MinIO outage) loses the delay
    it caused to the next step: from the fault to the first step past the one reached, minus one median
    step time (0 when shorter).

    Returns one ``{"fault", "name", "seconds", "recoveries"}`` per fault (``seconds`` ``None`` when the
    job never caught up).
    """
    faults = sorted(summary.get("faults", []), key=lambda f: f["at"])
    recs = sorted(summary.get("recoveries", []), key=lambda r: r["timeline"].get("round_at", 0.0))
    step_s = summary.get("step_seconds") or 0.0
    samples = summary.get("step_samples") or []
    chain_of, chains = {}, []
    for i, r in enumerate(recs):
        prev = recs[i - 1]["timeline"] if i else None
        if prev is None or (prev.get("caught_up_at") is not None and prev["caught_up_at"] <= r["timeline"]["round_at"]):
            chains.append([])
        chains[-1].append(i)
        chain_of[i] = len(chains) - 1
    out = []
    for f in faults:
        name = _name(f)
        if not f["recovers"]:
            after = next((t for t, s in samples if t >= f["at"] and s > f["step"]), None)
            out.append({"fault": f["fault"], "name": name, "recoveries": [],
                        "seconds": None if after is None else round(max(0.0, after - f["at"] - step_s), 3)})
            continue
        first = next((i for i, r in enumerate(recs) if r["timeline"].get("round_at", 0.0) >= f["at"]), None)
        if first is None:
            out.append({"fault": f["fault"], "name": name, "recoveries": [], "seconds": None})
            continue
        chain = [i for i in chains[chain_of[first]] if i >= first]
        end = recs[chain[-1]]["timeline"].get("caught_up_at")
        out.append({"fault": f["fault"], "name": name, "recoveries": [recs[i]["action"] for i in chain],
                    "seconds": None if end is None else round(end - f["at"], 3)})
    return out


def _name(f: dict[str, Any]) -> str:
    base = f"flip:{f['tier']}" if f["kind"] == "flip" else f["kind"]
    return base + ("+recovery" if f.get("when") == "recovery" else "")


def median(values: list[float]) -> float | None:
    """The median, ``None`` for no values."""
    return round(statistics.median(values), 3) if values else None


__all__ += ["median", "fault_name"]
