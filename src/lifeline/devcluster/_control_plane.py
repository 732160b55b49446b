"""Starting a dev cluster's control plane, recorded in its :class:`~lifeline.devcluster._state.ClusterState`
(flags documented in docs/devcluster.md)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Callable

from lifeline.devcluster._state import ClusterState
from lifeline.devcluster.pki import Pki, write_kubeconfig
from lifeline.devcluster.services import MinioServer, RedisServer


def start_control_plane(state: ClusterState, bins: dict[str, Path], log: Callable[[str], None],
                        timeout: float) -> None:
    """Issue certificates and start etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    Redis and MinIO for the cluster of ``state``, each waited for and its pid recorded in the state file.

    Args:
        state: the new cluster's state (ports, MinIO credentials; its directory holds no daemons yet).
        bins: ``{"etcd" | "kube-apiserver" | "kube-controller-manager" | "kube-scheduler": binary path}``.
        log: progress callable, one line per component.
        timeout: seconds to wait for each component to answer.

    Raises:
        ClusterError: a component exited or did not answer within ``timeout``.
    """
    p, sd = state.ports, state.state_dir
    pki = Pki(sd / "pki")
    sa_key, sa_pub = pki.service_account_keys()
    api_crt, api_key = pki.issue("apiserver", "kube-apiserver", server=True,
                                 dns=("localhost", "kubernetes", "kubernetes.default",
                                      "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"),
                                 ips=("127.0.0.1", "10.0.0.1"))
    kubelet_crt, kubelet_key = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                         orgs=("kubelet-api-admins",))
    clients = {
        "admin": ("lifeline-admin", ("system:masters",)),
        "controller-manager": ("system:kube-controller-manager", ()),
        "scheduler": ("system:kube-scheduler", ()),
    }
    for stem, (cn, orgs) in clients.items():
        crt, key = pki.issue(stem, cn, orgs=orgs)
        path = sd / "kubeconfig" if stem == "admin" else sd / "kubeconfigs" / f"{stem}.kubeconfig"
        write_kubeconfig(path, server=state.server, ca=pki.ca_cert, user=cn, cert=crt, key=key)

    log(f"[up] etcd on 127.0.0.1:{p.etcd}")
    state.spawn("etcd", [str(bins["etcd"]), "--name", "default", "--data-dir", str(sd / "etcd"),
                         "--listen-client-urls", f"http://127.0.0.1:{p.etcd}",
                         "--advertise-client-urls", f"http://127.0.0.1:{p.etcd}",
                         "--listen-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
                         "--initial-advertise-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
                         "--initial-cluster", f"default=http://127.0.0.1:{p.etcd_peer}",
                         "--unsafe-no-fsync", "--log-level", "warn"])
    state.wait_http("etcd", f"http://127.0.0.1:{p.etcd}/health", timeout)

    log(f"[up] kube-apiserver on https://127.0.0.1:{p.apiserver}")
    state.spawn("kube-apiserver", [
        str(bins["kube-apiserver"]),
        f"--etcd-servers=http://127.0.0.1:{p.etcd}",
        "--bind-address=127.0.0.1", f"--secure-port={p.apiserver}", "--advertise-address=127.0.0.1",
        f"--tls-cert-file={api_crt}", f"--tls-private-key-file={api_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--endpoint-reconciler-type=none",
        f"--kubelet-client-certificate={kubelet_crt}", f"--kubelet-client-key={kubelet_key}",
        f"--kubelet-certificate-authority={pki.ca_cert}", "--kubelet-preferred-address-types=InternalIP",
        "--default-not-ready-toleration-seconds=10", "--default-unreachable-toleration-seconds=10",
        "--allow-privileged=true", "--profiling=false", "--v=1",
    ])
    admin_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    admin_ctx.load_cert_chain(str(pki.dir / "admin.crt"), str(pki.dir / "admin.key"))
    state.wait_http("kube-apiserver", f"{state.server}/readyz", timeout, admin_ctx)

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # serving certs of kcm/scheduler are self-signed
    kcm_cfg = sd / "kubeconfigs" / "controller-manager.kubeconfig"
    log(f"[up] kube-controller-manager on 127.0.0.1:{p.controller_manager}")
    state.spawn("kube-controller-manager", [
        str(bins["kube-controller-manager"]),
        f"--kubeconfig={kcm_cfg}", f"--authentication-kubeconfig={kcm_cfg}",
        f"--authorization-kubeconfig={kcm_cfg}",
        "--bind-address=127.0.0.1", f"--secure-port={p.controller_manager}",
        f"--cert-dir={sd / 'kcm-certs'}",
        "--controllers=*", "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}", f"--service-account-private-key-file={sa_key}",
        f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
        "--node-monitor-grace-period=10s", "--node-monitor-period=2s",
        "--leader-elect=false", "--profiling=false", "--v=1",
    ])
    sched_cfg = sd / "kubeconfigs" / "scheduler.kubeconfig"
    log(f"[up] kube-scheduler on 127.0.0.1:{p.scheduler}")
    state.spawn("kube-scheduler", [
        str(bins["kube-scheduler"]),
        f"--kubeconfig={sched_cfg}", f"--authentication-kubeconfig={sched_cfg}",
        f"--authorization-kubeconfig={sched_cfg}",
        "--bind-address=127.0.0.1", f"--secure-port={p.scheduler}",
        f"--cert-dir={sd / 'scheduler-certs'}",
        "--leader-elect=false", "--profiling=false", "--v=1",
    ])
    state.wait_http("kube-controller-manager", f"https://127.0.0.1:{p.controller_manager}/healthz",
                    timeout, insecure)
    state.wait_http("kube-scheduler", f"https://127.0.0.1:{p.scheduler}/healthz", timeout, insecure)

    log(f"[up] redis on 127.0.0.1:{p.redis}, minio on 127.0.0.1:{p.minio}")
    r = RedisServer(state_dir=sd / "redis", port=p.redis).start()
    state.record("redis", r.detach())
    m = MinioServer(state_dir=sd / "minio", port=p.minio, access_key=state.minio.access_key,
                    secret_key=state.minio.secret_key).start()
    state.record("minio", m.detach())
    state.save()
