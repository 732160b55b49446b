"""One pod on a process node: its sandbox directory, container processes, probes and status.

A :class:`PodWorker` thread owns one pod (by UID). It materialises volumes, gets a
ServiceAccount token bound to the pod through the TokenRequest API (exported to the
containers as ``KUBECONFIG``), runs init containers to completion and then every
container as a local process group, restarts containers per ``restartPolicy`` with an
exponential back-off, runs readiness/liveness probes, and patches the full pod status
whenever it changes. On graceful deletion it sends SIGTERM, waits the grace period,
sends SIGKILL, then deletes the pod with grace 0 and a UID precondition.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
import traceback

from kubernetes.client.exceptions import ApiException

from lifeline.devcluster import _proc
from lifeline.devcluster._identity import ProcessRef
from lifeline.devcluster.node._common import NodeHost, describe, now_rfc3339
from lifeline.devcluster.node._container import Container
from lifeline.devcluster.node._sandbox import PodSandbox
from lifeline.devcluster.node.probes import run_probe

__all__ = ["PodWorker", "now_rfc3339"]


class PodWorker(threading.Thread):
    """Runs one pod until it is deleted (see module docstring).

    Args:
        agent: the node it runs on (its agent; see :class:`NodeHost`).
        pod: the pod object as the API returned it (a dict, camelCase keys).
    """

    def __init__(self, agent: NodeHost, pod: dict) -> None:
        super().__init__(name=f"pod-{pod['metadata']['namespace']}/{pod['metadata']['name']}", daemon=True)
        self.agent = agent
        self.pod = pod
        md = pod["metadata"]
        self.ns, self.pod_name, self.uid = md["namespace"], md["name"], md["uid"]
        self.sandbox = PodSandbox(agent, namespace=self.ns, name=self.pod_name, uid=self.uid)
        self.dir = self.sandbox.dir
        self._ev_delete = threading.Event()
        self._ev_shutdown = threading.Event()
        self._ev_wake = threading.Event()
        self.grace = 30.0
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.inits = [Container(c, True, self.dir) for c in spec.get("initContainers") or []]
        self.containers = [Container(c, False, self.dir) for c in spec.get("containers") or []]
        st = pod.get("status") or {}
        self.pod_ip = st.get("podIP") or ("" if md.get("deletionTimestamp") else agent.allocate_ip())
        self.start_time = st.get("startTime") or now_rfc3339()
        prev = {c["name"]: c.get("restartCount", 0) for c in st.get("containerStatuses") or []}
        for c in self.containers:
            c.restart_count = prev.get(c.name, 0)
        self.phase = "Pending"
        self.initialized = not self.inits
        self.conditions: dict[str, dict] = {}
        self._last_patch: str | None = None
        self._setup_error: str | None = None

    # ----------------------------------------------------------------- control (agent thread)
    def request_delete(self, grace: float) -> None:
        """Begin graceful deletion with ``grace`` seconds between SIGTERM and SIGKILL."""
        self.grace = max(0.0, float(grace))
        self._ev_delete.set()
        self._ev_wake.set()

    def shutdown(self) -> None:
        """Stop the pod's processes without touching the API object (node going down)."""
        self.grace = min(self.grace, 5.0)
        self._ev_shutdown.set()
        self._ev_wake.set()

    def update(self, pod: dict) -> None:
        """Take a newer version of the pod object from the watch."""
        self.pod = {**pod, "status": self.pod.get("status")}

    # ----------------------------------------------------------------- main loop
    def run(self) -> None:
        """Thread body: set the pod up, run its containers until deletion or shutdown, stop them; never raises."""
        try:
            self._run()
        except Exception:  # noqa: BLE001 - a worker must never die silently
            self.agent.log(f"pod {self.ns}/{self.pod_name} worker crashed:\n{traceback.format_exc()}")
            self._kill_all(0)

    def _run(self) -> None:
        attempt = 0
        while not self._ev_delete.is_set() and not self._setup():
            # the Node authorizer learns of a new pod asynchronously: its first token or
            # secret reads may be refused for a moment, so retry quickly, then back off
            attempt += 1
            if self._pause(min(0.25 * attempt, 2.0)):
                break
        while not (self._ev_delete.is_set() or self._ev_shutdown.is_set()):
            if self._setup_error is None:
                self._tick()
            self._patch_status()
            self._pause(0.2)
        self._kill_all(self.grace)
        if self._ev_delete.is_set():
            self._finalise_deletion()

    def _pause(self, seconds: float) -> bool:
        self._ev_wake.wait(seconds)
        self._ev_wake.clear()
        return self._ev_delete.is_set() or self._ev_shutdown.is_set()

    # ----------------------------------------------------------------- setup
    def _setup(self) -> bool:
        try:
            self.sandbox.prepare(self.pod, self._status_pod(), self.pod_ip, self.inits + self.containers)
            self._setup_error = None
            return True
        except Exception as err:  # noqa: BLE001 - reported in the pod's status, retried
            msg = describe(err)
            if msg != self._setup_error:
                self.agent.log(f"pod {self.ns}/{self.pod_name}: setup failed: {msg}")
            self._setup_error = msg
            for c in self.inits + self.containers:
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": msg}}
            self._patch_status()
            return False

    def _status_pod(self) -> dict:
        """The pod object with this node's view of status fields (podIP, hostIP) filled in."""
        st = dict(self.pod.get("status") or {})
        st.update(podIP=self.pod_ip, podIPs=[{"ip": self.pod_ip}], hostIP=self.agent.host_ip,
                  hostIPs=[{"ip": self.agent.host_ip}])
        return {**self.pod, "status": st}

    # ----------------------------------------------------------------- containers
    def _tick(self) -> None:
        now = time.monotonic()
        if self.sandbox.token_due(now):
            try:
                self.sandbox.write_kubeconfig(self.pod)
            except Exception as err:  # noqa: BLE001 - retried next tick
                self.agent.log(f"pod {self.ns}/{self.pod_name}: token refresh failed: {err}")
        if not self.initialized:
            self._tick_inits(now)
            return
        for c in self.containers:
            self._tick_container(c, now)
        self._update_phase()

    def _tick_inits(self, now: float) -> None:
        for c in self.inits:
            if c.done:
                continue
            if c.proc is None:
                if now >= c.next_start:
                    c.start()
                return
            code = c.proc.poll()
            if code is None:
                return
            c.record_exit(code)
            if code == 0:
                c.done = True
                continue
            if self.restart_policy == "Never":
                c.done = True
                self.phase = "Failed"
                return
            c.schedule_restart(now)
            return
        self.initialized = True

    def _tick_container(self, c: Container, now: float) -> None:
        if c.done:
            return
        if c.proc is None:
            if now >= c.next_start:
                c.start()
            return
        code = c.proc.poll()
        if code is None:
            # a startup probe gates the others; a failed startup or liveness probe kills the run
            probers = [(c.startup, True, "startup")] if not c.started_ok else \
                [(c.readiness, False, "readiness"), (c.liveness, True, "liveness")]
            for prober, fatal, kind in probers:
                if prober and prober.due(now):
                    ok = run_probe(prober.probe, pod_ip=self.pod_ip, container=c.spec, env=c.env, cwd=c.cwd)
                    prober.record(ok, now)
                    if fatal and prober.result is False:
                        self.agent.log(f"pod {self.ns}/{self.pod_name}: container {c.name} failed {kind} probe")
                        _proc.stop_group(c.proc.pid, grace=float(self.pod["spec"].get(
                            "terminationGracePeriodSeconds", 30)), proc=c.proc)
                        return
            return
        c.record_exit(code)
        if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0):
            c.schedule_restart(now)
        else:
            c.done = True

    def _update_phase(self) -> None:
        if self.phase == "Failed":
            return
        if all(c.done for c in self.containers) and self.containers:
            codes = [c.state.get("terminated", {}).get("exitCode", 1) for c in self.containers]
            self.phase = "Succeeded" if all(x == 0 for x in codes) else "Failed"
        elif any(c.running or c.restart_count or c.done for c in self.containers):
            self.phase = "Running"

    # ----------------------------------------------------------------- termination
    def _kill_all(self, grace: float) -> None:
        live = [c for c in self.inits + self.containers if c.proc is not None]
        for c in live:
            _proc.kill_group(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c.proc.poll() is None for c in live):
            time.sleep(0.05)
        for c in live:
            if c.proc.poll() is None:
                _proc.kill_group(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
            c.record_exit(c.proc.returncode)
            c.done = True
        for f in (self.dir / "containers").glob("*.pid"):  # leftovers from a killed previous agent
            try:
                _proc.kill_group(ProcessRef.parse(f.read_text()), signal.SIGKILL)  # a stranger by now is spared
            except (OSError, ValueError):
                pass
            f.unlink(missing_ok=True)

    def _finalise_deletion(self) -> None:
        shutil.rmtree(self.sandbox.shm, ignore_errors=True)
        try:
            self.agent.core.delete_namespaced_pod(
                self.pod_name, self.ns,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except ApiException as err:
            if err.status not in (404, 409):
                self.agent.log(f"pod {self.ns}/{self.pod_name}: final delete failed: {err.status} {err.reason}")

    # ----------------------------------------------------------------- status
    def _condition(self, kind: str, ok: bool, reason: str | None = None) -> dict:
        status = "True" if ok else "False"
        old = self.conditions.get(kind)
        if old is None or old["status"] != status or old["reason"] != (None if ok else reason):
            old = {"type": kind, "status": status, "lastProbeTime": None,
                   "lastTransitionTime": old["lastTransitionTime"] if old and old["status"] == status
                   else now_rfc3339(), "reason": None if ok else reason}
            self.conditions[kind] = old
        return old

    def _patch_status(self) -> None:
        ready_containers = bool(self.containers) and all(c.ready for c in self.containers)
        terminal = self.phase in ("Succeeded", "Failed")
        conds = [
            self._condition("PodReadyToStartContainers", self._setup_error is None),
            self._condition("Initialized", self.initialized, "ContainersNotInitialized"),
            self._condition("ContainersReady", ready_containers and not terminal,
                            "PodCompleted" if terminal else "ContainersNotReady"),
            self._condition("Ready", ready_containers and not terminal,
                            "PodCompleted" if terminal else "ContainersNotReady"),
        ]
        status = {
            "phase": self.phase, "conditions": conds, "hostIP": self.agent.host_ip,
            "hostIPs": [{"ip": self.agent.host_ip}], "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.inits:
            status["initContainerStatuses"] = [c.status() for c in self.inits]
        blob = json.dumps(status, sort_keys=True)
        if blob == self._last_patch:
            return
        try:
            self.agent.core.patch_namespaced_pod_status(self.pod_name, self.ns, {"status": status})
            self._last_patch = blob
        except ApiException as err:
            if err.status == 404:
                self._ev_shutdown.set()  # the pod is gone: stop its processes
            else:
                self.agent.log(f"pod {self.ns}/{self.pod_name}: status patch failed: {err.status} {err.reason}")
        except Exception as err:  # noqa: BLE001 - API briefly unreachable: retried next tick
            self.agent.log(f"pod {self.ns}/{self.pod_name}: status patch failed: {err}")
