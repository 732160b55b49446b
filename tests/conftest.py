"""Shared fixtures: real servers, started by the fixtures themselves (never skipped).

- ``redis_server`` (session): a real ``redis-server`` on loopback. Use ``.url``.
- ``minio_server`` (session): a real MinIO server on loopback, built from source on first
  use when the cache is cold. Use ``.endpoint``, ``.access_key``, ``.secret_key``
  (plain HTTP: ``secure=False``).
- ``azurite_server`` (session): a real Azurite blob service (the Azure Storage emulator) on
  loopback, installed from npm into the cache on first use. Use ``.endpoint`` (the account URL),
  ``.account``, ``.key`` or ``.connection_string``.
- ``gcs_server`` (session): a real fake-gcs-server (a Google Cloud Storage emulator) on loopback,
  built from source on first use when the cache is cold. Use ``.endpoint`` (the JSON API's base URL;
  anonymous access).
- ``devcluster`` (session): a real Kubernetes control plane (etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler) with 3 process nodes, Redis and MinIO; a
  :class:`lifeline.devcluster.DevCluster` (``.kubeconfig``, ``.kubectl(*args, input=...)``
  returning stdout and raising ``ClusterError`` on failure, ``.helm(...)``, ``.nodes``,
  ``.kill_node(name)``, ``.start_node(name)``, ``.freeze_node(name, thaw=False)``,
  ``.kill_container(pod, container, namespace=...)``, ``.log_path(pod, container,
  namespace=...)``, ``.redis_url``, ``.minio`` with ``.endpoint``/``.access_key``/``.secret_key``).
  Pods run as local processes: see docs/devcluster.md for what differs from a kubelet
  (``command`` is required; mounts are exposed as ``LIFELINE_MOUNT_<VOLUME>``; bind the
  pod IP from the downward API).
- ``namespace`` (function): a fresh namespace in the dev cluster whose ``default``
  ServiceAccount exists; deleted after the test.
"""

from __future__ import annotations

import os
import uuid

import pytest

from lifeline.devcluster.azurite import AzuriteServer
from lifeline.devcluster.fakegcs import FakeGCSServer
from lifeline.devcluster.services import MinioServer, RedisServer


_CLUSTER_FIXTURES = {"devcluster": "cluster", "namespace": "cluster", "kind_cluster": "kind"}
_skipped: list[str] = []


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# tests/gpu needs a CUDA device: collected where PyTorch sees one (scripts/gpu_check.sh runs it), not
# collected elsewhere, rather than skipped (a skip fails a CI run, which has no GPU)
collect_ignore = [] if _cuda_available() else ["gpu"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """A test that uses a cluster fixture carries that cluster's marker, so ``-m "not cluster and not
    kind"`` (the fast local suite, docs/testing.md) never starts one. Every cluster and kind test is in
    one ``xdist_group``: under ``-n 2 --dist loadgroup`` (pyproject.toml) one worker runs them one after
    the other, with one dev cluster and one kind cluster at a time, while the other worker runs the rest."""
    for item in items:
        for fixture, marker in _CLUSTER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and marker not in item.keywords:
                item.add_marker(getattr(pytest.mark, marker))
        if "cluster" in item.keywords or "kind" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("clusters"))


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """In CI (``CI`` set) a skipped test fails the run: a skip would hide missing infrastructure."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and _skipped and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and _skipped:
        terminalreporter.write_line(f"CI: {len(_skipped)} skipped test(s) fail the run: {', '.join(_skipped[:10])}",
                                    red=True)


@pytest.fixture(scope="session")
def redis_server():
    """A real Redis server on 127.0.0.1 (session-scoped); ``.url`` is ``redis://127.0.0.1:PORT/0``."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def minio_server():
    """A real MinIO server on 127.0.0.1 (session-scoped); ``.endpoint``, ``.access_key``, ``.secret_key``."""
    server = MinioServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite_server():
    """A real Azurite blob service on 127.0.0.1 (session-scoped); ``.endpoint``, ``.account``, ``.key``."""
    server = AzuriteServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs_server():
    """A real fake-gcs-server on 127.0.0.1 (session-scoped); ``.endpoint`` is ``http://127.0.0.1:PORT``."""
    server = FakeGCSServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory):
    """One real dev cluster per test session (3 process nodes), torn down at the end."""
    from lifeline.devcluster import DevCluster

    cluster = DevCluster.up(tmp_path_factory.mktemp("devcluster"), nodes=3, ports="auto")
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def namespace(devcluster):
    """A fresh namespace (``t-<hex>``) with its default ServiceAccount ready; deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    devcluster.create_namespace(name)
    try:
        yield name
    finally:
        devcluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
