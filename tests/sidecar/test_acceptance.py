"""Acceptance: sidecars and trainers as separate processes on distinct loopback IPs, real Redis and MinIO."""

from __future__ import annotations

import json

from conftest import sidecar_argv, sidecar_env, trainer_argv, wait_for

from lifeline.catalog import Catalog


def _last_json(proc) -> dict:
    lines = [ln for ln in proc.output().splitlines() if ln.startswith("{") and '"level"' not in ln]
    return json.loads(lines[-1])


def _start_rank(procs, settings, name, first, last):
    env = sidecar_env(settings)
    sc = procs(f"sidecar-{name}", sidecar_argv(), env)
    tr = procs(f"trainer-{name}", trainer_argv("save", str(first), str(last), "--hold"), env)
    return sc, tr


def test_restarted_trainer_restores_latest_step_from_l0(make_settings, procs, redis_server, job):
    s, _ = make_settings(0, 1, peer_replicas=0, peer_port=0, metrics_port=-1)
    sidecar, trainer = _start_rank(procs, s, "0", 0, 5)
    cat = Catalog(redis_server.url, job, 1)
    wait_for(lambda: cat.latest_complete_step() == 5, timeout=60, what="step 5 complete")
    trainer.kill()
    again = procs("trainer-0b", trainer_argv("restore"), sidecar_env(s))
    assert again.wait(60) == 0, again.output()
    assert _last_json(again) == {"step": 5, "tier": "L0", "identical": True}
    assert sidecar.p.poll() is None  # the sidecar outlived the trainer
    cat.close()


def test_node_loss_restores_from_peer_then_from_minio(make_settings, procs, redis_server, minio_server, job):
    world = 3
    l2 = dict(persist_uri="s3://lifeline-test/ckpt", s3_endpoint=minio_server.endpoint,
              s3_access_key=minio_server.access_key, s3_secret_key=minio_server.secret_key, persist_every=2)
    cat = Catalog(redis_server.url, job, world)
    ranks = {}
    for r in range(world):
        s, _ = make_settings(r, world, peer_replicas=1, metrics_port=-1, **l2)
        ranks[r] = _start_rank(procs, s, str(r), 0, 2)
    wait_for(lambda: cat.latest_complete_step() == 2, timeout=90, what="step 2 complete at L1")
    wait_for(lambda: "L2" in cat.holder_names(2, 0), timeout=90, what="step 2 committed to MinIO")
    holder = next(int(h.split("@")[1]) for h in cat.holder_names(2, 0) if h.startswith("L1@"))
    assert holder != 0
    # rank 0's node dies: its sidecar and trainer together
    for p in ranks[0]:
        p.kill()
    s_new, _ = make_settings(0, world, node="n9", ip="127.0.0.9", arena="r0-replacement", peer_replicas=1,
                             metrics_port=-1, **l2)
    procs("sidecar-0-replacement", sidecar_argv(), sidecar_env(s_new))
    t = procs("trainer-0-replacement", trainer_argv("restore"), sidecar_env(s_new))
    assert t.wait(90) == 0, t.output()
    assert _last_json(t) == {"step": 2, "tier": "L1", "identical": True}
    # now the replacement's node and the peer holding the replica die too: only MinIO is left
    for p in ranks[holder]:
        p.kill()
    procs.kill("sidecar-0-replacement")
    s_3, _ = make_settings(0, world, node="n10", ip="127.0.0.10", arena="r0-third", peer_replicas=1,
                           metrics_port=-1, **l2)
    procs("sidecar-0-third", sidecar_argv(), sidecar_env(s_3))
    t3 = procs("trainer-0-third", trainer_argv("restore"), sidecar_env(s_3))
    assert t3.wait(120) == 0, t3.output()
    assert _last_json(t3) == {"step": 2, "tier": "L2", "identical": True}
    cat.close()
