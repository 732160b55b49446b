"""``lifeline bench recovery``: time from failure to training resumed at the same step, and steps of
work lost, for Lifeline's cheap rungs against restarting every rank from a DCP checkpoint in MinIO;
and the ETTR of a run with failures at a given MTBF.

Rows (all measured in the same run, the same 4-rank GPT-MoE job, PP=2 x DP=2):

* ``in_place_l0`` — a trainer is killed; it restarts in place and every rank reloads the step
  held in sidecar memory (L0); survivors recover in their processes.
* ``replace_l1`` — a "node" (sidecar and trainer) is lost; the rank is recreated on another node
  and restores from its peer's L1 copy.
* ``dcp_restart_all`` — the baseline: a trainer is killed; every rank is restarted (as a job
  without Lifeline is, e.g. by TorchElastic) and loads the latest ``torch.distributed.checkpoint``
  checkpoint from MinIO (saved every ``persist_every`` steps, like Lifeline's L2).
* ``cold`` — ``in_place_l0`` and ``replace_l1`` again with spares off (every restarted container
  a fresh process): what the spares buy, measured in the same run.
* ``ettr`` — a ``lifeline run`` of about ``duration`` seconds of training with failures (trainer
  crashes and node losses alternating, on seeded random ranks) at exponential inter-arrival times
  of mean ``mtbf``; ETTR (kept step time over wall time) overall and after start-up.

Time to resume counts from the kill to every rank having trained past the step the job had
reached (rework included); ``detect_seconds`` is the part until the supervisor acted.

Lifeline's rows run with pre-warmed spare processes (``lifeline.launch.spare_pool``; the pool is warm
before the ranks start, so the first failure meets it) and carry ``breakdown``: seconds from the
kill to each point of the recovery, from the supervisor's record and the trainers' event lines —
``noticed`` (supervisor saw the exit), ``survivors_failed`` (the last survivor reported its
collective error), ``planned``, ``published`` (plan in the catalog), ``launched`` (spares
assigned / processes started), ``survivors_saw_plan``, ``replacement_init`` (the new trainer
entered ``init()``: imports done, settings read), ``joined`` (every rank's process group and
sub-groups built), ``restored``, ``first_step`` (every rank trained one step of the new
generation), ``caught_up``; plus ``join_seconds`` (the slowest rank's rendezvous, barrier,
process-group and sub-group times) and ``restore_seconds`` (the slowest restore).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run"]

MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_expert": 64, "seq_len": 64, "micro_batch": 2,
         "micro_batches": 2, "corpus_bytes": 1 << 18}
ENV = {"LIFELINE_COLLECTIVE_TIMEOUT_SECONDS": "20"}
SLOT_BYTES = 8 << 20
"""Arena slot of Lifeline's rows: a rank's shard is 1.1 MB; a replacement sidecar allocates (and
pre-faults) its slots before it serves, so the launcher's 64 MiB default would time page zeroing."""


def _doc(name: str, steps: int, persist_every: int, l2: str) -> dict:
    return {
        "apiVersion": "lifeline.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "replicas": 4, "layout": {"pipeline": 2, "data": 2}, "steps": steps, "seed": 0,
            "model": {"name": "gpt-moe", "args": dict(MODEL)},
            "template": {"spec": {"containers": [{"name": "trainer", "command": ["python", "-m", "lifeline", "trainer"],
                                                  "env": [{"name": k, "value": v} for k, v in ENV.items()]}]}},
            "checkpoint": {"every": 1, "peerReplicas": 1, "persist": {"every": persist_every, "uri": l2}},
            "recovery": {"maxRestarts": 1000, "hangTimeoutSeconds": 300},
        },
    }


def _events(log_dir: Path, pattern: str = "*-trainer.log") -> list[dict]:
    """Every JSON event line of every trainer log matching ``pattern`` (all ranks, all incarnations)."""
    from lifeline.runtime.events import read_events

    return read_events(sorted(log_dir.glob(pattern)))


