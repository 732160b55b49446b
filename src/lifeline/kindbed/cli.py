"""``lifeline kind build | up | load | install | down``: the kind test bed (docs/kind.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)

_NAME = typer.Option("lifeline", "--name", help="The kind cluster's name.")
_STATE = typer.Option(Path(".state/kind"), "--state-dir", help="Kubeconfig and the docker wrapper.")
_WHAT = ("base", "services", "lifeline", "node")


def _repo() -> Path:
    root = Path.cwd()
    if not (root / "pyproject.toml").is_file() or not (root / "Dockerfile").is_file():
        raise typer.BadParameter("run from the repository root (it needs pyproject.toml, Dockerfile, src/)")
    return root


@app.command()
def build(what: Optional[list[str]] = typer.Argument(None, help="base, services, lifeline, node (default: all)")):
    """Build the images (Debian base, Redis/MinIO, the Lifeline image, the kind node image) and kind.

    Installs docker.io and debootstrap from Debian and starts dockerd when missing. Cached: an
    image whose tag exists is reused; the Lifeline image reuses Docker's layer cache.
    """
    from lifeline.kindbed import engine, images, nodeimage

    names = what or list(_WHAT)
    bad = [w for w in names if w not in _WHAT]
    if bad:
        raise typer.BadParameter(f"unknown {bad}; choose from {', '.join(_WHAT)}")
    engine.ensure_engine()
    built: dict[str, dict] = {}
    for w in names:
        t0 = time.monotonic()
        refs = {"base": lambda: [images.ensure_base()],
                "services": lambda: list(images.ensure_services().values()),
                "lifeline": lambda: [images.ensure_lifeline(_repo())],
                "node": lambda: [nodeimage.ensure_node_image()]}[w]()
        for ref in refs:
            built[ref] = {"bytes": engine.image_size(ref)}
        built[refs[-1]]["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(built, indent=1))


@app.command()
def up(name: str = _NAME, state_dir: Path = _STATE,
       config: Path = typer.Option(Path("kind-config.yaml"), "--config", help="kind's cluster config."),
       load: bool = typer.Option(True, "--load/--no-load", help="Load the Lifeline, Redis and MinIO images.")):
    """Create the kind cluster (node image built if missing), network it, and load the images."""
    from lifeline.kindbed import chart, images, nodeimage
    from lifeline.kindbed.cluster import KindCluster

    nodeimage.ensure_node_image()
    c = KindCluster.up(name, state_dir, config=config)
    if load:
        images.ensure_services()
        images.ensure_lifeline(_repo(), rebuild=False)
        c.load(*chart.service_images())
    print(f"export KUBECONFIG={c.kubeconfig}")


@app.command("load")
def load_images(images_: Optional[list[str]] = typer.Argument(None, metavar="IMAGE...",
                                                                 help="Default: the Lifeline, Redis and MinIO images."),
                name: str = _NAME, state_dir: Path = _STATE,
                rebuild: bool = typer.Option(False, "--rebuild", help="Rebuild lifeline:dev from this checkout first.")):
    """Load local images into the workers' containerd (``kind load docker-image``)."""
    from lifeline.kindbed import chart, images
    from lifeline.kindbed.cluster import KindCluster

    if rebuild:
        images.ensure_lifeline(_repo())
    KindCluster(name, state_dir).load(*(images_ or chart.service_images()))


@app.command()
def install(name: str = _NAME, state_dir: Path = _STATE,
            release: str = typer.Option("lifeline", "--release"),
            namespace: str = typer.Option("lifeline", "--namespace", "-n"),
            set_: Optional[list[str]] = typer.Option(None, "--set", help="Extra chart values, KEY=VALUE.")):
    """``helm install`` helm/lifeline with the in-cluster Redis and MinIO built here; await them Ready."""
    from lifeline.kindbed import chart
    from lifeline.kindbed.cluster import KindCluster

    values = dict(s.split("=", 1) for s in set_ or [])
    chart.install(KindCluster(name, state_dir), _repo() / "helm" / "lifeline", release=release,
                  namespace=namespace, values=values)
    print(f"installed {release} in {namespace}")


@app.command()
def down(name: str = _NAME, state_dir: Path = _STATE):
    """Delete the cluster (its node containers); images stay cached."""
    from lifeline.kindbed.cluster import KindCluster

    KindCluster(name, state_dir).down()
