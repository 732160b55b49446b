"""The Docker engine under the kind test bed: installed from Debian and started when missing.

``ensure_engine`` is what ``lifeline kind ...`` and CI call first. On a machine without
Docker it installs Debian's ``docker.io`` (and ``debootstrap``, which builds the base image)
with ``apt-get`` — it says so on stderr before doing it, and only as root; it starts
``dockerd`` in its own session when no daemon answers (a CI machine or a container without
systemd), logging to ``<cache>/dockerd.log``. Nothing is installed when everything is there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lifeline.devcluster.build import cache_root
from lifeline.errors import ClusterError

__all__ = ["ensure_engine", "docker", "docker_bin", "image_id", "image_size", "APT_PACKAGES"]

APT_PACKAGES = {"dockerd": "docker.io", "debootstrap": "debootstrap"}
"""Commands the bed needs -> the Debian package providing each."""


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def docker_bin() -> str:
    """The ``docker`` client on PATH (``/usr/bin/docker`` from docker.io otherwise). Raises ClusterError."""
    found = shutil.which("docker") or ("/usr/bin/docker" if Path("/usr/bin/docker").is_file() else None)
    if not found:
        raise ClusterError("no docker client: run `lifeline kind build` (installs docker.io) or "
                           "`apt-get install docker.io`")
    return found


def docker(*args: str, check: bool = True, input: bytes | None = None, timeout: float | None = None,
           capture: bool = True) -> subprocess.CompletedProcess:
    """Run ``docker ARGS``; stdout/stderr captured as text unless ``input`` (bytes) is given.

    Raises:
        ClusterError: non-zero exit with ``check`` (the command and its stderr tail in the message).
    """
    cmd = [docker_bin(), *args]
    proc = subprocess.run(cmd, input=input, timeout=timeout, text=input is None,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if check and proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(errors="replace")
        raise ClusterError(f"docker {' '.join(args[:4])} ... failed (exit {proc.returncode}): "
                           f"{err.strip()[-2000:]}", key=args[0] if args else "docker")
    return proc


def image_id(ref: str) -> str | None:
    """The local image id of ``ref``, or None when the engine has no such image."""
    proc = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def image_size(ref: str) -> int:
    """Size in bytes of a local image (all its layers, as ``docker image inspect`` reports)."""
    return int(docker("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


def _apt_install(packages: list[str]) -> None:
    if os.geteuid() != 0:
        raise ClusterError(f"missing {', '.join(packages)}; run as root or install them: "
                           f"sudo apt-get install -y {' '.join(packages)}")
    if not shutil.which("apt-get"):
        raise ClusterError(f"missing {', '.join(packages)} and no apt-get: install Docker and debootstrap")
    _log(f"[kind] installing from Debian: {' '.join(packages)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"{' '.join(cmd[:3])} failed: {proc.stdout[-2000:]}", key="apt-get")


def _daemon_answers() -> bool:
    try:
        return docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def ensure_engine(*, timeout: float = 60.0) -> None:
    """Make sure docker.io and debootstrap are installed and a Docker daemon answers.

    Installs the missing Debian packages (root, apt-get), then starts ``dockerd`` detached when
    ``docker info`` fails, and waits up to ``timeout`` seconds for it.

    Raises:
        ClusterError: not root and something is missing, apt-get failed, or dockerd did not come up
            (the tail of its log in the message).
    """
    missing = [pkg for cmd, pkg in APT_PACKAGES.items() if not shutil.which(cmd)
               and not Path("/usr/sbin", cmd).exists()]
    if missing:
        _apt_install(missing)
    if _daemon_answers():
        return
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    log = cache_root() / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    _log(f"[kind] no Docker daemon answers; starting {dockerd} (log: {log})")
    with open(log, "ab") as out:
        subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _daemon_answers():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise ClusterError(f"dockerd did not answer within {timeout:.0f}s; its log ends:\n{tail}", key="dockerd")
