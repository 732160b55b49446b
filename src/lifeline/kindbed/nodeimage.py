"""The kind node image, built here from sources: no registry, no kindest/* images.

Layers, each cached (an image whose tag exists is reused; ``-rN`` is the recipe revision):

1. ``lifeline.local/kind-node-base:bookworm-r1``: the Debian base plus systemd, containerd
   1.6, runc 1.1 and the CNI plugins from Debian, and our entrypoint, containerd config and
   kubelet units (``node/``).
2. Component images (``lifeline.local/<name>:<version>``, ``dockerfiles/``): kube-apiserver,
   kube-controller-manager, kube-scheduler (the dev cluster's v1.32.13 builds), kube-proxy
   (v1.32.13), etcd (v3.5.35), CoreDNS (v1.11.3) and pause (3.10), all built from source.
3. ``lifeline.local/kind-node:v1.32.13-rN``: (1) with kubeadm, kubelet and kubectl in
   /usr/bin, ``/kind/version``, and (2) imported into the node's containerd (namespace
   ``k8s.io``), as kind's own node images carry their images. kind's kubeadm config is pointed
   at these names by the kubeadmConfigPatches in kind-config.yaml (imageRepository
   ``lifeline.local``, the etcd tag).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from lifeline.devcluster import build as devbuild
from lifeline.errors import BuildError
from lifeline.kindbed import gobuild
from lifeline.kindbed.engine import docker, image_id
from lifeline.kindbed.images import ensure_base

__all__ = ["NODE_IMAGE", "NODE_BASE_IMAGE", "REPO", "component_images", "ensure_node_image"]

REPO = "lifeline.local"
NODE_BASE_IMAGE = f"{REPO}/kind-node-base:bookworm-r5"
NODE_IMAGE = f"{REPO}/kind-node:{devbuild.KUBERNETES_VERSION}-r6"
_HERE = Path(__file__).parent


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _build(ref: str, dockerfile: Path, files: dict[str, Path]) -> str:
    """``docker build`` of ``dockerfile`` with ``files`` (name in context -> source) unless ``ref`` exists."""
    if image_id(ref):
        return ref
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lifeline-ctx-", dir=devbuild.cache_root()) as tmp:
        for name, src in files.items():
            dest = Path(tmp) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        shutil.copy(dockerfile, Path(tmp) / "Dockerfile")
        proc = docker("build", "--build-arg", f"BASE={ensure_base()}", "-t", ref, tmp, check=False)
    if proc.returncode != 0:
        raise BuildError(f"docker build {ref} failed:\n{(proc.stdout + proc.stderr)[-4000:]}", key=ref)
    _log(f"[kind] built {ref} in {time.monotonic() - t0:.0f}s")
    return ref


def component_images(*, log=None) -> list[str]:
    """Build (or find) the image of every cluster component; returns their references."""
    bins = gobuild.ensure_all(log=log)
    pause = devbuild.ensure(gobuild.PAUSE, log=log)
    df = _HERE / "dockerfiles"
    k8s, node, v = bins["kubernetes"], bins["kubernetes-node"], devbuild.KUBERNETES_VERSION
    refs = [_build(f"{REPO}/{b}:{v}", df / "bin.Dockerfile", {f"bin/{b}": k8s / b})
            for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]
    refs.append(_build(f"{REPO}/kube-proxy:{v}", df / "kube-proxy.Dockerfile", {"bin/kube-proxy": node / "kube-proxy"}))
    refs.append(_build(f"{REPO}/etcd:{devbuild.ETCD_VERSION}", df / "bin.Dockerfile", {"bin/etcd": bins["etcd"] / "etcd"}))
    refs.append(_build(f"{REPO}/coredns:{gobuild.COREDNS_VERSION}", df / "coredns.Dockerfile",
                       {"bin/coredns": bins["coredns"] / "coredns"}))
    refs.append(_build(f"{REPO}/pause:{gobuild.PAUSE_VERSION}", df / "pause.Dockerfile", {"bin/pause": pause / "pause"}))
    return refs


def ensure_node_image(*, log=None) -> str:
    """Build (or find) the kind node image; returns its reference. Raises BuildError."""
    if image_id(NODE_IMAGE):
        return NODE_IMAGE
    refs = component_images(log=log)
    node_files = {n: _HERE / "node" / n for n in
                  ("entrypoint", "containerd.toml", "kubelet.service", "kubelet.slice", "10-kubeadm.conf")}
    _build(NODE_BASE_IMAGE, _HERE / "node" / "node.Dockerfile", node_files)
    t0 = time.monotonic()
    name = f"lifeline-node-build-{int(time.time())}"
    docker("run", "-d", "--name", name, "--entrypoint", "sleep", NODE_BASE_IMAGE, "infinity")
    try:
        bins = devbuild.ensure(gobuild.KUBERNETES_NODE, log=log)
        for b in ("kubeadm", "kubelet", "kubectl"):
            docker("cp", str(bins / b), f"{name}:/usr/bin/{b}")
        docker("exec", name, "sh", "-c", f"echo {devbuild.KUBERNETES_VERSION} > /kind/version")
        # containerd only stores the images here (no unpacking, so it needs no mounts)
        docker("exec", "-d", name, "sh", "-c", "containerd >/var/log/containerd-build.log 2>&1")
        deadline = time.monotonic() + 60
        while docker("exec", name, "ctr", "version", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise BuildError("containerd did not start in the node build container", key=NODE_IMAGE)
            time.sleep(0.5)
        saved = docker("save", *refs, input=b"").stdout
        docker("exec", "-i", name, "ctr", "--namespace=k8s.io", "images", "import", "--no-unpack",
               "--digests", "-", input=saved)
        listed = docker("exec", name, "ctr", "--namespace=k8s.io", "images", "ls", "-q").stdout.split()
        missing = [r for r in refs if r not in listed]
        if missing:
            raise BuildError(f"images missing from the node's containerd after import: {missing}", key=NODE_IMAGE)
        docker("exec", name, "sh", "-c", "kill $(pidof containerd); while pidof containerd >/dev/null; do sleep 0.1; done")
        docker("commit", "--change", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
               "--change", "CMD []", name, NODE_IMAGE)
    finally:
        docker("rm", "-f", "-v", name, check=False)
    _log(f"[kind] built {NODE_IMAGE} in {time.monotonic() - t0:.0f}s")
    return NODE_IMAGE