def breakdown(rec: dict[str, Any], events: list[dict], world_size: int) -> dict[str, Any]:
    """Where one recovery's time went (see the module docstring): seconds since the failure.

    Args:
        rec: a ``RecoveryRecord.to_dict()`` with its ``timeline``.
        events: the trainers' event lines (:func:`_events`).
        world_size: ranks of the job.
    """
    tl = rec["timeline"]
    t0 = tl.get("failed_at", tl.get("noticed_at"))
    end = tl.get("caught_up_at", t0 + 3600)
    g, failed = rec["generation"], set(rec["ranks"])
    window = [e for e in events if t0 - 0.001 <= float(e.get("time", 0)) <= end + 0.001]

    def last(items) -> float | None:
        times = [float(e["time"]) for e in items]
        return round(max(times) - t0, 4) if times else None

    firsts: dict[int, float] = {}
    for e in window:
        if e.get("event") == "step" and e.get("generation") == g:
            firsts.setdefault(int(e["rank"]), float(e["time"]))
    points = {
        "noticed": tl.get("noticed_at"), "planned": tl.get("planned_at"), "published": tl.get("published_at"),
        "launched": tl.get("launched_at"),
    }
    out = {k: None if v is None else round(max(0.0, v - t0), 4) for k, v in points.items()}
    out["survivors_failed"] = last(e for e in window if e.get("event") == "failure" and e.get("generation") == g - 1
                                   and e.get("rank") not in failed)
    out["survivors_saw_plan"] = last(e for e in window if e.get("event") == "plan" and e.get("plan_generation") == g)
    out["replacement_init"] = last(e for e in window if e.get("event") == "init" and e.get("generation") == g)
    out["joined"] = last(e for e in window if e.get("event") == "join" and e.get("generation") == g)
    out["restored"] = last(e for e in window if e.get("event") == "restore" and e.get("generation") == g)
    out["first_step"] = round(max(firsts.values()) - t0, 4) if len(firsts) == world_size else None
    out["caught_up"] = rec.get("to_same_step_seconds")
    order = ["noticed", "survivors_failed", "planned", "published", "launched", "survivors_saw_plan",
             "replacement_init", "joined", "restored", "first_step", "caught_up"]
    joins = [e for e in window if e.get("event") == "join" and e.get("generation") == g]
    restores = [e for e in window if e.get("event") == "restore" and e.get("generation") == g]
    return {
        "breakdown": {k: out[k] for k in order},
        "join_seconds": {k: max((float(e.get(k, 0)) for e in joins), default=None)
                         for k in ("rendezvous", "barrier", "process_group", "connect")},
        "restore_seconds": max((float(e.get("seconds") or 0) for e in restores), default=None),
    }


