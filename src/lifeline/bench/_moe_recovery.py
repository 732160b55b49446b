"""``bench moe``'s recovery rows: one failed pipeline stage, localized replay vs global rollback.

Two ``lifeline run``s of the same 3-stage GPT-MoE job (one rank per stage, checkpoints every
``every`` steps, warm-up + cosine LR and gradient clipping on) with the same injected crash of the
middle stage's trainer; one with ``recovery.localizedReplay`` (the stage restores its copy and
replays from its neighbours' upstream logs), one without (every rank restores the same copy and
recomputes). Both restore the same step, so the difference is what each recomputes. A third run
takes sparse checkpoints (W = 3) instead of dense ones: the failed stage restores its latest
complete window and replays it (``localized_sparse``); all three end on the same parameters.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["recovery_rows", "job_doc"]

STAGES = 3
MODEL = {"d_model": 64, "n_layers": STAGES, "n_heads": 4, "d_expert": 64, "seq_len": 64, "micro_batch": 2,
         "micro_batches": 4, "corpus_bytes": 1 << 18, "grad_clip": 0.5}
ENV = {"LIFELINE_COLLECTIVE_TIMEOUT_SECONDS": "20"}


def job_doc(name: str, *, steps: int, every: int, localized: bool, l2: str, experts: int = 8,
            sparse: int = 0, model: str = "gpt-moe") -> dict:
    """The 3-stage TrainingJob document of the recovery rows (``sparse``: W of sparse checkpoints,
    which then replace the dense ones until the last step; ``model``: ``gpt-moe``, the reference
    trainer, or ``pipelining-moe``, examples/pipelining-moe's own script)."""
    if model == "pipelining-moe":
        from lifeline.bench._moe_pipelining import pipelining_doc

        return pipelining_doc(name, steps=steps, every=every, localized=localized, l2=l2, sparse=sparse, env=ENV)
    if sparse:
        every = steps
    doc = {
        "apiVersion": "lifeline.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "replicas": STAGES, "layout": {"pipeline": STAGES, "data": 1}, "steps": steps, "seed": 0,
            "model": {"name": "gpt-moe", "args": {**MODEL, "n_experts": experts}},
            "template": {"spec": {"containers": [{"name": "trainer", "command": ["python", "-m", "lifeline", "trainer"],
                                                  "env": [{"name": k, "value": v} for k, v in ENV.items()]}]}},
            "checkpoint": {"every": every, "peerReplicas": 1, "persist": {"every": every, "uri": l2}},
            "recovery": {"maxRestarts": 10, "hangTimeoutSeconds": 300, "localizedReplay": localized},
        },
    }
    if sparse:
        doc["spec"]["checkpoint"]["sparse"] = {"window": sparse}
    return doc


