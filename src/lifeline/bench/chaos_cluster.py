"""``lifeline bench chaos --bed devcluster``: the chaos trials on the cluster test bed.

A dev cluster (:mod:`lifeline.devcluster`: a real kube-apiserver, scheduler and controllers, process
nodes, Redis, MinIO) runs the chart; each trial applies a TrainingJob (the local trials' spec, its own
name) and injects a seeded schedule of :data:`._chaos_schedule.CLUSTER_FAULTS` — the local faults plus
killing the operator — through :class:`._chaos_bed.ClusterBed`, firing each when the catalog shows its
step. While the job runs, every 0.25 s the harness samples the catalog (the latest complete step, each
rank's progress, corruption reports) and the job's status. When the job has finished, the same checks
as the local bed apply (:func:`._chaos_trial.verdict`): Succeeded; the final checkpoint in MinIO
consolidates bit-identical to the failure-free run of the same spec on this bed; the latest complete
step never moved backwards; no torn copy in L0/L1 (the sidecars still run) or L2; every flipped copy
detected. Time lost per fault runs from the fault to every rank past the step reached in a newer
generation (recoveries) or to the next step (service faults).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from lifeline.bench._chaos_bed import L2_URI, ClusterBed
from lifeline.bench._chaos_schedule import CLUSTER_FAULTS, TrialSpec, schedule
from lifeline.bench._chaos_trial import median, verdict
from lifeline.bench.chaos import job_doc

__all__ = ["run"]

POLL_SECONDS = 0.25
MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_expert": 64, "seq_len": 64, "micro_batch": 2,
         "micro_batches": 2, "corpus_bytes": 65536}
"""Larger than the local trials' (0.1–0.2 s a step here): on the cluster a fault is fired by a harness
reading the catalog every 0.25 s and answered by an operator that resyncs every 2 s; the local trials'
12 steps of 0.04 s ended before most faults landed."""


def _digest(bed: ClusterBed, name: str, step: int) -> dict[str, Any] | None:
    from lifeline.checkpoint import consolidate
    from lifeline.launch.summary import await_l2_step, state_digest

    storage, prefix = bed.storage()
    if not await_l2_step(storage, prefix, name, step, 120.0):
        return None
    return {"sha256": state_digest(consolidate(storage, prefix, name, step)), "source": "L2", "step": step}


class _Sup:
    """What :func:`._chaos_audit.audit_tiers` reads of a supervisor, for a job on the cluster."""

    class _Pod:
        def __init__(self, arena: Path | None) -> None:
            self.spec = type("Spec", (), {"arena_dir": arena or Path("/nonexistent")})()

    def __init__(self, bed: ClusterBed, name: str, catalog: Any) -> None:
        from lifeline.launch.env import Secrets

        self.name, self.catalog = name, catalog
        self.secrets = Secrets(bed.secret(name))
        self.pods = {r: self._Pod(bed.arena_dir(p)) for r, p in bed.pods(name).items()}
        self.services = type("Services", (), {"storage": staticmethod(bed.storage)})()


def run_trial(bed: ClusterBed, spec: TrialSpec, name: str, *, steps: int, persist_every: int,
              timeout: float = 1200.0) -> dict[str, Any]:
    """Run one trial on the bed; returns a summary shaped like ``lifeline run``'s (what
    :func:`._chaos_trial.verdict` reads) plus ``status`` (the job's final status)."""
    from lifeline.bench._chaos_audit import audit_tiers, report_key
    from lifeline.catalog import Catalog
    from lifeline.errors import CatalogError

    doc = job_doc(name, steps=steps, persist_every=persist_every, uri=L2_URI, model=MODEL)
    world = doc["spec"]["replicas"]
    bed.apply(doc)
    catalog = Catalog(bed.dc.redis_url, name, world, username="", password="")
    pending = sorted(spec.injections, key=lambda i: i.step)
    fired, samples, reports, highest, regressions, progress = [], [], {}, None, [], []
    phase, status, t0, error = "Pending", {}, time.monotonic(), None
    try:
        while time.monotonic() - t0 < timeout:
            now = time.time()
            try:
                status = bed.status(name)
                view = catalog.view(recent_steps=8, persist_every=persist_every)
                for r in catalog.corrupt_reports():
                    reports[(r.step, r.rank, r.tier, r.by, r.time)] = {"step": r.step, "rank": r.rank, "tier": r.tier,
                                                                        "by": r.by, "at": r.time}
            except (CatalogError, Exception):  # noqa: BLE001 - a Redis restart or an API blip: look again
                time.sleep(POLL_SECONDS)
                continue
            phase = status.get("phase", "Pending")
            step = max((r.step or 0 for r in view.reports.values()), default=0)
            if not samples or samples[-1][1] != step:
                samples.append((now, step))
            progress.append((now, {r: (p.generation, p.step or 0, p.event) for r, p in view.reports.items()}))
            if view.complete_step is not None:
                if highest is not None and view.complete_step < highest:
                    regressions.append({"at": round(now, 3), "from": highest, "to": view.complete_step})
                highest = max(highest or 0, view.complete_step)
            if phase in ("Succeeded", "Failed"):
                break
            for inj in [i for i in pending if step >= i.step and (i.when is None or phase == "Recovering")]:
                pending.remove(inj)
                fired.append(bed.fire(inj, name, catalog, step))
            time.sleep(POLL_SECONDS)
        else:
            error = f"the job did not finish within {timeout:.0f} s (phase {phase})"
        digest = _digest(bed, name, steps) if phase == "Succeeded" else None
        flipped = {report_key(c["step"], c["rank"], c["tier"]) for f in fired for c in f.copies}
        try:
            audit = audit_tiers(_Sup(bed, name, catalog), flipped) if phase == "Succeeded" else None
        except Exception as err:  # noqa: BLE001 - reported as a failed audit
            audit = {"error": f"{type(err).__name__}: {err}"[:500]}
    finally:
        catalog.close()
    from lifeline.bench._chaos_audit import reports_in_logs, restores_in_logs

    logs = sorted(bed.dc.state_dir.glob("nodes/*/pods/*/logs/sidecar/*.log"))  # lost nodes' pods included
    logged = reports_in_logs(logs, job=name)
    faults = [f.to_dict() for f in fired]
    return {"phase": phase, "error": error, "digest": digest, "status": status, "faults": faults,
            "not_fired": [str(i) for i in pending], "audit": audit,
            "complete_step": {"regressions": regressions, "highest": highest, "samples": len(progress)},
            "corruption_reports": list(reports.values()) + logged, "step_samples": samples,
            "restores": restores_in_logs(logs, job=name),
            "recoveries": [r.get("kind") for r in status.get("recoveries") or []],
            "time_lost": _lost(faults, progress), "wall_seconds": round(time.monotonic() - t0, 1)}


def _lost(faults: list[dict[str, Any]], progress: list[tuple[float, dict]]) -> list[dict[str, Any]]:
    """Seconds from each fault to every rank past the step reached in a newer generation (a fault that
    calls for a recovery) or to the first step past it (one that does not); ``None``: never."""
    out = []
    for f in faults:
        base = next((ranks for t, ranks in progress if t >= f["at"]), {})
        gen = max((g for g, _, _ in base.values()), default=0)
        done = None
        for t, ranks in progress:
            if t < f["at"] or not ranks:
                continue
            if f["recovers"] and all(g > gen and s > f["step"] for g, s, _ in ranks.values()):
                done = t
                break
            if not f["recovers"] and max(s for _, s, _ in ranks.values()) > f["step"]:
                done = t
                break
        name = (f"flip:{f['tier']}" if f["kind"] == "flip" else f["kind"]) + ("+recovery" if f["when"] else "")
        out.append({"fault": f["fault"], "name": name, "seconds": None if done is None else round(done - f["at"], 3)})
    return out


def run(*, trials: int = 10, seed: int = 0, steps: int = 48, persist_every: int = 8, workdir: str | None = None,
        keep: bool = False, nodes: int = 6, max_faults: int = 2) -> dict[str, Any]:
    """Start a dev cluster, install the chart, run the failure-free reference and ``trials`` trials
    (trial ``i``: seed ``seed + i``); returns the JSON object (counts as the local bed's, per bed)."""
    from lifeline.devcluster import DevCluster

    root = Path(workdir or tempfile.mkdtemp(prefix="lifeline-bench-chaos-cluster-"))
    t0 = time.monotonic()
    dc = DevCluster.up(root / "devcluster", nodes=nodes, ports="auto")
    out: dict[str, Any] = {"bench": "chaos", "bed": "devcluster", "nodes": nodes, "steps": steps,
                           "persist_every": persist_every, "seed": seed, "trials": trials}
    try:
        bed = ClusterBed(dc)
        bed.install()
        out["setup_seconds"] = round(time.monotonic() - t0, 1)
        ref = run_trial(bed, TrialSpec(-1, ()), "chaos-reference", steps=steps, persist_every=persist_every)
        bed.delete("chaos-reference")
        if ref["phase"] != "Succeeded" or not ref["digest"]:
            out["reference"] = {k: ref[k] for k in ("phase", "error", "status")}
            return out
        out["reference"] = {"digest": ref["digest"], "wall_seconds": ref["wall_seconds"]}
        never: dict[str, int] = {}
        fired, rungs, lost, failed, walls, checks = {}, {}, {}, [], [], {"torn": 0, "complete_step_regressions": 0,
                                                                          "flipped_copies": 0, "detected": 0,
                                                                          "gone_unread": 0}
        for i in range(trials):
            spec = schedule(seed + i, world_size=2, steps=steps, persist_every=persist_every, max_faults=max_faults,
                            faults=CLUSTER_FAULTS)
            name = f"chaos-{seed + i}"
            s = run_trial(bed, spec, name, steps=steps, persist_every=persist_every)
            reasons = verdict(s, ref)
            for x in s["not_fired"]:  # e.g. armed for a recovery that never came: counted, not failed
                never[x.split(":")[0]] = never.get(x.split(":")[0], 0) + 1
            walls.append(s["wall_seconds"])
            for f in s["faults"]:
                key = f"flip:{f['tier']}" if f["kind"] == "flip" else f["kind"]
                fired[key] = fired.get(key, 0) + 1
                if f["when"]:
                    fired["during_recovery"] = fired.get("during_recovery", 0) + 1
            for kind in s["recoveries"]:
                rungs[kind] = rungs.get(kind, 0) + 1
            for row in s["time_lost"]:
                if row["seconds"] is not None:
                    lost.setdefault(row["name"], []).append(row["seconds"])
            checks["torn"] += len((s["audit"] or {}).get("torn", []))
            checks["complete_step_regressions"] += len(s["complete_step"]["regressions"])
            for k in ("detected", "gone_unread", "visible_unread"):
                checks[k] = checks.get(k, 0) + s["corruption"][k]
            checks["used"] = checks.get("used", 0) + len(s["corruption"]["used"])
            checks["stale_holdings"] = checks.get("stale_holdings", 0) + len((s["audit"] or {}).get("stale", []))
            checks["flipped_copies"] += s["corruption"]["copies"]
            if reasons:
                failed.append({"seed": seed + i, "faults": spec.describe(), "reasons": reasons,
                               "recoveries": s["recoveries"], "replay": f"lifeline bench chaos --bed devcluster "
                                                                       f"--seed {seed + i} --trials 1"})
            if not keep:
                bed.delete(name)
            bed.heal()
        out.update({"passed": trials - len(failed), "failed": failed, "faults_fired": dict(sorted(fired.items())),
                    "faults_not_fired": never,
                    "recoveries_per_rung": dict(sorted(rungs.items())),
                    "time_lost_seconds": {k: {"n": len(v), "median": median(v), "max": round(max(v), 3)}
                                          for k, v in sorted(lost.items())},
                    "checks": checks, "trial_wall_seconds": {"median": median(walls)}})
    finally:
        dc.down(log=lambda _l: None)
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["workdir"] = str(root)
    return out
