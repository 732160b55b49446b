"""``lifeline run``'s node health check before the first placement (docs/health.md).

One check process per node (``python -m lifeline.runtime.health``), all started together with the
node's loopback address for the collective part and a lock file so that their compute checks take
turns on this machine's shared cores. Their reports are judged together
(:func:`lifeline.control.health.judge`); the supervisor marks a failed node unschedulable, so no pod
of the job, first or replacement, and no spare is ever put there.

A lost node that comes back (``--node-return-seconds``) is checked again before it is Ready
(:class:`Rejoins`).

``--unhealthy-node NODE:KIND[:rejoin]`` (``KIND`` one of ``compute``, ``slow``, ``network``) sets the
node's check fault (:data:`HEALTH_FAULT_ENV`; see :mod:`lifeline.runtime.health`), in its first check
or, with ``:rejoin``, in the check when it comes back.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lifeline.api import HealthCheckSpec
from lifeline.control import NodeState
from lifeline.control.health import Baseline, NodeCheck, baseline, judge, judge_against, pairs
from lifeline.errors import ConfigError
from lifeline.launch.env import LOCAL_ENV, node_ip

__all__ = ["HEALTH_FAULT_ENV", "HEALTH_FAULTS", "CheckRun", "parse_unhealthy", "check_nodes", "Rejoins", "NodeHealth"]

HEALTH_FAULT_ENV = "LIFELINE_FAULT_HEALTH"
"""A node's injected health fault (same name in :mod:`lifeline.runtime.health`)."""
HEALTH_FAULTS = ("compute", "slow", "network")


def parse_unhealthy(texts: Sequence[str], nodes: Sequence[str]) -> dict[str, str]:
    """``["node-1:compute", "node-2:slow:rejoin", ...]`` → ``{node: "compute" | "slow:rejoin" ...}``
    (``:rejoin``: the node passes its first check and fails the one when it comes back after a loss).

    Raises:
        ConfigError: field ``--unhealthy-node``: an unknown node, kind or suffix, or a node named twice.
    """
    out: dict[str, str] = {}
    for text in texts:
        node, _, rest = text.partition(":")
        kind, _, when = rest.partition(":")
        fix = (f"write NODE:KIND[:rejoin] with NODE one of {', '.join(nodes)} and KIND one of "
               f"{', '.join(HEALTH_FAULTS)}")
        if node not in nodes or kind not in HEALTH_FAULTS or when not in ("", "rejoin"):
            raise ConfigError(f"--unhealthy-node {text!r}: unknown node, kind or suffix; {fix}",
                              field="--unhealthy-node")
        if node in out:
            raise ConfigError(f"--unhealthy-node {text!r}: {node} is named twice; {fix}", field="--unhealthy-node")
        out[node] = rest
    return out


def _faults(unhealthy: Mapping[str, str], *, rejoin: bool) -> dict[str, str]:
    """The check faults of the first check (``rejoin=False``) or of a rejoin check."""
    return {n: f.split(":")[0] for n, f in unhealthy.items() if f.endswith(":rejoin") == rejoin}


