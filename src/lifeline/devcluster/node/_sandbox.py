"""A pod's sandbox on a process node: its directories, volumes, ServiceAccount credentials and the
containers' environments.

The pod's ServiceAccount token comes from the TokenRequest API, bound to the pod, and is exported
to its containers as ``KUBECONFIG`` (``<pod dir>/kubeconfig``, refreshed at 80 % of its hour).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lifeline.devcluster.node._common import NodeHost, raw
from lifeline.devcluster.node._container import Container
from lifeline.devcluster.node.volumes import container_env, materialise_volumes, secret_or_none
from lifeline.devcluster.pki import write_kubeconfig

__all__ = ["PodSandbox"]

_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "TMPDIR", "TZ")
_TOKEN_SECONDS, _TOKEN_REFRESH_BEFORE = 3600, 720  # refresh at 80 % of the token's life


class PodSandbox:
    """Filesystem and credentials of one pod (by UID) on the node ``host``.

    Attributes:
        dir: ``<node state dir>/pods/<uid>`` (``pod.json``, ``containers/``, ``logs/``, ``volumes/``).
        shm: ``<node shm dir>/<uid>`` (Memory-medium emptyDirs).
        rootfs: ``dir/rootfs``, the containers' working root.
    """

    def __init__(self, host: NodeHost, *, namespace: str, name: str, uid: str) -> None:
        self.host = host
        self.ns, self.pod_name, self.uid = namespace, name, uid
        self.dir = host.state_dir / "pods" / uid
        self.shm = host.shm_dir / uid
        self.rootfs = self.dir / "rootfs"
        self.mounts: dict[str, Path] = {}
        self._token_expiry = 0.0

    @property
    def kubeconfig_path(self) -> Path:
        """``<pod dir>/kubeconfig``: the pod's ServiceAccount credentials (absent with automount off)."""
        return self.dir / "kubeconfig"

    def prepare(self, pod: dict, status_pod: dict, pod_ip: str, containers: list[Container]) -> None:
        """Create the pod's directories and volumes, write its kubeconfig, and set every container's
        ``env`` and ``cwd``.

        Args:
            pod: the pod object (spec, metadata; status as the worker last saw it).
            status_pod: ``pod`` with this node's status fields (podIP, hostIP) filled in.
            pod_ip: the pod's IP (recorded in ``pod.json``).
            containers: init containers and containers.

        Raises:
            ClusterError: an unsupported volume, or a missing configMap/secret/key.
            kubernetes.client.exceptions.ApiException: the API refused a read or the token request.
            OSError: the directories or files could not be written.
        """
        h = self.host
        (self.dir / "containers").mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        self.rootfs.mkdir(parents=True, exist_ok=True)
        (self.dir / "pod.json").write_text(json.dumps({"namespace": self.ns, "name": self.pod_name,
                                                       "uid": self.uid, "podIP": pod_ip}))
        self.mounts = materialise_volumes(pod, self.dir, self.shm, get_configmap=self._get_cm,
                                          get_secret=self._get_secret,
                                          sa_token=lambda src: self._projected_token(pod, src),
                                          ca_pem=h.ca.read_bytes())
        self.write_kubeconfig(pod)
        base = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        base.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=h.server.rsplit(":", 1)[1],
                    HOSTNAME=self.pod_name)
        if self.kubeconfig_path.exists():
            base["KUBECONFIG"] = str(self.kubeconfig_path)
        for c in containers:
            c.env = container_env(status_pod, c.spec, base=base, get_configmap=self._get_cm,
                                  get_secret=self._get_secret, mounts=self.mounts, rootfs=self.rootfs,
                                  node_alloc=h.allocatable)
            wd = self.rootfs / c.spec.get("workingDir", "").lstrip("/")
            wd.mkdir(parents=True, exist_ok=True)
            c.cwd = str(wd)

    def token_due(self, now: float) -> bool:
        """Whether the kubeconfig's token is due for a refresh (``now``: ``time.monotonic()``)."""
        return bool(self._token_expiry) and now > self._token_expiry - _TOKEN_REFRESH_BEFORE

    def write_kubeconfig(self, pod: dict) -> None:
        """Request a token for the pod's ServiceAccount and write :attr:`kubeconfig_path` (unless the pod
        sets ``automountServiceAccountToken: false``). Raises ApiException when the API refuses."""
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return
        token, expiry = self._token(pod, None, _TOKEN_SECONDS)
        self._token_expiry = expiry
        sa = spec.get("serviceAccountName") or "default"
        write_kubeconfig(self.kubeconfig_path, server=self.host.server, ca=self.host.ca,
                         user=f"system:serviceaccount:{self.ns}:{sa}", token=token, namespace=self.ns)

    def _get_cm(self, name: str) -> dict | None:
        v1 = self.host.core
        return secret_or_none(lambda: raw(v1.read_namespaced_config_map, name, self.ns))

    def _get_secret(self, name: str) -> dict | None:
        v1 = self.host.core
        return secret_or_none(lambda: raw(v1.read_namespaced_secret, name, self.ns))

    def _token(self, pod: dict, audiences: list[str] | None, seconds: int) -> tuple[str, float]:
        sa = pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": audiences, "expirationSeconds": seconds,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name,
                                            "uid": self.uid}}}
        tr = raw(self.host.core.create_namespaced_service_account_token, sa, self.ns, body)
        return tr["status"]["token"], time.monotonic() + seconds

    def _projected_token(self, pod: dict, src: dict) -> str:
        aud = [src["audience"]] if src.get("audience") else None
        return self._token(pod, aud, int(src.get("expirationSeconds") or 3600))[0]
