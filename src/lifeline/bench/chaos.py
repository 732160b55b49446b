"""``lifeline bench chaos``: jobs under seeded random faults; does Lifeline keep going and lose nothing?

Each of ``trials`` trials runs the same small TrainingJob under ``lifeline run`` (in this process:
:mod:`._chaos_trial`) with a fault schedule drawn from its seed (:mod:`._chaos_schedule`): trainer
SIGKILL, sidecar SIGKILL, node loss, hang (SIGSTOP), Redis restart (empty), MinIO outage of 2–5 s, a
flipped byte in an L0, L1 or L2 copy, and faults during a recovery. A failure-free run of the same
spec and layout (once per bench run) gives the reference digest. Each trial checks
(:func:`._chaos_trial.verdict`): the job finished; the final state is bit-identical to the reference;
the latest complete step never moved backwards (sampled every supervision round); no torn copy is
visible at any tier (:mod:`._chaos_audit`); every corrupted copy was detected and none is still
visible. The JSON object counts faults, recoveries per rung, time lost per fault (from the fault) and
lists every failed trial with its seed: ``lifeline bench chaos --seed SEED --trials 1`` replays it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from lifeline.bench._chaos_schedule import FAULTS, TrialSpec, schedule
from lifeline.bench._chaos_trial import median, run_trial, time_lost, verdict

__all__ = ["run", "job_doc", "MODEL", "TEST_ENV"]

MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_expert": 32, "seq_len": 32, "micro_batch": 2,
         "micro_batches": 2, "corpus_bytes": 65536}
"""The reference GPT-MoE, as small as the layout allows: a trial is mostly processes starting."""
TEST_ENV = {"LIFELINE_COLLECTIVE_TIMEOUT_SECONDS": "30", "LIFELINE_RENDEZVOUS_TIMEOUT_SECONDS": "180",
            "LIFELINE_RECOVERY_TIMEOUT_SECONDS": "240"}
"""Runtime settings of the trials: a hang is found by ``hangTimeoutSeconds`` (8 s), well before gloo's 30 s."""
HANG_TIMEOUT_SECONDS = 8
STARTUP_GRACE_SECONDS = 120
"""A process start (Python, torch, the model) took over 60 s under a load average of 15 on two shared
cores (a sidecar counted lost before it registered); heartbeats go every 2 s for the same reason."""


def job_doc(name: str, *, pipeline: int = 2, data: int = 1, steps: int = 12, persist_every: int = 4,
            uri: str = "file:///unused", model: dict | None = None) -> dict:
    """The trials' TrainingJob document: GPT-MoE :data:`MODEL` in ``pipeline x data``, every step in
    memory with one L1 replica and ``keep: 2``, L2 every ``persist_every`` steps, hangs after
    :data:`HANG_TIMEOUT_SECONDS`, a start-up grace of :data:`STARTUP_GRACE_SECONDS`, enough restarts for
    cascades (``model``: other GPT-MoE arguments than :data:`MODEL`)."""
    return {
        "apiVersion": "lifeline.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "replicas": pipeline * data, "layout": {"tensor": 1, "pipeline": pipeline, "data": data, "expert": 1},
            "steps": steps, "seed": 7, "model": {"name": "gpt-moe", "args": dict(model or MODEL)},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "lifeline:dev",
                                                  "command": ["python", "-m", "lifeline", "trainer"],
                                                  "env": [{"name": k, "value": v} for k, v in TEST_ENV.items()]}]}},
            "checkpoint": {"every": 1, "peerReplicas": 1, "keep": 2, "persist": {"every": persist_every, "uri": uri}},
            "recovery": {"maxRestarts": 30, "hangTimeoutSeconds": HANG_TIMEOUT_SECONDS, "heartbeatSeconds": 2.0,
                         "collectiveGraceSeconds": 6.0, "startupGraceSeconds": STARTUP_GRACE_SECONDS},
        },
    }