def _free_port(host: str) -> int:
    """A port on ``host`` free a moment ago (the dev cluster's ``free_port`` is out of this part's
    reach: launch may not load ``lifeline.devcluster``, which loads the Kubernetes client)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class CheckRun:
    """The check processes of ``nodes``, started at once (non-blocking): :meth:`poll` in later rounds.

    ``nodes`` are ``node-<i>`` names (their loopback addresses come from :func:`node_ip`); ``faults``
    maps a node to its :data:`HEALTH_FAULT_ENV` value. Reports and logs go to ``work_dir``. A check
    that exits non-zero or does not report within ``timeout`` seconds fails its node (its log's last
    line is the reason).
    """

    def __init__(self, nodes: Sequence[str], work_dir: Path, *, faults: Mapping[str, str] | None = None,
                 timeout: float = 180.0) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.nodes, self.work_dir = list(nodes), work_dir
        self.deadline = time.monotonic() + timeout
        index = {n: i for i, n in enumerate(nodes)}
        order = ",".join(f"{index[a]}:{index[b]}" for a, b in pairs(self.nodes))
        host = node_ip(int(nodes[0].rsplit("-", 1)[1]))
        master = f"{host}:{_free_port(host)}"
        self.procs: dict[str, subprocess.Popen] = {}
        for i, node in enumerate(nodes):
            env = {**os.environ, **LOCAL_ENV, HEALTH_FAULT_ENV: (faults or {}).get(node, "")}
            with open(work_dir / f"{node}.log", "w") as out:
                self.procs[node] = subprocess.Popen(
                    [sys.executable, "-m", "lifeline.runtime.health", "--index", str(i), "--nodes", ",".join(nodes),
                     "--pairs", order, "--master", master, "--out", str(work_dir / f"{node}.json"),
                     "--exclusive", str(work_dir / "compute.lock")],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def poll(self) -> dict[str, NodeCheck] | None:
        """Every node's report once all checks ended (or the deadline passed: the rest are killed);
        ``None`` while some still run."""
        late = time.monotonic() > self.deadline
        if not late and any(p.poll() is None for p in self.procs.values()):
            return None
        reports = {}
        for node, proc in self.procs.items():
            if proc.poll() is None:
                proc.kill()
            code = proc.wait()
            path = self.work_dir / f"{node}.json"
            if code == 0 and path.exists():
                doc = json.loads(path.read_text())
                reports[node] = NodeCheck(doc["digest"], float(doc["compute_seconds"]),
                                          {k: float(v) for k, v in doc["pair_bandwidth"].items()})
            else:
                tail = (self.work_dir / f"{node}.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
                reports[node] = NodeCheck(error=f"{'timed out' if late else f'exit {code}'}: {tail[0][:200]}")
        return reports

    def wait(self) -> dict[str, NodeCheck]:
        """:meth:`poll` until every report is in."""
        while (reports := self.poll()) is None:
            time.sleep(0.05)
        return reports


def check_nodes(nodes: Sequence[str], work_dir: Path, *, threshold: float, faults: Mapping[str, str] | None = None,
                timeout: float = 180.0) -> tuple[dict[str, NodeCheck], dict[str, str]]:
    """Run every node's check and judge them together: ``(reports by node, {failed node: reason})``
    (see :class:`CheckRun`)."""
    reports = CheckRun(nodes, work_dir, faults=_faults(faults or {}, rejoin=False), timeout=timeout).wait()
    return reports, judge(reports, threshold=threshold)


class Rejoins:
    """Checks of lost nodes that come back, before the job uses them again (docs/health.md).

    A returning node runs the check with up to two nodes that passed and is judged against the first
    check's :class:`~lifeline.control.health.Baseline` (:func:`~lifeline.control.health.judge_against`),
    its link within the ring the three form (:meth:`finished`).
    """

    def __init__(self, work_dir: Path, base: Baseline, *, threshold: float, faults: Mapping[str, str]) -> None:
        self.work_dir, self.base, self.threshold = work_dir, base, threshold
        self.faults = _faults(faults, rejoin=True)
        self.running: dict[str, CheckRun] = {}
        self.count = 0

    def start(self, node: str, partners: Sequence[str]) -> None:
        """Start ``node``'s check with up to two ``partners`` that passed (none: compute only)."""
        self.count += 1
        self.running[node] = CheckRun([node, *partners[:2]], self.work_dir / f"rejoin-{self.count}-{node}",
                                      faults={node: self.faults.get(node, "")})

    def finished(self) -> dict[str, str | None]:
        """``{node: reason it failed, or None: it passed}`` of the checks that ended since the last call.

        With two partners the three nodes form a ring: the link is judged as in the first check
        (:func:`~lifeline.control.health.judge`: the partners' own pair is measured under the same
        load); with one, against the baseline's median pair."""
        done: dict[str, str | None] = {}
        for node, run in list(self.running.items()):
            reports = run.poll()
            if reports is None:
                continue
            del self.running[node]
            ring = len(reports) >= 3
            reason = judge_against(reports[node], self.base, threshold=self.threshold, network=not ring)
            if reason is None and ring:
                reason = judge(reports, threshold=self.threshold).get(node)
            done[node] = reason
        return done


