"""The kind test bed's Go builds, on the dev cluster's versioned cache (``lifeline.devcluster.build``).

=========================  ==========  ===================================================
component                  version     how
=========================  ==========  ===================================================
``kubernetes-node``        v1.32.13    the dev cluster's scratch module ``go/kubernetes``
                                       (same version, same staging-module pins, same
                                       version ldflags): kubeadm, kubelet, kube-proxy,
                                       kubectl
``kind``                   v0.27.0     ``go install sigs.k8s.io/kind@v0.27.0`` (the release
                                       whose node images are Kubernetes v1.32)
``coredns``                v1.11.3     ``go install github.com/coredns/coredns@v1.11.3``
                                       (the CoreDNS that kubeadm v1.32 deploys)
``pause``                  3.10        ``gcc -static`` of ``build/pause/linux/pause.c`` from
                                       the k8s.io/kubernetes v1.32.13 module (fetched
                                       through the module proxy); 3.10 is the sandbox
                                       image version kubeadm v1.32 names
=========================  ==========  ===================================================

etcd (v3.5.35) and the three control-plane servers come from the dev cluster's own
components. Every entry lives in ``<cache>/bin/<name>-<version>/`` with the same
``.complete`` marker, lock and half-written-entry rules (see ``lifeline.devcluster.build``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from lifeline.devcluster import build as devbuild
from lifeline.errors import BuildError

__all__ = ["KIND_VERSION", "COREDNS_VERSION", "PAUSE_VERSION", "KUBERNETES_NODE", "KIND", "COREDNS", "PAUSE",
           "ensure_all"]

KIND_VERSION = "v0.27.0"
COREDNS_VERSION = "v1.11.3"
PAUSE_VERSION = "3.10"


def _build_kubernetes_node(go: str, c: devbuild.Component, out: Path, log) -> None:
    src = devbuild.scratch_module("kubernetes", out)
    for b in c.binaries:
        pkg = f"k8s.io/kubernetes/cmd/{b}"
        # Same flags and cgo setting as the dev cluster's control plane (they run on Debian's
        # glibc in the node and component images): Go's build cache is shared with that build.
        devbuild.run_go([go, "build", "-p", "2", "-trimpath", "-ldflags", devbuild.k8s_ldflags(),
                         "-o", str(out / b), pkg], cwd=src, env=None, log=log, what=f"{b} {c.version}")
    shutil.rmtree(src)


def _go_install(module: str, ldflags: str = "-s -w"):
    def build(go: str, c: devbuild.Component, out: Path, log) -> None:
        devbuild.run_go([go, "install", "-p", "2", "-trimpath", "-ldflags", ldflags, f"{module}@{c.version}"],
                        cwd=out, env={"GOBIN": str(out), "CGO_ENABLED": "0"}, log=log,
                        what=f"{c.name} {c.version}")
    return build


KUBERNETES_NODE = devbuild.Component(
    "kubernetes-node", devbuild.KUBERNETES_VERSION, ("kubeadm", "kubelet", "kube-proxy", "kubectl"),
    builder=_build_kubernetes_node)
"""kubeadm, kubelet, kube-proxy and kubectl of the dev cluster's Kubernetes version."""

KIND = devbuild.Component(
    "kind", KIND_VERSION, ("kind",),
    builder=_go_install("sigs.k8s.io/kind", f"-s -w -X sigs.k8s.io/kind/pkg/cmd/kind/version.gitCommit={KIND_VERSION}"))
"""The kind CLI."""

COREDNS = devbuild.Component("coredns", COREDNS_VERSION, ("coredns",),
                             builder=_go_install("github.com/coredns/coredns"))
"""CoreDNS, the cluster DNS kubeadm installs."""


def _build_pause(go: str, c: devbuild.Component, out: Path, log) -> None:
    proc = subprocess.run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{devbuild.KUBERNETES_VERSION}"],
                          cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise BuildError(f"go mod download k8s.io/kubernetes failed: {proc.stdout[-2000:]}", key="pause")
    src = Path(json.loads(proc.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    log(f"[build] pause {c.version}: gcc -static {src}")
    cc = subprocess.run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{c.version}",
                         "-o", str(out / "pause"), str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if cc.returncode != 0:
        raise BuildError(f"gcc pause.c failed (needs gcc and libc6-dev): {cc.stdout[-2000:]}", key="pause")


PAUSE = devbuild.Component("pause", PAUSE_VERSION, ("pause",), builder=_build_pause)
"""The pod sandbox process (Kubernetes' pause.c), static."""


def ensure_all(*, log=None) -> dict[str, Path]:
    """Build (or find cached) everything the kind bed compiles; returns component name -> entry directory.

    Order: the dev cluster's etcd, kubernetes (control plane) and minio, then kind, coredns and
    kubernetes-node. Raises ``BuildError`` when a build fails.
    """
    out = {n: devbuild.ensure(n, log=log) for n in ("etcd", "minio", "kubernetes")}
    for c in (PAUSE, KIND, COREDNS, KUBERNETES_NODE):
        out[c.name] = devbuild.ensure(c, log=log)
    return out
