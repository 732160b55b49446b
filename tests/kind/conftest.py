"""The kind test bed for the e2e suite: one kind cluster per test module (docs/kind.md).

- ``kind_cluster`` (module): a :class:`lifeline.kindbed.KindCluster` of kind-config.yaml's
  shape (1 control plane, 3 workers) named ``lifeline-e2e``, every image built on this
  machine. The Lifeline image is rebuilt from the checkout under test first (Docker's layer
  cache keeps it to the package layer); the node and service images are reused when cached.
  The cluster is deleted after the module (left running it would load the rest of the suite).
- ``kind_release`` (module): the chart installed as release ``ll`` in namespace ``lifeline``
  with its in-cluster Redis and MinIO (bucket ``lifeline`` created through the MinIO Service),
  watching that namespace; ``(cluster, namespace)``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = "lifeline-e2e"
RELEASE = "ll"
NAMESPACE = "lifeline"


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory):
    """One kind cluster per test module (built images reused), deleted after it: left running
    (four nodes, Redis, MinIO, the operator) it would load the rest of the suite."""
    from lifeline.kindbed import chart, engine, images, nodeimage
    from lifeline.kindbed.cluster import KindCluster

    engine.ensure_engine()
    nodeimage.ensure_node_image()
    images.ensure_services()
    images.ensure_lifeline(ROOT)  # the code under test
    state = tmp_path_factory.mktemp("kind")
    stale = KindCluster(NAME, state)
    if stale.exists():  # a session killed before its teardown
        stale.down()
    cluster = KindCluster.up(NAME, state, config=ROOT / "kind-config.yaml")
    try:
        cluster.load(*chart.service_images())
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def kind_release(kind_cluster):
    """The chart (release ``ll``) with in-cluster Redis and MinIO in namespace ``lifeline``."""
    from lifeline.kindbed import chart

    chart.install(kind_cluster, ROOT / "helm" / "lifeline", release=RELEASE, namespace=NAMESPACE,
                  values={"operator.resyncSeconds": "2"})
    return kind_cluster, NAMESPACE
