"""The local "pods" of a run and their pre-warmed spares: what ``lifeline run`` starts and stops."""

from __future__ import annotations

import hashlib

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from lifeline.api import LayoutSpec, TrainingJob
from lifeline.api.pod import default_arena_dir
from lifeline.control import NodeState
from lifeline.errors import ClusterError
from lifeline.launch._holds import hold_dir, hold_env
from lifeline.launch._poison import nan_env
from lifeline.launch._pods import Pod, stop_all
from lifeline.launch._records import LaunchOptions
from lifeline.launch._slow import slow_env
from lifeline.launch.env import RankProcesses, Secrets, node_ip, rank_processes
from lifeline.launch.services import Services
from lifeline.launch.spare_pool import Spare, SparePool, spare_env, wanted_spares
from lifeline.launch.templates import await_ready

__all__ = ["Fleet"]


class Fleet:
    """The pods of one local run, the local nodes they run on, and the spare pool.

    Args:
        job: the TrainingJob.
        options: the run's :class:`LaunchOptions` (slot size, spares, extra environment).
        services: the started Redis and L2 store.
        secrets: the job's HMAC key and S3 credentials.
        nodes: the local nodes by name (one per rank plus the spare nodes).
        log_dir: where every process logs.
    """

    def __init__(self, job: TrainingJob, options: LaunchOptions, services: Services, secrets: Secrets,
                 nodes: dict[str, NodeState], log_dir: Path) -> None:
        self.job, self.options, self.services, self.secrets = job, options, services, secrets
        self.nodes = nodes
        self.log_dir = log_dir
        self.pods: dict[int, Pod] = {}
        first = self.rank_spec(0, "node-0", layout=job.spec.layout, generation=0)
        self.pool = SparePool({"trainer": spare_env(first.trainer), "sidecar": spare_env(first.sidecar)}, log_dir,
                              templates=options.templates)
        self.pool.start_templates()

    @property
    def name(self) -> str:
        return self.job.name or ""

    def rank_spec(self, rank: int, node: str, *, layout: LayoutSpec, generation: int) -> RankProcesses:
        """The processes of ``rank`` on ``node``: the operator's pod, resolved (:func:`rank_processes`)."""
        index = int(node.rsplit("-", 1)[1])
        s = self.services
        env = {"LIFELINE_SLOT_BYTES": str(self.options.slot_bytes), **self.options.extra_env}
        if s.persist_uri and self.job.spec.checkpoint.persist is not None:
            # the trainer reads L2 itself only to reshard a checkpoint of another layout
            env["LIFELINE_PERSIST_URI"] = s.persist_uri
            if s.s3_endpoint:
                env.update(LIFELINE_S3_ENDPOINT=s.s3_endpoint, LIFELINE_S3_ACCESS_KEY=s.s3_access_key,
                           LIFELINE_S3_SECRET_KEY=s.s3_secret_key)
        # deterministic injection: the trainer holds at its faults' steps until they fired
        env.update(hold_env(self.options.injections, rank, self.options.state_dir.resolve()))
        # a ``nan`` fault: the trainer poisons its own batch (lifeline.launch._poison)
        env.update(nan_env(self.options.injections, rank, self.options.state_dir.resolve()))
        env.update(slow_env(self.options.injections, rank, node))  # a ``slow`` node (lifeline.launch._slow)
        # one per run (its state directory): two runs of the same job name on one machine never share one;
        # the name is cut so that the sidecar's socket path stays under the 108 bytes of AF_UNIX
        run = hashlib.sha1(str(self.options.state_dir.resolve()).encode()).hexdigest()[:8]
        arena = default_arena_dir(self.name, rank).with_name(f"lifeline-{self.name[:40]}-{rank}-{node}-{run}")
        return rank_processes(
            self.job, rank, layout=layout, generation=generation, node=node, pod_ip=node_ip(index),
            arena_dir=arena, redis_url=s.redis_url, secrets=self.secrets, persist_uri=s.persist_uri,
            s3_endpoint=s.s3_endpoint, extra_env=env)

    def hold_dir(self, rank: int) -> Path:
        """Where ``rank``'s trainer holds at a fault's step and is released (:mod:`lifeline.launch._holds`)."""
        return hold_dir(self.options.state_dir.resolve(), rank)

    def create_pod(self, rank: int, node: str, *, layout: LayoutSpec, generation: int, spares: bool = True) -> Pod:
        """Start ``rank``'s sidecar and trainer on ``node`` (from spares when ``spares`` and one waits;
        else forked from the role's template when one is ready, else fresh processes)."""
        pod = Pod(self.rank_spec(rank, node, layout=layout, generation=generation), generation, self.log_dir)
        sidecar = self.spare(node, "sidecar") if spares else None
        pod.start_sidecar(sidecar or self.pool.fresh(node, "sidecar"))
        trainer = self.spare(node, "trainer") if spares else None
        pod.start_trainer(trainer or self.pool.fresh(node, "trainer"), pooled=trainer is not None)
        self.pods[rank] = pod
        return pod

    def spare(self, node: str, role: str) -> Spare | None:
        """A waiting spare of ``role`` on ``node``, taken out of the pool, or ``None``."""
        return self.pool.take(node, role)

    def restart_trainer(self, pod: Pod) -> None:
        """Start ``pod``'s trainer again: in its node's waiting spare, else forked from the template
        (when ready), else a fresh process."""
        spare = self.spare(pod.node, "trainer")
        pod.start_trainer(spare or self.pool.fresh(pod.node, "trainer"), pooled=spare is not None)

    def await_templates(self, timeout: float = 300.0) -> None:
        """Wait until the templates finished their imports (or failed: fresh processes then), so
        the first ranks fork from them. Never raises: after ``timeout`` seconds the ranks start fresh."""
        try:
            await_ready(self.pool.templates.values(), timeout)
        except ClusterError:
            pass

    def wanted(self, node_of_rank: Mapping[int, str], cool_downs: Mapping[str, float]) -> list[tuple[str, str, int]]:
        """The spares to keep (:func:`lifeline.launch.spare_pool.wanted_spares`)."""
        return wanted_spares(node_of_rank, self.nodes, cool_downs, per_node=self.options.spares_per_node,
                             standby_nodes=self.options.standby_nodes, now=time.time())

    def warm(self, node_of_rank: Mapping[int, str]) -> None:
        """Start every spare the first placement ``node_of_rank`` wants and wait until all are ready
        (``warm_start``)."""
        self.pool.warm_all(self.wanted(node_of_rank, {}))

    def refill(self, cool_downs: Mapping[str, float]) -> None:
        """Start at most one missing spare."""
        self.pool.fill(self.wanted({r: p.node for r, p in self.pods.items()}, cool_downs))

    def processes(self) -> list:
        """Every rank process object (for waking a round when one exits)."""
        return [p for pod in self.pods.values() for p in (pod.trainer, pod.sidecar)]

    def write_pids(self, path: Path) -> None:
        """Write ``processes.json``: the launcher's, the services' and every rank's and spare's pid."""
        doc = {"launcher": os.getpid(), **{f"{k}": v for k, v in self.services.pids().items()},
               "ranks": {str(r): p.pids() for r, p in self.pods.items()}, "spares": self.pool.pids(),
               "templates": self.pool.template_pids()}
        path.write_text(json.dumps(doc, indent=1))

    def stop_pods(self) -> None:
        """Stop every rank's processes and forget the pods."""
        stop_all(list(self.pods.values()))
        self.pods.clear()

    def close(self) -> None:
        """Stop every spare and every pod (idempotent)."""
        self.pool.close()
        self.stop_pods()