def _lifeline(root: Path, steps: int, persist_every: int, fail_steps: tuple[int, int],
              spares: bool = True) -> dict[str, Any]:
    from lifeline.launch.inject import Injection
    from lifeline.launch.spec import load_for_launch
    from lifeline.launch.supervisor import LaunchOptions, Supervisor

    job = load_for_launch(_doc("bench-lifeline", steps, persist_every, f"file://{root / 'l2'}"))
    injections = (Injection("trainer", 1, fail_steps[0]), Injection("node", 2, fail_steps[1]))
    sup = Supervisor(job, LaunchOptions(state_dir=root / "lifeline", injections=injections, timeout_seconds=1200,
                                        spares_per_node=1 if spares else 0, warm_start=spares,
                                        slot_bytes=SLOT_BYTES, templates=spares))
    phase = sup.run()
    recs = sup.snapshot.recoveries
    step_s = sorted(v for v in sup.step_seconds.values() if v > 0)
    out = {"phase": phase, "step_seconds": step_s[len(step_s) // 2] if step_s else None}
    events = _events(root / "lifeline" / "logs")
    for name, rec in zip(("in_place_l0", "replace_l1"), recs):
        full = rec.to_dict()
        out[name] = {k: v for k, v in full.items() if k not in ("failures", "generation", "timeline")}
        out[name].update(breakdown(full, events, 4))
    return out


def _baseline(root: Path, steps: int, persist_every: int, fail_step: int) -> dict[str, Any]:
    """Kill one trainer, restart every rank from the latest DCP checkpoint in MinIO."""
    from lifeline.devcluster.services import MinioServer, RedisServer
    from lifeline.launch.env import Secrets, rank_processes
    from lifeline.launch.services import ensure_bucket
    from lifeline.launch.spec import load_for_launch
    from lifeline.api import RecoveryAction, RecoveryPlan
    from lifeline.catalog import Catalog

    name = "bench-dcp"
    job = load_for_launch(_doc(name, steps, persist_every, "s3://bench/unused"))
    redis = RedisServer(state_dir=root / "redis").start()
    minio = MinioServer(state_dir=root / "minio").start()
    procs: dict[int, subprocess.Popen] = {}
    try:
        ensure_bucket(minio.endpoint, minio.access_key, minio.secret_key, "s3://bench")
        catalog = Catalog(redis.url, name, 4)
        extra = {"LIFELINE_BENCH_DCP_URI": f"lminio://bench/{name}", "LIFELINE_S3_ENDPOINT": minio.endpoint,
                 "LIFELINE_S3_ACCESS_KEY": minio.access_key, "LIFELINE_S3_SECRET_KEY": minio.secret_key}

        def start(rank: int) -> subprocess.Popen:
            spec = rank_processes(job, rank, layout=job.spec.layout, generation=0, node=f"node-{rank}",
                                  pod_ip=f"127.0.0.{rank + 2}", arena_dir=root / f"unused-{rank}", redis_url=redis.url,
                                  secrets=Secrets("b" * 32), extra_env=extra)
            # the pod's own S3 variables (empty: no L2 in this job) must not hide the DCP store's
            env = {**spec.trainer.env, **extra, "LIFELINE_CHECKPOINT_EVERY": str(persist_every)}
            log = open(root / f"dcp-rank-{rank}.log", "ab")
            try:
                return subprocess.Popen([sys.executable, "-m", "lifeline.bench._dcp_trainer"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
            finally:
                log.close()

        def reports() -> dict[int, dict]:
            return {rank: r.to_dict() for rank, r in catalog.progress().items()}

        def wait(cond, timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not cond():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"baseline: timed out waiting for {what}")
                if any(p.poll() not in (None, 0) for r, p in procs.items() if r != 1 or not killed):
                    raise RuntimeError(f"baseline: a trainer failed; logs in {root}")
                time.sleep(0.02)

        killed = False
        procs = {r: start(r) for r in range(4)}
        wait(lambda: int(reports().get(1, {}).get("step") or 0) >= fail_step, 900, f"step {fail_step}")
        procs[1].send_signal(signal.SIGKILL)
        failed_at = time.time()
        killed = True
        from_step = max(int(r.get("step") or 0) for r in reports().values())
        for p in procs.values():  # restart the whole job: every rank goes down
            p.kill()
            p.wait()
        from lifeline.bench._dcp_s3 import register
        from lifeline.bench._dcp_trainer import DcpCheckpointer

        register(minio.endpoint, minio.access_key, minio.secret_key)
        restore = DcpCheckpointer(f"lminio://bench/{name}", 0).latest_step()
        catalog.put_plan(RecoveryPlan.restore_all(1, restore, job.spec.layout,
                                                  action=RecoveryAction.ROLLBACK, reason="restart every rank from DCP"))
        killed = False
        procs = {r: start(r) for r in range(4)}
        restarted_at = time.time()

        def caught_up() -> bool:
            rep = reports()
            return all(int(rep.get(r, {}).get("generation", -1)) >= 1 and rep[r].get("event") in ("step", "save", "done")
                       and int(rep[r].get("step") or 0) > from_step for r in range(4))

        wait(caught_up, 900, "the restarted job to pass the failed step")
        caught = time.time()
        events = _events(root, "dcp-rank-*.log")
        rec = {"generation": 1, "ranks": [], "to_same_step_seconds": round(caught - failed_at, 3),
               "timeline": {"failed_at": failed_at, "launched_at": restarted_at, "caught_up_at": caught}}
        detail = breakdown(rec, events, 4)
        kept = ("launched", "replacement_init", "joined", "restored", "first_step", "caught_up")
        detail["breakdown"] = {k: v for k, v in detail["breakdown"].items() if k in kept}
        return {"from_step": from_step, "restore_step": restore,
                "steps_lost": None if restore is None else from_step - restore,
                "to_same_step_seconds": round(caught - failed_at, 3), "tier": "DCP in MinIO", **detail}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        minio.stop()
        redis.stop()


def _ettr(root: Path, duration: float, mtbf: float, step_seconds: float, persist_every: int,
          seed: int) -> dict[str, Any]:
    from lifeline.launch.inject import Injection
    from lifeline.launch.spec import load_for_launch
    from lifeline.launch.summary import summarize
    from lifeline.launch.supervisor import LaunchOptions, Supervisor

    steps = max(20, int(duration / step_seconds))
    rng = random.Random(seed)
    injections, t, kinds = [], 0.0, ("trainer", "node")
    while True:
        t += rng.expovariate(1.0 / mtbf)
        step = int(t / step_seconds)
        if step >= steps - 2:
            break
        if injections and step <= injections[-1].step + 2:
            step = injections[-1].step + 3  # one failure at a time: the next after training resumed
        injections.append(Injection(kinds[len(injections) % 2], rng.randrange(4), step))
    job = load_for_launch(_doc("bench-ettr", steps, persist_every, f"file://{root / 'l2-ettr'}"))
    # a lost node stays lost: one free node per node failure (and one more), so none needs a reshard;
    # spares warm in the background once training runs (no warm start: start-up counts against ETTR)
    nodes = sum(i.kind == "node" for i in injections) + 1
    sup = Supervisor(job, LaunchOptions(state_dir=root / "ettr", injections=tuple(injections), spare_nodes=nodes,
                                        slot_bytes=SLOT_BYTES, timeout_seconds=max(1200.0, 20 * duration),
                                        templates=False))  # a container starts fresh: so does every rank here
    t0 = time.monotonic()
    phase = sup.run()
    wall = time.monotonic() - t0
    s = summarize(sup, phase=phase, wall_seconds=wall, digest=None)
    startup = (sup.first_step_at - sup.snapshot.started_at) if sup.first_step_at else 0.0
    steady = None
    if s["step_seconds"] and wall - startup > 0:
        steady = round(min(1.0, s["step"] * s["step_seconds"] / (wall - startup)), 4)
    return {"phase": phase, "duration_target_seconds": duration, "mtbf_seconds": mtbf, "steps": steps,
            "failures_injected": [str(i) for i in injections], "recoveries": len(s["recoveries"]),
            "wall_seconds": s["wall_seconds"], "startup_seconds": round(startup, 3), "step_seconds": s["step_seconds"],
            "recovery_seconds": s["recovery_seconds"], "ettr": s["ettr"], "ettr_after_startup": steady,
            "to_same_step_seconds": [r["to_same_step_seconds"] for r in s["recoveries"]],
            "spares_used": sum(r.get("spares", 0) for r in s["recoveries"])}


def run(*, steps: int = 40, persist_every: int = 10, fail_step: int = 15, duration: float = 120.0,
        mtbf: float = 30.0, ettr: bool = True, workdir: str | None = None, seed: int = 0,
        cold: bool = True) -> dict[str, Any]:
    """Run the benchmark; returns one JSON-ready dict (rows in the module docstring, plus ratios).

    Args:
        steps: steps of the recovery runs (failures at ``fail_step`` and ``fail_step + 4``).
        persist_every: L2 / DCP checkpoint interval in steps.
        duration, mtbf: the ETTR run's target training seconds and mean time between failures.
        ettr: also run the ETTR row.
        workdir: directory for state and logs (default: a new temp dir, kept for inspection).
        cold: also run Lifeline's rows without spares (``cold``: every restarted container is a
            fresh process), to show what the spares buy.
    """
    root = Path(workdir or tempfile.mkdtemp(prefix="lifeline-bench-recovery-"))
    root.mkdir(parents=True, exist_ok=True)
    ours = _lifeline(root / "lifeline", steps, persist_every, (fail_step, fail_step + 4))
    base = _baseline(root / "dcp", steps, persist_every, fail_step)
    out: dict[str, Any] = {
        "bench": "recovery", "layout": {"pipeline": 2, "data": 2}, "model": MODEL, "steps": steps,
        "persist_every": persist_every, "step_seconds": ours["step_seconds"],
        "in_place_l0": ours.get("in_place_l0"), "replace_l1": ours.get("replace_l1"), "dcp_restart_all": base,
    }
    if cold:
        slow = _lifeline(root / "cold", steps, persist_every, (fail_step, fail_step + 4), spares=False)
        out["cold"] = {name: {k: slow[name].get(k) for k in ("to_same_step_seconds", "steps_lost", "detect_seconds",
                                                            "breakdown")} for name in ("in_place_l0", "replace_l1")
                       if slow.get(name)}
    b = base["to_same_step_seconds"]
    for name in ("in_place_l0", "replace_l1"):
        row = out[name]
        if row and row.get("to_same_step_seconds"):
            out[f"speedup_{name}_vs_dcp"] = round(b / row["to_same_step_seconds"], 2)
        slow_row = out.get("cold", {}).get(name)
        if slow_row and slow_row.get("to_same_step_seconds"):
            out[f"speedup_{name}_cold_vs_dcp"] = round(b / slow_row["to_same_step_seconds"], 2)
    if ettr and ours["step_seconds"]:
        out["ettr"] = _ettr(root / "ettr", duration, mtbf, ours["step_seconds"], max(persist_every, 50), seed)
    out["workdir"] = str(root)
    return out
