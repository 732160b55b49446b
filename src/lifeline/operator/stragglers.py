"""The operator's straggler watch (docs/stragglers.md, "On Kubernetes").

Each reconcile feeds the job's catalog read to its :class:`lifeline.control.stragglers.StragglerWatch`
(one per job, by UID, in :class:`lifeline.operator.reconcile.Env`: lost when the operator restarts, which
only makes it gather ``window`` steps again). A rank flagged is reported once per generation: a
``StragglerDetected`` Warning Event, an entry of ``status.stragglers`` (the "Stragglers" column of
``kubectl get tj``) and the gauge ``lifeline_operator_straggler_ranks``. With
``spec.recovery.straggler.action: replace``, while the job runs with no recovery under way, its node is
cooled down (the job's ``lifeline.dev/cool-downs`` annotation, for ``nodeCooldownSeconds``) and its pod
deleted (its UID as precondition; the pod's grace lets the trainer save the step it completes): the engine
replaces it as a lost pod, on another node (a ``StragglerReplaced`` Event).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client import V1DeleteOptions, V1Preconditions
from kubernetes.client.exceptions import ApiException

from lifeline.api.trainingjob import GROUP, PLURAL, VERSION, StragglerRecord, TrainingJob
from lifeline.control.stragglers import StragglerScore, StragglerVerdict
from lifeline.operator import events, metrics
from lifeline.operator.recorded import Recorded

__all__ = ["straggler_round"]


def straggler_round(env: Any, body: Mapping[str, Any], job: TrainingJob, view: Any, pods: Mapping[int, Any], *,
                    world_size: int, layout: Any, old: Sequence[StragglerRecord], recorded: Recorded,
                    may_replace: bool, now: float) -> list[dict[str, Any]] | None:
    """One reconcile's straggler round for ``job`` (see the module docstring).

    Args:
        env: the operator's :class:`~lifeline.operator.reconcile.Env` (its watches, ``core``, ``custom``).
        body: the TrainingJob object (for events).
        view: the catalog read (``.generation``, ``.reports``); ``None`` when it could not be read.
        pods: live pods by rank (raw objects: ``metadata.name``/``uid``, ``spec.nodeName``).
        world_size, layout: the current layout (ranks are compared within their pipeline stage).
        old: ``status.stragglers`` as read (a rank already there for this generation is not flagged again,
            across operator restarts too).
        recorded: the job's annotations (its cool-downs).
        may_replace: the job runs with no recovery under way (``action: replace`` acts only then).
        now: seconds since the epoch.

    Returns:
        The new ``status.stragglers`` (wire form, by rank: the current generation's), or ``None`` (keep the
        old ones) without a catalog read.

    Raises:
        kubernetes.client.ApiException: the cool-down patch or the pod deletion failed (not 404/409).
    """
    if view is None:
        return None
    spec = job.spec.recovery.straggler
    watch = env.straggler_watch(job.metadata.get("uid", ""), spec)
    watch.layout = layout
    verdict = watch.observe(view, world_size)
    kept = {r.rank: r for r in old if r.generation == view.generation}
    if verdict is not None:
        for score in watch.flag(verdict):
            if score.rank in kept:
                continue
            try:
                kept[score.rank] = _flagged(env, body, job, verdict, score, pods.get(score.rank), view.generation,
                                            recorded, may_replace and spec.action == "replace", now)
            except ApiException:
                del watch.flagged[score.rank]  # not in the status: flagged (and acted on) again at the retry
                raise
    metrics.STRAGGLER_RANKS.labels(job.namespace, job.name).set(len(kept))
    return [kept[r].to_wire() for r in sorted(kept)]


def _flagged(env: Any, body: Mapping[str, Any], job: TrainingJob, verdict: StragglerVerdict, score: StragglerScore,
             pod: Mapping[str, Any] | None, generation: int, recorded: Recorded, replace: bool,
             now: float) -> StragglerRecord:
    """Report (and with ``replace``, move) one rank newly flagged; its status record."""
    meta = (pod or {}).get("metadata") or {}
    node = ((pod or {}).get("spec") or {}).get("nodeName")
    replace = replace and pod is not None
    steps = [verdict.steps[0], verdict.steps[-1]]
    spec = job.spec.recovery
    events.record(body, "StragglerDetected",
                  f"rank {score.rank} computes {score.relative:.2f}x the other ranks' median over steps "
                  f"{steps[0]}-{steps[1]} (threshold {spec.straggler.threshold:g}; {score.individual:.2f}x its "
                  f"own best) on node {node}, generation {generation}")
    if replace:
        if node and spec.node_cooldown_seconds > 0:
            env.custom.patch_namespaced_custom_object(GROUP, VERSION, job.namespace, PLURAL, job.name,
                                                      recorded.cool_down_patch(node, now + spec.node_cooldown_seconds))
        try:
            env.core.delete_namespaced_pod(meta.get("name"), job.namespace, body=V1DeleteOptions(
                preconditions=V1Preconditions(uid=meta.get("uid"))))
        except ApiException as err:
            if err.status not in (404, 409):  # gone already, or a newer pod of that name: nothing to move
                raise
        events.record(body, "StragglerReplaced",
                      f"deleted pod {meta.get('name')} of straggler rank {score.rank}: it moves to another node, "
                      f"{node} cooled down for {spec.node_cooldown_seconds}s")
    return StragglerRecord(rank=score.rank, generation=generation, relative=round(score.relative, 3),
                           individual=round(score.individual, 3), compute_seconds=round(score.compute_seconds, 6),
                           steps=steps, node=node, action="replace" if replace else "report")
