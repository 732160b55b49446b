"""Build the dev cluster's server binaries from source, once, into a versioned cache.

Every component is compiled by the local Go toolchain from modules fetched through the
Go module proxy (no container images, no downloads of prebuilt binaries):

===================  =============================  =========================================
component            version                        how
===================  =============================  =========================================
``etcd``             v3.5.35                        scratch module ``go/etcd`` calling
                                                    ``etcdmain.Main`` (``go install`` refuses
                                                    etcd's server module: it has replaces)
``kubernetes``       v1.32.13                       scratch module ``go/kubernetes`` replacing
                                                    every staging module with its published
                                                    release; builds kube-apiserver,
                                                    kube-controller-manager, kube-scheduler
``helm``             v3.19.5                        ``go install helm.sh/helm/v3/cmd/helm@...``
``minio``            pseudo-version (no semver)     ``go install github.com/minio/minio@...``
``fake-gcs-server``  v1.56.1                        ``go install github.com/fsouza/
                                                    fake-gcs-server@...`` (the GCS emulator of
                                                    the storage tests; not in :func:`build_all`)
===================  =============================  =========================================

Cache layout: ``$LIFELINE_CACHE/bin/<component>-<version>/<binary>`` (default root
``~/.cache/lifeline``). A ``.complete`` marker (JSON: binaries, sizes in bytes, build
seconds) is written last, after every binary has been renamed into place; an entry
without it, or whose binaries do not match it, is half-written: it is deleted and
rebuilt, never used. Builds hold an exclusive ``flock`` per entry, so concurrent test
sessions build once. Go's own module and build caches stay at Go's defaults so reruns on
the same machine are warm.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lifeline.errors import BuildError

__all__ = [
    "Component",
    "COMPONENTS",
    "cache_root",
    "entry_dir",
    "is_complete",
    "ensure",
    "binary",
    "build_all",
    "go_toolchain",
    "run_go",
    "k8s_ldflags",
    "scratch_module",
]

_GO_DIR = Path(__file__).parent / "go"
_MARKER = ".complete"


@dataclass(frozen=True)
class Component:
    """One cached build.

    Attributes:
        name: cache key and CLI name (``etcd``, ``kubernetes``, ``helm``, ``minio``).
        version: the upstream version built (a semver tag or a Go pseudo-version).
        binaries: executable file names the entry holds.
        builder: ``builder(go, component, out_dir, log)`` writing the binaries into ``out_dir``;
            ``None`` for the dev cluster's own components (built by this module). Test beds
            built on this cache (``lifeline.kindbed``) pass their own.
    """

    name: str
    version: str
    binaries: tuple[str, ...]
    builder: Callable[[str, "Component", Path, Callable[[str], None]], None] | None = field(
        default=None, compare=False, repr=False)


KUBERNETES_VERSION = "v1.32.13"
_K8S_BUILD_DATE = "2026-02-27T00:14:55Z"  # the v1.32.13 module's publication time (proxy .info)
HELM_VERSION = "v3.19.5"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
ETCD_VERSION = "v3.5.35"
FAKE_GCS_SERVER_VERSION = "v1.56.1"

COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("etcd", ETCD_VERSION, ("etcd",)),
        Component(
            "kubernetes",
            KUBERNETES_VERSION,
            ("kube-apiserver", "kube-controller-manager", "kube-scheduler"),
        ),
        Component("helm", HELM_VERSION, ("helm",)),
        Component("minio", MINIO_VERSION, ("minio",)),
        Component("fake-gcs-server", FAKE_GCS_SERVER_VERSION, ("fake-gcs-server",)),
    )
}
"""Every component the dev cluster needs (and fake-gcs-server, the storage tests' GCS emulator), by name."""


def cache_root() -> Path:
    """The cache root: ``$LIFELINE_CACHE`` or ``~/.cache/lifeline``."""
    env = os.environ.get("LIFELINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lifeline"


def entry_dir(component: Component) -> Path:
    """``<cache root>/bin/<name>-<version>``: where ``component``'s binaries live."""
    return cache_root() / "bin" / f"{component.name}-{component.version}"


def is_complete(component: Component) -> bool:
    """Whether the cache entry is complete: marker present and every binary matching it."""
    d = entry_dir(component)
    try:
        marker = json.loads((d / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    sizes = marker.get("sizes", {})
    for b in component.binaries:
        p = d / b
        if not p.is_file() or not os.access(p, os.X_OK) or p.stat().st_size != sizes.get(b):
            return False
    return True


def binary(name: str) -> Path:
    """Absolute path of a built binary (e.g. ``"kube-apiserver"``), building its component if needed.

    Raises:
        BuildError: unknown binary, or the build failed.
    """
    for c in COMPONENTS.values():
        if name in c.binaries:
            return ensure(c) / name
    raise BuildError(f"unknown dev-cluster binary {name!r}; known: "
                     + ", ".join(b for c in COMPONENTS.values() for b in c.binaries), key=name)


def ensure(component: Component | str, *, log=None) -> Path:
    """Return the complete cache entry of ``component``, building it first when missing or half-written.

    Args:
        component: a :class:`Component` or its name.
        log: callable taking one progress line (default: print to stderr).

    Returns:
        The entry directory holding the binaries.

    Raises:
        BuildError: no Go toolchain, unknown component, or ``go`` failed (its output tail included).
    """
    if isinstance(component, str):
        if component not in COMPONENTS:
            raise BuildError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}",
                             key=component)
        component = COMPONENTS[component]
    if is_complete(component):
        return entry_dir(component)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    d = entry_dir(component)
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f".{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(component):  # another process built it while we waited
            return d
        if d.exists():
            log(f"[build] {d} is half-written (no valid {_MARKER}); removing and rebuilding")
            shutil.rmtree(d)
        go = _go()
        staging = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
        try:
            t0 = time.monotonic()
            (component.builder or _BUILDERS[component.name])(go, component, staging, log)
            seconds = time.monotonic() - t0
            for b in component.binaries:
                if not (staging / b).is_file():
                    raise BuildError(f"build of {component.name} produced no {b}", key=component.name)
            staging.rename(d)
            marker = {
                "component": component.name,
                "version": component.version,
                "sizes": {b: (d / b).stat().st_size for b in component.binaries},
                "build_seconds": round(seconds, 1),
            }
            tmp = d / f"{_MARKER}.tmp"
            tmp.write_text(json.dumps(marker, indent=1))
            os.replace(tmp, d / _MARKER)
            log(f"[build] {component.name} {component.version} built in {seconds:.0f}s -> {d}")
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return d


def build_all(*, log=None) -> dict[str, Path]:
    """Ensure every component, sequentially (cheapest first); returns name -> entry directory."""
    order = ["etcd", "helm", "minio", "kubernetes"]
    return {name: ensure(name, log=log) for name in order}


_GO_FALLBACKS = ("/usr/local/go/bin/go",)


def go_toolchain() -> str:
    """Path of the ``go`` command (PATH, then /usr/local/go/bin). Raises BuildError when there is none."""
    return _go()


def run_go(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, log, what: str) -> None:
    """Run one Go build command (``GOFLAGS=-buildvcs=false``); BuildError with the output's tail on failure."""
    _run(cmd, cwd=cwd, env=env, log=log, what=what)


def k8s_ldflags() -> str:
    """``-ldflags`` stamping Kubernetes binaries with :data:`KUBERNETES_VERSION` (as its release does)."""
    return _k8s_ldflags()


def scratch_module(name: str, dest: Path) -> Path:
    """Copy the packaged scratch Go module ``go/<name>`` into ``dest`` (writable); returns its directory."""
    return _scratch_module(name, dest)


def _go() -> str:
    go = shutil.which("go") or next((p for p in _GO_FALLBACKS if Path(p).is_file()), None)
    if not go:
        raise BuildError(
            "no Go toolchain found on PATH: the dev cluster builds etcd, Kubernetes, helm and MinIO "
            "from source. Install Go 1.23 or newer (https://go.dev/dl/, e.g. "
            "`curl -sSL https://go.dev/dl/go1.23.4.linux-amd64.tar.gz | tar -C /usr/local -xz` and "
            "add /usr/local/go/bin to PATH), then rerun `lifeline devcluster build`."
        )
    return go


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None, log, what: str) -> None:
    log(f"[build] {what}: {' '.join(cmd[:3])} ... ")
    full_env = {**os.environ, "GOFLAGS": "-buildvcs=false", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}", key=what)


def _scratch_module(name: str, dest: Path) -> Path:
    """Copy the packaged scratch module ``go/<name>`` into a writable temp dir."""
    work = dest / f".src-{name}"
    shutil.copytree(_GO_DIR / name, work)
    return work


def _build_etcd(go: str, c: Component, out: Path, log) -> None:
    src = _scratch_module("etcd", out)
    _run([go, "build", "-p", "2", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "."],
         cwd=src, env=None, log=log, what=f"etcd {c.version}")
    shutil.rmtree(src)


def _k8s_ldflags() -> str:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.gitCommit=unknown",
            f"-X {pkg}.buildDate={_K8S_BUILD_DATE}",
        ]
    return " ".join(flags)