def _one(root: Path, name: str, *, steps: int, every: int, fail_step: int, localized: bool,
         sparse: int = 0, model: str = "gpt-moe") -> dict[str, Any]:
    from lifeline.launch.inject import Injection
    from lifeline.launch.spec import load_for_launch
    from lifeline.launch.supervisor import LaunchOptions, Supervisor
    from lifeline.runtime.events import read_events

    job = load_for_launch(job_doc(name, steps=steps, every=every, localized=localized, l2=f"file://{root / 'l2'}",
                                  sparse=sparse, model=model))
    sup = Supervisor(job, LaunchOptions(state_dir=root / name, injections=(Injection("trainer", 1, fail_step),),
                                        timeout_seconds=900, templates=False))  # fresh, as a container
    phase = sup.run()
    (rec,) = [r.to_dict() for r in sup.snapshot.recoveries]
    events = read_events(sorted((root / name / "logs").glob("*-trainer.log")))
    g = rec["generation"]
    restore = rec["restore_step"]
    replayed = [e for e in events if e.get("event") == "replay" and e.get("generation") == g]
    recomputed = [e for e in events if e.get("event") == "step" and e.get("generation") == g
                  and restore < e["step"] <= fail_step]
    ranks = sorted({e["rank"] for e in events if e.get("event") == "restore" and e.get("generation") == g})
    step_s = sorted(v for v in sup.step_seconds.values() if v > 0)
    log_bytes = [e["log_bytes"] for e in events if e.get("event") == "replayed" and e.get("generation") == g]
    per_step: dict[int, int] = {}
    log_seconds, slot_bytes, slot_seconds = [], [], []
    for e in events:
        if e.get("event") == "step" and e.get("generation") == 0 and "slot_bytes" in e:
            slot_bytes.append(int(e["slot_bytes"]))
            slot_seconds.append(float(e["slot_seconds"]))
        if e.get("event") == "step" and e.get("generation") == 0 and "log_bytes" in e:
            per_step[e["step"]] = per_step.get(e["step"], 0) + int(e["log_bytes"])
            log_seconds.append(float(e["log_seconds"]))
    return {
        "upstream_log_bytes_per_step": statistics.median(per_step.values()) if per_step else 0,
        "upstream_log_seconds_per_rank_step": round(statistics.median(log_seconds), 6) if log_seconds else 0.0,
        "phase": phase, "action": rec["action"], "restore_step": restore, "failure_step": fail_step,
        "ranks_restored": ranks,
        "to_failure_step_seconds": rec.get("to_same_step_seconds"),
        "rank_seconds_recomputed": round(sum(e["seconds"] for e in replayed + recomputed), 4),
        "rank_steps_recomputed": len(replayed + recomputed),
        "steps_recomputed_per_rank": len(replayed + recomputed) // max(1, len(ranks)),
        "step_seconds": step_s[len(step_s) // 2] if step_s else None,
        "replay_log_bytes_per_step": (log_bytes[0] // max(1, len(replayed))) if log_bytes and replayed else None,
        "digest": (sup.digest or {}).get("sha256"),
        **({"window": sparse, "slot_bytes_per_rank_step": statistics.median(slot_bytes) if slot_bytes else 0,
            "slot_seconds_per_rank_step": round(statistics.median(slot_seconds), 6) if slot_seconds else 0.0,
            "restored_from": sorted({e.get("source", "checkpoint") for e in events if e.get("event") == "restore"
                                     and e.get("generation") == g})} if sparse else {}),
    }


def recovery_rows(root: Path, *, steps: int = 12, every: int = 4, fail_step: int = 7,
                  model: str = "gpt-moe") -> dict[str, Any]:
    """Both runs and the ratio of rank-seconds recomputed (target ≤ 1 / stages)."""
    kw = dict(steps=steps, every=every, fail_step=fail_step, model=model)
    localized = _one(root, "moe-localized", localized=True, **kw)
    rollback = _one(root, "moe-rollback", localized=False, **kw)
    sparse = _one(root, "moe-sparse", localized=True, sparse=3, **kw)
    ratio = steady = None
    if rollback["rank_seconds_recomputed"]:
        ratio = round(localized["rank_seconds_recomputed"] / rollback["rank_seconds_recomputed"], 4)
    if rollback["step_seconds"] and rollback["rank_steps_recomputed"]:
        # the rollback's first steps after a restart include the pipeline's warm-up waits; this ratio
        # prices its recomputed steps at the median step time instead (the conservative comparison)
        steady = round(localized["rank_seconds_recomputed"]
                       / (rollback["rank_steps_recomputed"] * rollback["step_seconds"]), 4)
    return {"model": model, "stages": STAGES, "localized": localized, "global_rollback": rollback, "localized_sparse": sparse,
            "same_final_parameters": len({localized["digest"], rollback["digest"], sparse["digest"]}) == 1,
            "recomputed_ratio": ratio, "recomputed_ratio_at_median_step": steady,
            "target_ratio": round(1 / STAGES, 4),
            "met": ratio is not None and steady is not None and max(ratio, steady) <= 1 / STAGES}