class NodeHealth:
    """A run's node health checks (``spec.recovery.healthCheck``): the first one before the first
    placement, and one for each lost node that comes back. Failed nodes are marked unschedulable in
    ``nodes`` (shared with the supervisor: no pod or spare goes there); every decision is an event.

    Attributes:
        summary: the run summary's ``health`` (``None`` when the check is off): ``seconds``,
            ``failed`` ``{node: reason}``, ``compute_ms`` by node, ``rejoins`` ``{node: "passed" | reason}``.
    """

    def __init__(self, spec: HealthCheckSpec, nodes: MutableMapping[str, NodeState], work_dir: Path, *,
                 faults: Mapping[str, str], event: Callable[[str], None]) -> None:
        self.spec, self.nodes, self.work_dir, self.faults, self.event = spec, nodes, work_dir, faults, event
        self.summary: dict[str, Any] | None = None
        self.rejoins: Rejoins | None = None

    def check_all(self) -> None:
        """The first check of every node (blocking; seconds: one torch import per node)."""
        if not self.spec.enabled:
            return
        t0 = time.monotonic()
        order = sorted(self.nodes, key=lambda n: int(n.rsplit("-", 1)[1]))
        reports, failed = check_nodes(order, self.work_dir, threshold=self.spec.threshold, faults=self.faults)
        for node, reason in sorted(failed.items()):
            self.nodes[node] = replace(self.nodes[node], schedulable=False)
            self.event(f"{node} failed its health check and is not used: {reason}")
        self.summary = {"seconds": round(time.monotonic() - t0, 3), "failed": dict(sorted(failed.items())),
                        "compute_ms": {n: round(r.compute_seconds * 1e3, 3) for n, r in reports.items()
                                       if r.error is None}, "rejoins": {}}
        self.event(f"health check of {len(order)} nodes: {len(order) - len(failed)} passed "
                   f"({self.summary['seconds']:.1f}s)")
        base = baseline(reports, failed)
        if base is not None:
            self.rejoins = Rejoins(self.work_dir, base, threshold=self.spec.threshold, faults=self.faults)

    def back(self, node: str) -> bool:
        """``node`` came back after a loss: start its check and keep it not Ready (``True``), or
        ``False`` when the run checks no node (it is Ready now)."""
        if self.rejoins is None:
            return False
        self.nodes[node] = replace(self.nodes[node], ready=False)
        partners = [n for n, st in sorted(self.nodes.items()) if n != node and st.ready and st.schedulable]
        self.rejoins.start(node, partners)
        self.event(f"{node} is back: checking its health before it is used")
        return True

    def finish(self, timeout: float = 60.0) -> None:
        """Wait up to ``timeout`` seconds for the rejoin checks still running and record their
        verdicts (the run ended; a check past the time is killed and fails its node)."""
        deadline = time.monotonic() + timeout
        while self.rejoins is not None and self.rejoins.running and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.05)
        if self.rejoins is not None:
            for run in self.rejoins.running.values():
                run.deadline = 0.0  # poll() kills what still runs
            self.tick()

    def tick(self) -> None:
        """Act on the rejoin checks that ended: Ready again, or Ready but unschedulable."""
        if self.rejoins is None or self.summary is None:
            return
        for node, reason in sorted(self.rejoins.finished().items()):
            self.summary["rejoins"][node] = reason or "passed"
            if reason is None:
                self.nodes[node] = replace(self.nodes[node], ready=True)
                self.event(f"{node} passed its health check and is Ready again")
            else:
                self.nodes[node] = replace(self.nodes[node], ready=True, schedulable=False)
                self.event(f"{node} failed its health check and is not used: {reason}")