def _build_kubernetes(go: str, c: Component, out: Path, log) -> None:
    src = _scratch_module("kubernetes", out)
    for b in c.binaries:
        _run([go, "build", "-p", "2", "-trimpath", "-ldflags", _k8s_ldflags(), "-o", str(out / b),
              f"k8s.io/kubernetes/cmd/{b}"], cwd=src, env=None, log=log, what=f"{b} {c.version}")
    shutil.rmtree(src)


def _build_helm(go: str, c: Component, out: Path, log) -> None:
    ld = f"-s -w -X helm.sh/helm/v3/internal/version.version={c.version} " \
         "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    _run([go, "install", "-p", "2", "-trimpath", "-ldflags", ld, f"helm.sh/helm/v3/cmd/helm@{c.version}"],
         cwd=out, env={"GOBIN": str(out)}, log=log, what=f"helm {c.version}")


def _build_minio(go: str, c: Component, out: Path, log) -> None:
    _run([go, "install", "-p", "2", "-trimpath", "-ldflags", "-s -w", f"github.com/minio/minio@{c.version}"],
         cwd=out, env={"GOBIN": str(out)}, log=log, what=f"minio {c.version}")


def _build_fake_gcs_server(go: str, c: Component, out: Path, log) -> None:
    _run([go, "install", "-p", "2", "-trimpath", "-ldflags", "-s -w",
          f"github.com/fsouza/fake-gcs-server@{c.version}"],
         cwd=out, env={"GOBIN": str(out)}, log=log, what=f"fake-gcs-server {c.version}")


_BUILDERS = {
    "etcd": _build_etcd,
    "kubernetes": _build_kubernetes,
    "helm": _build_helm,
    "minio": _build_minio,
    "fake-gcs-server": _build_fake_gcs_server,
}
