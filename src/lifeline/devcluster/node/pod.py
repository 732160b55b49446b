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

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from lifeline.devcluster import _proc
from lifeline.devcluster.node.probes import Prober, resolve_argv, run_probe
from lifeline.devcluster.node.volumes import container_env, expand, materialise_volumes, secret_or_none
from lifeline.devcluster.pki import write_kubeconfig
from lifeline.errors import ClusterError

if TYPE_CHECKING:
    from lifeline.devcluster.node.agent import NodeAgent

__all__ = ["PodWorker", "now_rfc3339"]

_BACKOFF_START, _BACKOFF_MAX, _BACKOFF_RESET = 1.0, 20.0, 60.0
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "TMPDIR", "TZ")


def now_rfc3339() -> str:
    """Current UTC time as an RFC 3339 string with seconds precision (Kubernetes ``Time``)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(err: Exception) -> str:
    """One line for an error: an API refusal's status and message, else the exception text."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, ApiException):
        try:
            return f"API {err.status}: {json.loads(err.body)['message']}"
        except (TypeError, ValueError, KeyError):
            return f"API {err.status} {err.reason}"
    return str(err) if isinstance(err, ClusterError) else f"{type(err).__name__}: {err}"


class _Container:
    """Runtime state of one container (spec + current process + history)."""

    def __init__(self, spec: dict, init: bool) -> None:
        self.spec, self.name, self.init = spec, spec["name"], init
        self.proc: subprocess.Popen | None = None
        self.started_at: str | None = None
        self.started_mono = 0.0
        self.restart_count = 0
        self.last_state: dict = {}
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.backoff = _BACKOFF_START
        self.next_start = 0.0
        self.readiness: Prober | None = None
        self.liveness: Prober | None = None
        self.startup: Prober | None = None
        self.env: dict[str, str] = {}
        self.cwd = "/"
        self.done = False  # terminated for good (no restart pending)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def started_ok(self) -> bool:
        """Running and past its startup probe (if any): the status field ``started``."""
        return self.running and (self.startup is None or self.startup.result is True)

    @property
    def ready(self) -> bool:
        if not self.started_ok:
            return False
        return self.readiness is None or self.readiness.result is True


