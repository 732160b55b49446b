"""The operator's straggler watch (issue 27, docs/stragglers.md "On Kubernetes"): progress reports with
``timings`` written into a real catalog (a real Redis), one rank computing 2x its pipeline-stage peer, read
back as the reconcile reads them (``Catalog.view``) and fed to :func:`lifeline.operator.stragglers.straggler_round`
with the operator's real :class:`~lifeline.operator.reconcile.Env`; the Kubernetes writes (the Event posts,
the cool-down patch, the pod deletion) are recorded at the client's surface."""

from __future__ import annotations

import copy
import time
import uuid
from types import SimpleNamespace

import pytest

from lifeline.api import load_trainingjob
from lifeline.api.crd import build_crd
from lifeline.api.manifests import pod_name
from lifeline.api.trainingjob import TrainingJobStatus
from lifeline.catalog import Catalog, ProgressReport
from lifeline.operator import events, metrics
from lifeline.operator.reconcile import Env, forget_job
from lifeline.operator.recorded import Recorded
from lifeline.operator.settings import OperatorSettings
from lifeline.operator.status import next_status
from lifeline.operator.stragglers import straggler_round


class _Core:
    """``CoreV1Api``'s pod deletion, recorded."""

    def __init__(self):
        self.deleted: list[tuple[str, str, str]] = []

    def delete_namespaced_pod(self, name, namespace, body=None, **_):
        self.deleted.append((name, namespace, body.preconditions.uid))


class _Custom:
    """``CustomObjectsApi``'s metadata patches of the TrainingJob, recorded."""

    def __init__(self):
        self.patches: list[dict] = []

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, patch):
        self.patches.append(patch)


@pytest.fixture
def setup(redis_server, job_body, monkeypatch):
    name = f"strag-{uuid.uuid4().hex[:6]}"

    def make(action: str):
        body = copy.deepcopy(job_body)
        body["metadata"]["name"] = name
        body["spec"]["recovery"]["straggler"] = {"threshold": 1.5, "window": 3, "action": action}
        return body, load_trainingjob(copy.deepcopy(body))

    posted: list[dict] = []
    monkeypatch.setattr(events.kopf, "event", lambda body, **kw: posted.append(kw))
    env = Env(core=_Core(), custom=_Custom(), settings=OperatorSettings(redis_url=redis_server.url))
    catalog = Catalog(redis_server.url, name, 4)
    try:
        yield name, make, env, catalog, posted
    finally:
        catalog.close()


def _report(catalog: Catalog, name: str, generation: int, last: int, slow: int | None) -> None:
    """Each rank's step report carrying the compute seconds of steps 1..last: 10 ms, ``slow``'s 20 ms."""
    for rank in range(4):
        timings = {str(s): 0.02 if rank == slow else 0.01 for s in range(1, last + 1)}
        catalog.report(ProgressReport("step", name, rank, generation, time.time(), step=last,
                                      fields={"timings": timings}))


def _pods(name: str) -> dict[int, dict]:
    return {r: {"metadata": {"name": pod_name(name, r), "uid": f"uid-{r}"}, "spec": {"nodeName": f"node-{r}"}}
            for r in range(4)}


def _gauge(job) -> float | None:
    return metrics.REGISTRY.get_sample_value("lifeline_operator_straggler_ranks",
                                             {"namespace": job.namespace, "job": job.name})


def test_a_2x_rank_is_reported_once_and_with_replace_its_node_cooled_and_its_pod_deleted(setup):
    name, make, env, catalog, posted = setup
    body, job = make("replace")
    ns = job.namespace

    def round_(old, may_replace=True, now=1000.0):
        return straggler_round(env, body, job, catalog.view(recent_steps=4), _pods(name), world_size=4,
                               layout=job.spec.layout, old=old, recorded=Recorded(cool_downs={"node-0": 5000.0}),
                               may_replace=may_replace, now=now)

    _report(catalog, name, 0, 2, slow=3)
    assert round_([]) == [] and posted == [] and _gauge(job) == 0  # 2 steps < window 3: no verdict yet
    _report(catalog, name, 0, 3, slow=3)
    out = round_([])
    assert [(s["rank"], s["generation"], s["relative"], s["steps"], s["node"], s["action"]) for s in out] == [
        (3, 0, 2.0, [1, 3], "node-3", "replace")]
    assert [(e["type"], e["reason"]) for e in posted] == [("Warning", "StragglerDetected"),
                                                        ("Normal", "StragglerReplaced")]
    assert "rank 3 computes 2.00x" in posted[0]["message"] and "node-3" in posted[0]["message"]
    assert env.core.deleted == [(pod_name(name, 3), ns, "uid-3")]
    assert env.custom.patches == [{"metadata": {"annotations": {
        "lifeline.dev/cool-downs": '{"node-0": 5000.0, "node-3": 1600.0}'}}}]  # nodeCooldownSeconds 600
    assert _gauge(job) == 1

    # the status field: written by next_status, validated by the status model (the CRD's schema has it)
    status = next_status({}, phase="Running", reason="Running", stragglers=out)
    assert status["stragglers"][0]["computeSeconds"] == pytest.approx(0.02)
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "stragglers" in schema["properties"]
    columns = {c["name"]: c["jsonPath"] for c in build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Stragglers"] == ".status.stragglers[-1:].rank"

    # flagged once per generation: a newer step judged again neither reports nor deletes anew
    _report(catalog, name, 0, 4, slow=3)
    records = TrainingJobStatus.model_validate(status).stragglers
    assert round_(records) == out
    assert len(posted) == 2 and len(env.core.deleted) == 1 and len(env.custom.patches) == 1

    # a new generation (the rank moved): judged afresh, the old generation's records dropped
    _report(catalog, name, 1, 2, slow=None)
    view = SimpleNamespace(generation=1, reports=catalog.view(recent_steps=4).reports)
    assert straggler_round(env, body, job, view, _pods(name), world_size=4, layout=job.spec.layout, old=records,
                           recorded=Recorded(), may_replace=True, now=1000.0) == []
    assert _gauge(job) == 0 and env._stragglers[job.metadata["uid"]].generation == 1
    forget_job(env, body)
    assert job.metadata["uid"] not in env._stragglers


def test_report_only_and_during_a_recovery_nothing_is_deleted(setup):
    name, make, env, catalog, posted = setup
    body, job = make("report")
    _report(catalog, name, 0, 3, slow=1)
    out = straggler_round(env, body, job, catalog.view(recent_steps=4), _pods(name), world_size=4,
                          layout=job.spec.layout, old=[], recorded=Recorded(), may_replace=True, now=0.0)
    assert [(s["rank"], s["action"]) for s in out] == [(1, "report")]
    assert [e["reason"] for e in posted] == ["StragglerDetected"] and env.core.deleted == []
    assert env.custom.patches == []

    body, job = make("replace")  # the spec changed: a new watch; while recovering (may_replace False) no move
    out = straggler_round(env, body, job, catalog.view(recent_steps=4), _pods(name), world_size=4,
                          layout=job.spec.layout, old=[], recorded=Recorded(), may_replace=False, now=0.0)
    assert [(s["rank"], s["action"]) for s in out] == [(1, "report")] and env.core.deleted == []
    assert straggler_round(env, body, job, None, {}, world_size=4, layout=job.spec.layout, old=[],
                           recorded=Recorded(), may_replace=True, now=0.0) is None  # no catalog read: keep
