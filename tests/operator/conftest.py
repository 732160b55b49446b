"""Fixtures of the operator's tests: a validated TrainingJob as read from the API server (unit tests);
``operator_release``, the chart installed on the dev cluster (the e2e tests)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from lifeline.api.load import load_trainingjob

from _e2e import CHART, RELEASE, SRC, _get, _wait

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"


@pytest.fixture
def job_body() -> dict:
    """examples/gpt-moe.yaml with the metadata the API server adds (uid, namespace, generation)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(uid="0b7f5c4e-1111-2222-3333-444455556666", namespace="team-a", generation=1)
    return body


@pytest.fixture
def job(job_body):
    """The validated :class:`~lifeline.api.TrainingJob` of :func:`job_body`."""
    return load_trainingjob(copy.deepcopy(job_body))


@pytest.fixture
def operator_release(devcluster, namespace):
    """The chart installed into ``namespace`` (watching it), Redis/MinIO from the dev cluster."""
    from minio import Minio

    s3 = Minio(devcluster.minio_endpoint, devcluster.minio_access_key, devcluster.minio_secret_key, secure=False)
    if not s3.bucket_exists("lifeline"):
        s3.make_bucket("lifeline")
    crd_exists = devcluster.kubectl("get", "crd", "trainingjobs.lifeline.dev", "--ignore-not-found", "-o", "name")
    devcluster.helm(
        "install", RELEASE, str(CHART), "--namespace", namespace,
        "--set", f"crds.enabled={'false' if crd_exists.strip() else 'true'}",
        "--set", f"redis.external.url={devcluster.redis_url}",
        "--set", f"objectStorage.external.endpoint={devcluster.minio_endpoint}",
        "--set", f"objectStorage.accessKey={devcluster.minio_access_key}",
        "--set", f"objectStorage.secretKey={devcluster.minio_secret_key}",
        "--set", "operator.resyncSeconds=2",
        "--set", "operator.metricsService.enabled=false",  # Endpoints refuse the dev cluster's loopback pod IPs
        # process pods run this interpreter without the test's PYTHONPATH: point the operator at the
        # code under test (a worktree's src), not whatever the venv's editable install names
        "--set", "operator.extraEnv[0].name=PYTHONPATH", "--set", f"operator.extraEnv[0].value={SRC}",
    )
    devcluster.kubectl("wait", "--for=condition=Established", "crd/trainingjobs.lifeline.dev", "--timeout=60s")

    def operator_ready():
        pods = _get(devcluster, "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator")["items"]
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for p in pods for c in p.get("status", {}).get("conditions", []))

    _wait("the operator pod to be Ready", operator_ready, timeout=120)
    try:
        yield namespace
    finally:
        devcluster.kubectl("delete", "trainingjobs", "--all", "-n", namespace, "--wait=false", check=False)
        devcluster.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s", check=False)