def _write(path: Path, doc: dict) -> None:
    """Write ``doc`` as JSON to ``path`` (a failed trial's record, beside its logs); never raises."""
    import json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, default=str))
    except OSError:
        pass


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def run(*, trials: int = 50, seed: int = 0, steps: int = 12, persist_every: int = 4, pipeline: int = 2,
        data: int = 1, max_faults: int = 2, faults: tuple[str, ...] = FAULTS, workdir: str | None = None,
        keep: bool = False, trial_timeout: float = 900.0, reference: bool = True,
        spares_per_node: int = 0) -> dict[str, Any]:
    """Run the failure-free reference and ``trials`` chaos trials; returns the JSON object.

    Args:
        trials: trials to run; trial ``i`` has seed ``seed + i`` (``--seed S --trials 1`` replays seed S).
        steps, persist_every, pipeline, data: the job (``steps`` a multiple of ``persist_every``, so
            the final state is digested from L2).
        max_faults: faults drawn per trial (1..max), plus possibly one during a recovery.
        faults: the fault names drawn (:data:`._chaos_schedule.FAULTS`).
        workdir: where runs keep their state (default: a new temp dir); passed trials' state dirs
            are removed unless ``keep``.
        trial_timeout: a trial still running after this many seconds fails.
        reference: run the failure-free reference (without it the digest check is skipped).
        spares_per_node: ``lifeline run``'s spares (default 0: every restart is a fresh process; a
            trial trains for about a second, too short for a pool warmed in the background to help,
            and warming it would double a trial's CPU time; ``bench recovery`` measures spares).

    Raises:
        LifelineError: the failure-free reference run did not succeed.
    """
    root = Path(workdir or tempfile.mkdtemp(prefix="lifeline-bench-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    load_before = _load()
    doc = job_doc("chaos", pipeline=pipeline, data=data, steps=steps, persist_every=persist_every)
    world = pipeline * data
    out: dict[str, Any] = {
        "bench": "chaos", "bed": "lifeline run", "layout": {"pipeline": pipeline, "data": data}, "model": MODEL,
        "steps": steps, "persist_every": persist_every, "hang_timeout_seconds": HANG_TIMEOUT_SECONDS,
        "seed": seed, "trials": trials, "max_faults": max_faults, "faults_drawn": list(faults),
        "spares_per_node": spares_per_node,
    }
    ref = None
    if reference:
        ref = run_trial(doc, TrialSpec(-1, ()), root / "reference", persist_uri=f"file://{root / 'reference-l2'}",
                        timeout=trial_timeout, extra_env=None, spares_per_node=spares_per_node)
        if ref["phase"] != "Succeeded" or ref.get("error") or not ref.get("digest"):
            from lifeline.errors import LifelineError

            raise LifelineError(f"the failure-free reference run did not succeed: {ref['phase']} {ref.get('error')}; "
                                f"logs in {root / 'reference' / 'logs'}")
        out["reference"] = {"digest": ref["digest"], "wall_seconds": ref["wall_seconds"],
                            "step_seconds": ref["step_seconds"]}
    fired: dict[str, int] = {}
    rungs: dict[str, int] = {}
    tiers: dict[str, int] = {}
    lost: dict[str, list[float]] = {}
    never: dict[str, int] = {}
    failed, walls = [], []
    totals = {"torn": 0, "complete_step_regressions": 0, "flipped_copies": 0, "detected": 0, "gone_unread": 0,
              "visible_unread": 0, "used": 0, "stale_holdings": 0, "checked": {"L0": 0, "L1": 0, "L2": 0},
              "corruption_reports": 0, "service_restarts": {}}
    for i in range(trials):
        spec = schedule(seed + i, world_size=world, steps=steps, persist_every=persist_every,
                        max_faults=max_faults, faults=faults)
        state = root / f"trial-{seed + i}"
        uri = "s3://lifeline/chaos" if spec.needs_minio else f"file://{state / 'l2'}"
        s = run_trial(doc, spec, state, persist_uri=uri, timeout=trial_timeout, spares_per_node=spares_per_node)
        reasons = verdict(s, ref)
        walls.append(s["wall_seconds"])
        for f in s["faults"]:
            name = f"flip:{f['tier']}" if f["kind"] == "flip" else f["kind"]
            if f.get("ineffective"):
                never[name] = never.get(name, 0) + 1
                continue
            fired[name] = fired.get(name, 0) + 1
            if f.get("when") == "recovery":
                fired["during_recovery"] = fired.get("during_recovery", 0) + 1
        fired_set = {f["fault"] for f in s["faults"]}
        for inj in spec.injections:
            if str(inj) not in fired_set:
                never[str(inj).split(":")[0]] = never.get(str(inj).split(":")[0], 0) + 1
        for r in s["recoveries"]:
            rungs[r["action"]] = rungs.get(r["action"], 0) + 1
            tiers[str(r["tier"])] = tiers.get(str(r["tier"]), 0) + 1
        for row in time_lost(s):
            if row["seconds"] is not None:
                lost.setdefault(row["name"], []).append(row["seconds"])
        audit = s.get("audit") or {}
        totals["torn"] += len(audit.get("torn", []))
        totals["stale_holdings"] += len(audit.get("stale", []))
        for tier, n in (audit.get("checked") or {}).items():
            totals["checked"][tier] += n
        totals["complete_step_regressions"] += len(s["complete_step"]["regressions"])
        c = s.get("corruption") or {}
        totals["flipped_copies"] += c.get("copies", 0)
        totals["detected"] += c.get("detected", 0)
        totals["gone_unread"] += c.get("gone_unread", 0)
        totals["visible_unread"] += c.get("visible_unread", 0)
        totals["used"] += len(c.get("used", []))
        totals["corruption_reports"] += len(s.get("corruption_reports", []))
        for name, n in s.get("service_restarts", {}).items():
            totals["service_restarts"][name] = totals["service_restarts"].get(name, 0) + n
        if reasons:
            failed.append({"seed": seed + i, "faults": spec.describe(), "reasons": reasons, "state_dir": str(state),
                           "replay": f"lifeline bench chaos --seed {seed + i} --trials 1"})
            _write(state / "trial.json", {"reasons": reasons, "faults": spec.describe(), "summary": s})
        elif not keep:
            shutil.rmtree(state, ignore_errors=True)
    out.update({
        "passed": trials - len(failed), "failed": failed,
        "faults_fired": dict(sorted(fired.items())), "faults_not_fired": never,
        "recoveries_per_rung": dict(sorted(rungs.items())), "recoveries_per_tier": dict(sorted(tiers.items())),
        "time_lost_seconds": {k: {"n": len(v), "median": median(v), "max": round(max(v), 3)}
                              for k, v in sorted(lost.items())},
        "checks": totals,
        "trial_wall_seconds": {"median": median(walls), "max": round(max(walls), 3) if walls else None},
        "seconds": round(time.monotonic() - t0, 1), "load_average": {"before": load_before, "after": _load()},
        "cpus": os.cpu_count(), "workdir": str(root),
    })
    return out
