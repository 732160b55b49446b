"""L2 persistence to a real MinIO: outages, catch-up, and tier fallback past a corrupted replica."""

from __future__ import annotations

from _trainer import empty_like, identical, state_at
from conftest import wait_for

from lifeline.checkpoint import StorageOptions, list_steps, storage_from_uri
from lifeline.catalog import Catalog
from lifeline.sidecar.client import SidecarClient


def _l2(endpoint, access, secret, bucket="lifeline-test", **kw):
    return dict(persist_uri=f"s3://{bucket}/ckpt", s3_endpoint=endpoint, s3_access_key=access, s3_secret_key=secret,
                persist_every=1, persist_retries=1, **kw)


def test_minio_down_l0_l1_go_on_and_l2_catches_up(make_settings, sidecars, redis_server, job, tmp_path):
    from lifeline.devcluster.services import MinioServer

    minio = MinioServer(state_dir=tmp_path / "minio").start()
    port = minio.port
    try:
        l2 = _l2(minio.endpoint, minio.access_key, minio.secret_key)
        s0, t0 = make_settings(0, 2, peer_replicas=1, **l2)
        s1, t1 = make_settings(1, 2, peer_replicas=1, **l2)
        a, b = sidecars(s0), sidecars(s1)
        cat = Catalog(redis_server.url, job, 2)
        storage, prefix = storage_from_uri(s0.persist_uri, StorageOptions(
            endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key, retries=0))
        with SidecarClient(t0) as c0, SidecarClient(t1) as c1:
            c0.save(0, state_at(0, 0))
            c1.save(0, state_at(0, 1))
            wait_for(lambda: "L2" in cat.holder_names(0, 1), timeout=60, what="step 0 in MinIO")
            assert list_steps(storage, prefix, job) == [0]
            minio.stop()
            for step in (1, 2):  # L0 and L1 go on
                assert not c0.save(step, state_at(step, 0)).skipped
                assert not c1.save(step, state_at(step, 1)).skipped
            wait_for(lambda: cat.latest_complete_step() == 2, what="step 2 complete at L1 while MinIO is down")
            wait_for(lambda: a.metrics.registry.get_sample_value("lifeline_sidecar_errors_total", {"kind": "storage"}),
                     timeout=60, what="a failed persistence attempt")
            assert "L2" not in cat.holder_names(2, 0)
            minio = MinioServer(state_dir=tmp_path / "minio", port=port).start()
            wait_for(lambda: "L2" in cat.holder_names(2, 0), timeout=90, what="L2 catches up with step 2")
            assert 2 in list_steps(storage, prefix, job)
        cat.close()
    finally:
        minio.stop()


def test_corrupted_replica_is_detected_not_used_and_reported(make_settings, sidecars, redis_server, minio_server, job):
    l2 = _l2(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
    s0, t0 = make_settings(0, 2, peer_replicas=1, **l2)
    s1, t1 = make_settings(1, 2, peer_replicas=1, **l2)
    a, b = sidecars(s0), sidecars(s1)
    cat = Catalog(redis_server.url, job, 2)
    with SidecarClient(t0) as c0, SidecarClient(t1) as c1:
        c0.save(0, state_at(0, 0))
        c1.save(0, state_at(0, 1))
        wait_for(lambda: "L2" in cat.holder_names(0, 0), timeout=60, what="step 0 in MinIO")
        wait_for(lambda: cat.latest_complete_step() == 0, what="step 0 replicated (complete at L1)")
    replica = b.store.get("shard", 0, 0)
    replica.buf[200] ^= 0x01  # bit rot in rank 1's copy of rank 0's shard
    a.stop()  # rank 0's node is lost
    s_new, t_new = make_settings(0, 2, node="n9", ip="127.0.0.9", arena="r0-new", peer_replicas=1, **l2)
    c = sidecars(s_new)
    with SidecarClient(t_new) as client:
        into = empty_like(0)
        res = client.restore(into=into)
    assert (res.step, res.tier) == (0, "L2") and identical(into, state_at(0, 0))
    reports = cat.corrupt_reports()
    assert len(reports) == 1 and reports[0].rank == 0 and reports[0].tier == "L1"
    assert c.metrics.registry.get_sample_value("lifeline_sidecar_errors_total", {"kind": "checksum"}) == 1
    assert b.store.get("shard", 0, 0) is None and "L1@1" not in cat.holder_names(0, 0)  # the bad copy is dropped
    cat.close()


def test_l2_commit_failing_after_the_claim_is_redone_by_the_retry(make_settings, sidecars, redis_server, job,
                                                                   tmp_path):
    """Found by ``bench crash``: the rank completing the set claims the commit in the catalog, then writes the
    manifest; when that write failed, the retry was refused the claim and the step never reached L2."""
    import shutil

    from lifeline.checkpoint import FilesystemStorage, consolidate, verify_checkpoint

    root = tmp_path / "l2"
    s, t = make_settings(0, 1, peer_replicas=0, persist_uri=str(root), persist_every=1, persist_retries=1)
    blocker = root / job / f"{0:012d}" / "manifest.json"
    (blocker / "in-the-way").mkdir(parents=True)  # the blob lands, the manifest cannot: the commit fails
    sc = sidecars(s)
    storage = FilesystemStorage(root)
    cat = Catalog(redis_server.url, job, 1)
    with SidecarClient(t) as client:
        client.save(0, state_at(0, 0))
        wait_for(lambda: sc.metrics.registry.get_sample_value("lifeline_sidecar_errors_total", {"kind": "storage"}),
                 timeout=30, what="the failed commit")
        assert cat.committer(0) == 0 and list_steps(storage, "", job) == []
        shutil.rmtree(blocker)
        wait_for(lambda: list_steps(storage, "", job) == [0], timeout=30, what="the retried commit")
    verify_checkpoint(storage, "", job, 0)
    want = state_at(0, 0)
    got = consolidate(storage, "", job, 0, names=[k for k, v in want.items() if not isinstance(v, bytes)])
    assert identical(got, {k: v for k, v in want.items() if not isinstance(v, bytes)})
    wait_for(lambda: "L2" in cat.holder_names(0, 0), what="the L2 holding")
    cat.close()
