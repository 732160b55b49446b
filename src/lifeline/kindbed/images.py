"""Images built here, with no registry: the Debian base, the Lifeline image, Redis and MinIO.

=====================================  ==================================================
image                                  recipe
=====================================  ==================================================
``lifeline.local/debian:bookworm-r1``  ``debootstrap --variant=minbase bookworm`` (Debian's
                                       packages), ``docker import`` of the root filesystem
``lifeline:dev``                       ``Dockerfile`` at the repository root, built with
                                       ``--network none`` from wheels resolved and
                                       downloaded on this machine (``<cache>/wheels``); its
                                       ``deps`` stage is kept as
                                       ``lifeline.local/lifeline-deps:<key>``
``lifeline.local/redis:<debian ver>``  Debian bookworm's ``redis-server`` (uid 999)
``lifeline.local/minio:<version>``     the MinIO binary of ``lifeline devcluster build``
=====================================  ==================================================

Cache: Docker's image store. An image whose tag exists is reused; tags carry the recipe
revision (``-rN``, bumped when a recipe changes) and the upstream versions. Debian packages
fetched by debootstrap are kept in ``<cache>/debs`` and PyPI wheels in ``<cache>/wheels``,
so a rebuild after ``docker system prune`` downloads nothing new.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lifeline.devcluster import build as devbuild
from lifeline.errors import BuildError
from lifeline.kindbed.engine import docker, image_id

__all__ = ["BASE_IMAGE", "LIFELINE_IMAGE", "DEPS_IMAGE", "REDIS_IMAGE", "MINIO_IMAGE", "DEBIAN_MIRROR",
           "ensure_base", "ensure_lifeline", "ensure_services", "build_context_wheels"]

DEBIAN_MIRROR = os.environ.get("LIFELINE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_IMAGE = "lifeline.local/debian:bookworm-r1"
LIFELINE_IMAGE = "lifeline:dev"
DEPS_IMAGE = "lifeline.local/lifeline-deps"
"""The Dockerfile's ``deps`` stage, tagged ``<DEPS_IMAGE>:<key of the pins and recipe>`` so that the
image prune after a build keeps it: a code change then rebuilds only the package layer."""
REDIS_IMAGE = "lifeline.local/redis:7.0-bookworm-r1"
IMAGE_PYTHON = "3.11.2"
"""Debian bookworm's python3, the Lifeline image's interpreter (markers are evaluated for it)."""
MINIO_IMAGE = f"lifeline.local/minio:{devbuild.MINIO_VERSION}-r2"
_DOCKERFILES = Path(__file__).parent / "dockerfiles"
# Wheels left out of the image: triton compiles GPU kernels, cuda-* are CUDA's Python bindings.
_DROP = re.compile(r"^(triton|cuda-.*)$")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}", key=what)
    return proc


def _timed(ref: str, build) -> str:
    if image_id(ref):
        return ref
    t0 = time.monotonic()
    build()
    _log(f"[kind] built {ref} in {time.monotonic() - t0:.0f}s")
    return ref


def ensure_base() -> str:
    """The Debian bookworm base image (debootstrap minbase, imported); returns its tag. Raises BuildError."""
    def build() -> None:
        debs = devbuild.cache_root() / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="lifeline-rootfs-") as tmp:
            root = Path(tmp) / "rootfs"
            _log(f"[kind] debootstrap bookworm (minbase) from {DEBIAN_MIRROR}")
            _run(["nice", "-n", "10", "debootstrap", "--variant=minbase", f"--cache-dir={debs}",
                  "bookworm", str(root), DEBIAN_MIRROR], "debootstrap")
            (root / "etc/apt/sources.list").write_text(
                f"deb {DEBIAN_MIRROR} bookworm main\ndeb {DEBIAN_MIRROR} bookworm-updates main\n"
                "deb http://deb.debian.org/debian-security bookworm-security main\n")
            # Images stay small: no docs, man pages or apt caches; apt never asks.
            (root / "etc/dpkg/dpkg.cfg.d/lifeline-nodoc").write_text(
                "path-exclude /usr/share/doc/*\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n")
            (root / "etc/apt/apt.conf.d/lifeline").write_text(
                'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n')
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for f in (root / junk).glob("*"):
                    if f.is_file():
                        f.unlink()
            tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
            try:
                docker("import", "--change", 'CMD ["/bin/bash"]', "--change", "ENV LANG=C.UTF-8",
                       "-", BASE_IMAGE, input=tar.stdout.read())
            finally:
                tar.wait()
    return _timed(BASE_IMAGE, build)


def _pins(repo: Path) -> list[str]:
    """``name==version`` of every dependency of the package, as pip resolves them for this Python.

    Constrained to the versions installed in the running environment (``pip freeze``), so the image
    runs the torch (and everything else) that ``lifeline run`` on this machine runs: the e2e tests
    compare the two bit for bit.
    """
    freeze = _run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], "pip freeze").stdout
    freeze = "\n".join(line for line in freeze.splitlines() if "==" in line and " @ " not in line)
    key = hashlib.sha256((repo / "pyproject.toml").read_bytes() + freeze.encode()).hexdigest()[:12]
    cached = devbuild.cache_root() / "wheels" / f"pins-{key}-py{IMAGE_PYTHON}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(freeze + "\n")

        def resolve(*reqs: str) -> list[dict]:
            report = Path(tmp) / "report.json"
            _run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                  "-c", str(constraints), "--report", str(report), *reqs], "pip resolve")
            return json.loads(report.read_text())["install"]

        items = resolve(str(repo))
        # pip evaluated markers for this interpreter; the image runs Debian's. Add what only the
        # image's Python needs (e.g. redis-py wants async-timeout below Python 3.11.3).
        for _ in range(3):
            missing = _needed_by_image_python(items)
            if not missing:
                break
            items += resolve(*missing)
    pins = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items
                  if i["metadata"]["name"].lower() != "lifeline"
                  and not _DROP.match(i["metadata"]["name"].lower()))
    cached.write_text(json.dumps(pins, indent=0))
    return pins


def _needed_by_image_python(items: list[dict]) -> list[str]:
    """Requirements (without markers) of resolved ``items`` that the image's Python needs and that
    are not resolved yet: markers evaluated for :data:`IMAGE_PYTHON` instead of this interpreter."""
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement

    env = {**default_environment(), "python_full_version": IMAGE_PYTHON,
           "python_version": ".".join(IMAGE_PYTHON.split(".")[:2]), "extra": ""}
    have = {_norm(i["metadata"]["name"]) for i in items}
    out = []
    for i in items:
        for spec in i["metadata"].get("requires_dist") or []:
            req = Requirement(spec)
            if req.marker is not None and req.marker.evaluate(env) and _norm(req.name) not in have:
                out.append(f"{req.name}{req.specifier}")
                have.add(_norm(req.name))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def build_context_wheels(repo: Path, dest: Path) -> None:
    """Fill ``dest/deps`` (dependency wheels, hard links into the cache) and ``dest/lifeline``.

    Raises:
        BuildError: pip could not resolve, download or build a wheel.
    """
    wheels = devbuild.cache_root() / "wheels"
    pins = _pins(repo)
    want = {(_norm(p.split("==")[0]), p.split("==")[1]) for p in pins}
    have = {(_norm(f.name.split("-")[0]), f.name.split("-")[1]): f for f in wheels.glob("*.whl")}
    if want - set(have):
        reqs = dest / "requirements.txt"
        reqs.write_text("\n".join(pins) + "\n")
        _log(f"[kind] downloading {len(want - set(have))} wheels into {wheels}")
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
              "-d", str(wheels), "-r", str(reqs)], "pip download")
        reqs.unlink()
        have = {(_norm(f.name.split("-")[0]), f.name.split("-")[1]): f for f in wheels.glob("*.whl")}
    (dest / "deps").mkdir()
    for k in sorted(want):
        os.link(have[k], dest / "deps" / have[k].name)
    (dest / "lifeline").mkdir()
    # from a copy of the sources: setuptools would otherwise leave build/ in the checkout (and
    # reuse it next time, stale modules included)
    src = dest / "src-copy"
    shutil.copytree(repo / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest / "lifeline"), str(src)],
         "pip wheel lifeline")
    shutil.rmtree(src)


def _deps_key(repo: Path) -> str:
    """SHA-256 (12 hex) of what the ``deps`` stage is built from: the pins, the Dockerfile and
    slim_torch.py (a changed recipe gets a new tag rather than a stale stage)."""
    h = hashlib.sha256(json.dumps(_pins(repo)).encode())
    for p in (repo / "Dockerfile", _DOCKERFILES / "slim_torch.py"):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _keep_deps_stage(ctx: Path, base: str, tag: str) -> None:
    """Build (or find in Docker's cache) the Dockerfile's ``deps`` stage from ``ctx`` and tag it
    ``tag``; remove the stage tags of other keys (GBs each). Raises BuildError."""
    if not image_id(tag):
        proc = docker("build", "--build-arg", f"BASE={base}", "--target", "deps", "-t", tag, str(ctx), check=False)
        if proc.returncode != 0:
            raise BuildError(f"docker build {tag} failed:\n{(proc.stdout + proc.stderr)[-4000:]}", key=tag)
    old = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", DEPS_IMAGE, check=False).stdout.split()
    if stale := [t for t in old if t != tag]:
        docker("image", "rm", *stale, check=False)


def _source_key(repo: Path) -> str:
    """SHA-256 (16 hex) of what the Lifeline image is built from: the package's files, pyproject.toml,
    README.md, the Dockerfile, slim_torch.py and the dependency pins."""
    h = hashlib.sha256()
    files = sorted(p for p in (repo / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and not p.name.endswith((".pyc", ".egg-info")) and ".egg-info" not in str(p))
    for p in [*files, repo / "pyproject.toml", repo / "README.md", repo / "Dockerfile", _DOCKERFILES / "slim_torch.py"]:
        h.update(str(p.relative_to(repo) if p.is_relative_to(repo) else p.name).encode() + b"\0" + p.read_bytes())
    h.update(json.dumps(_pins(repo)).encode())
    return h.hexdigest()[:16]


def ensure_lifeline(repo: Path, *, rebuild: bool = True) -> str:
    """Build the Lifeline image from the checkout at ``repo`` (layers reused by Docker's cache).

    With ``rebuild`` (default) the image is rebuilt unless it carries the label
    ``dev.lifeline.source`` of exactly the current sources (:func:`_source_key`); without it an
    existing ``lifeline:dev`` is kept. Returns the tag. Raises BuildError.
    """
    if not rebuild and image_id(LIFELINE_IMAGE):
        return LIFELINE_IMAGE
    source = _source_key(repo)
    got = docker("image", "inspect", "--format", '{{ index .Config.Labels "dev.lifeline.source" }}',
                 LIFELINE_IMAGE, check=False)
    if got.returncode == 0 and got.stdout.strip() == source:
        return LIFELINE_IMAGE  # built from exactly these sources, pins and recipe
    base = ensure_base()
    t0 = time.monotonic()
    ctx = Path(tempfile.mkdtemp(prefix="lifeline-image-", dir=devbuild.cache_root()))
    try:
        build_context_wheels(repo, ctx)
        shutil.copy(repo / "Dockerfile", ctx / "Dockerfile")
        shutil.copy(_DOCKERFILES / "slim_torch.py", ctx / "slim_torch.py")
        _keep_deps_stage(ctx, base, f"{DEPS_IMAGE}:{_deps_key(repo)}")
        # The lifeline wheel's bytes change with every build (timestamps); its layer is the last one.
        proc = docker("build", "--build-arg", f"BASE={base}", "--label", f"dev.lifeline.source={source}",
                      "-t", LIFELINE_IMAGE, str(ctx), check=False)
        if proc.returncode != 0:
            raise BuildError(f"docker build {LIFELINE_IMAGE} failed:\n{(proc.stdout + proc.stderr)[-4000:]}",
                             key=LIFELINE_IMAGE)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    # the image this build replaced and stages left untagged, GBs each (the tagged deps stage stays)
    docker("image", "prune", "--force", "--filter", "label=dev.lifeline.image=lifeline", check=False)
    _log(f"[kind] {LIFELINE_IMAGE} ready in {time.monotonic() - t0:.0f}s")
    return LIFELINE_IMAGE


def ensure_services() -> dict[str, str]:
    """The chart's in-cluster Redis and MinIO images; returns ``{"redis": tag, "minio": tag}``."""
    base = ensure_base()

    def build(dockerfile: str, ref: str, files: dict[str, Path]):
        def run() -> None:
            with tempfile.TemporaryDirectory(prefix="lifeline-svc-", dir=devbuild.cache_root()) as tmp:
                for name, src in files.items():
                    shutil.copy2(src, Path(tmp) / name)
                shutil.copy(_DOCKERFILES / dockerfile, Path(tmp) / "Dockerfile")
                proc = docker("build", "--build-arg", f"BASE={base}", "-t", ref, tmp, check=False)
                if proc.returncode != 0:
                    raise BuildError(f"docker build {ref} failed:\n{(proc.stdout + proc.stderr)[-4000:]}", key=ref)
        return run

    minio = devbuild.ensure("minio") / "minio"
    return {"redis": _timed(REDIS_IMAGE, build("redis.Dockerfile", REDIS_IMAGE, {})),
            "minio": _timed(MINIO_IMAGE, build("minio.Dockerfile", MINIO_IMAGE, {"minio": minio}))}