class PodWorker(threading.Thread):
    """Runs one pod until it is deleted (see module docstring)."""

    def __init__(self, agent: NodeAgent, pod: dict) -> None:
        super().__init__(name=f"pod-{pod['metadata']['namespace']}/{pod['metadata']['name']}", daemon=True)
        self.agent = agent
        self.pod = pod
        md = pod["metadata"]
        self.ns, self.pod_name, self.uid = md["namespace"], md["name"], md["uid"]
        self.dir = agent.state_dir / "pods" / self.uid
        self.shm = agent.shm_dir / self.uid
        self.rootfs = self.dir / "rootfs"
        self._ev_delete = threading.Event()
        self._ev_shutdown = threading.Event()
        self._ev_wake = threading.Event()
        self.grace = 30.0
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.inits = [_Container(c, True) for c in spec.get("initContainers") or []]
        self.containers = [_Container(c, False) for c in spec.get("containers") or []]
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
        self._token_expiry = 0.0
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
        a = self.agent
        try:
            (self.dir / "containers").mkdir(parents=True, exist_ok=True)
            (self.dir / "logs").mkdir(parents=True, exist_ok=True)
            self.rootfs.mkdir(parents=True, exist_ok=True)
            (self.dir / "pod.json").write_text(json.dumps({"namespace": self.ns, "name": self.pod_name,
                                                           "uid": self.uid, "podIP": self.pod_ip}))
            self.mounts = materialise_volumes(self.pod, self.dir, self.shm, get_configmap=self._get_cm,
                                              get_secret=self._get_secret, sa_token=self._projected_token,
                                              ca_pem=a.ca.read_bytes())
            self._write_kubeconfig()
            base = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
            base.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=a.server.rsplit(":", 1)[1],
                        HOSTNAME=self.pod_name)
            if self._kubeconfig_path().exists():
                base["KUBECONFIG"] = str(self._kubeconfig_path())
            for c in self.inits + self.containers:
                c.env = container_env(self._status_pod(), c.spec, base=base, get_configmap=self._get_cm,
                                      get_secret=self._get_secret, mounts=self.mounts, rootfs=self.rootfs,
                                      node_alloc=a.allocatable)
                wd = self.rootfs / c.spec.get("workingDir", "").lstrip("/")
                wd.mkdir(parents=True, exist_ok=True)
                c.cwd = str(wd)
            self._setup_error = None
            return True
        except Exception as err:  # noqa: BLE001 - reported in the pod's status, retried
            msg = _describe(err)
            if msg != self._setup_error:
                a.log(f"pod {self.ns}/{self.pod_name}: setup failed: {msg}")
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

    def _get_cm(self, name: str) -> dict | None:
        v1 = self.agent.core
        return secret_or_none(lambda: self.agent.raw(v1.read_namespaced_config_map, name, self.ns))

    def _get_secret(self, name: str) -> dict | None:
        v1 = self.agent.core
        return secret_or_none(lambda: self.agent.raw(v1.read_namespaced_secret, name, self.ns))

    def _token(self, audiences: list[str] | None, seconds: int) -> tuple[str, float]:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": audiences, "expirationSeconds": seconds,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name,
                                            "uid": self.uid}}}
        tr = self.agent.raw(self.agent.core.create_namespaced_service_account_token, sa, self.ns, body)
        return tr["status"]["token"], time.monotonic() + seconds

    def _projected_token(self, src: dict) -> str:
        aud = [src["audience"]] if src.get("audience") else None
        return self._token(aud, int(src.get("expirationSeconds") or 3600))[0]

    def _kubeconfig_path(self) -> Path:
        return self.dir / "kubeconfig"

    def _write_kubeconfig(self) -> None:
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return
        token, expiry = self._token(None, 3600)
        self._token_expiry = expiry
        sa = spec.get("serviceAccountName") or "default"
        write_kubeconfig(self._kubeconfig_path(), server=self.agent.server, ca=self.agent.ca,
                         user=f"system:serviceaccount:{self.ns}:{sa}", token=token, namespace=self.ns)

    # ----------------------------------------------------------------- containers
    def _tick(self) -> None:
        now = time.monotonic()
        if self._token_expiry and now > self._token_expiry - 720:  # refresh at 80 % of 3600 s
            try:
                self._write_kubeconfig()
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
                    self._start(c)
                return
            code = c.proc.poll()
            if code is None:
                return
            self._record_exit(c, code)
            if code == 0:
                c.done = True
                continue
            if self.restart_policy == "Never":
                c.done = True
                self.phase = "Failed"
                return
            self._schedule_restart(c, now)
            return
        self.initialized = True

    def _tick_container(self, c: _Container, now: float) -> None:
        if c.done:
            return
        if c.proc is None:
            if now >= c.next_start:
                self._start(c)
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
        self._record_exit(c, code)
        if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0):
            self._schedule_restart(c, now)
        else:
            c.done = True

    def _start(self, c: _Container) -> None:
        argv = [*(c.spec.get("command") or []), *(c.spec.get("args") or [])]
        argv = resolve_argv([expand(a, c.env) for a in argv])
        run = c.restart_count
        logdir = self.dir / "logs" / c.name
        logdir.mkdir(parents=True, exist_ok=True)
        if not argv:
            c.state = {"waiting": {"reason": "CreateContainerError",
                                   "message": "no command: dev-cluster nodes do not read image entrypoints; "
                                              "set command/args"}}
            c.done = True
            return
        try:
            c.proc = _proc.spawn(argv, log=logdir / f"{run}.log", env=c.env, cwd=Path(c.cwd))
        except OSError as err:
            c.state = {"waiting": {"reason": "RunContainerError", "message": f"{argv[0]}: {err}"}}
            c.proc = None
            self._schedule_restart(c, time.monotonic())
            return
        (self.dir / "containers" / f"{c.name}.pid").write_text(str(c.proc.pid))
        c.started_at = now_rfc3339()
        c.started_mono = time.monotonic()
        c.state = {"running": {"startedAt": c.started_at}}
        rp, lp, sp = (c.spec.get(k) for k in ("readinessProbe", "livenessProbe", "startupProbe"))
        c.readiness = Prober(rp, c.started_mono) if rp else None
        c.liveness = Prober(lp, c.started_mono) if lp else None
        c.startup = Prober(sp, c.started_mono) if sp else None

    def _record_exit(self, c: _Container, code: int) -> None:
        if code < 0:  # killed by a signal: report it as a shell would (128 + signal)
            code = 128 - code
        reason = "Completed" if code == 0 else "Error"
        c.state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": c.started_at,
                                  "finishedAt": now_rfc3339(), "containerID": f"lifeline://{c.proc.pid}"}}
        (self.dir / "containers" / f"{c.name}.pid").unlink(missing_ok=True)
        if time.monotonic() - c.started_mono > _BACKOFF_RESET:
            c.backoff = _BACKOFF_START
        c.proc = None
        c.readiness = c.liveness = c.startup = None

    def _schedule_restart(self, c: _Container, now: float) -> None:
        c.last_state = c.state if "terminated" in c.state else c.last_state
        c.restart_count += 1
        c.next_start = now + c.backoff
        c.backoff = min(c.backoff * 2, _BACKOFF_MAX)
        msg = c.state.get("terminated", {})
        c.state = {"waiting": {"reason": "CrashLoopBackOff",
                               "message": f"back-off restarting container {c.name} (last exit code "
                                          f"{msg.get('exitCode')})"}}

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
            self._record_exit(c, c.proc.returncode)
            c.done = True
        for f in (self.dir / "containers").glob("*.pid"):  # leftovers from a killed previous agent
            try:
                _proc.kill_group(int(f.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
            f.unlink(missing_ok=True)

    def _finalise_deletion(self) -> None:
        from kubernetes.client.exceptions import ApiException

        shutil.rmtree(self.shm, ignore_errors=True)
        try:
            self.agent.core.delete_namespaced_pod(
                self.pod_name, self.ns,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except ApiException as err:
            if err.status not in (404, 409):
                self.agent.log(f"pod {self.ns}/{self.pod_name}: final delete failed: {err.status} {err.reason}")

    # ----------------------------------------------------------------- status
    def _container_status(self, c: _Container) -> dict:
        s = {"name": c.name, "image": c.spec.get("image", ""), "imageID": "", "ready": c.ready,
             "started": c.started_ok, "restartCount": c.restart_count, "state": c.state,
             "lastState": c.last_state}
        if c.proc is not None:
            s["containerID"] = f"lifeline://{c.proc.pid}"
        elif "terminated" in c.state:
            s["containerID"] = c.state["terminated"].get("containerID", "")
        return s

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
        from kubernetes.client.exceptions import ApiException

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
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }
        if self.inits:
            status["initContainerStatuses"] = [self._container_status(c) for c in self.inits]
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
