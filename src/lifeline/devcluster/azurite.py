"""A real Azurite (the Azure Storage emulator) blob service on loopback, for tests.

Azurite is installed from npm, pinned (:data:`AZURITE_VERSION`), once into the cache
(``<cache root>/azurite-<version>``, the root of :func:`lifeline.devcluster.build.cache_root`):
``npm install --prefix <staging> azurite@<version>``, then the staging directory is renamed into
place and a ``.complete`` marker (JSON: version, install seconds) is written last; an entry
without it is half-written and reinstalled. An exclusive ``flock`` per entry makes concurrent
sessions install once. Needs ``npm`` (and Node.js 18 or newer) on PATH.

:class:`AzuriteServer` runs only the blob service (``azurite-blob``) on ``127.0.0.1`` and a free
port, with its data in a state directory, no telemetry, and the API version check skipped (the
SDK may speak a newer version than the emulator knows); :meth:`~AzuriteServer.start` returns
once the service answers HTTP (polled with a deadline). A context manager, like the servers
of :mod:`lifeline.devcluster.services`.

Example::

    with AzuriteServer() as az:
        AzureStorage(az.endpoint, az.account, az.key, "ckpt").put("k", b"v")
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
import urllib.error
import urllib.request
from pathlib import Path

from lifeline.devcluster.build import cache_root
from lifeline.devcluster.services import _Server
from lifeline.errors import BuildError

__all__ = ["AZURITE_VERSION", "DEV_ACCOUNT", "DEV_KEY", "AzuriteServer", "ensure_azurite"]

AZURITE_VERSION = "3.37.0"
DEV_ACCOUNT = "devstoreaccount1"
"""Azurite's well-known development account."""
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""The development account's well-known key (public, documented by Microsoft: not a secret)."""

_MARKER = ".complete"


def _entry() -> Path:
    return cache_root() / f"azurite-{AZURITE_VERSION}"


def _blob_bin(entry: Path) -> Path:
    return entry / "node_modules" / ".bin" / "azurite-blob"


def _complete(entry: Path) -> bool:
    try:
        marker = json.loads((entry / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == AZURITE_VERSION and _blob_bin(entry).exists()


def ensure_azurite(*, log=None) -> Path:
    """Path of the ``azurite-blob`` launcher of Azurite :data:`AZURITE_VERSION`, installing it from npm
    into the cache first when missing or half-written.

    Args:
        log: callable taking one progress line (default: print to stderr).

    Raises:
        BuildError: no ``npm`` on PATH, or ``npm install`` failed (its output's tail included).
    """
    entry = _entry()
    if _complete(entry):
        return _blob_bin(entry)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    npm = shutil.which("npm")
    if not npm:
        raise BuildError("no npm on PATH: the Azure tests run the Azurite emulator, installed from npm. Install "
                         "Node.js 18+ with npm (Debian: `apt-get install nodejs npm`) and rerun.", key="azurite")
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(entry):  # another process installed it while we waited
            return _blob_bin(entry)
        if entry.exists():
            log(f"[azurite] {entry} is half-written (no valid {_MARKER}); removing and reinstalling")
            shutil.rmtree(entry)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        try:
            t0 = time.monotonic()
            log(f"[azurite] npm install azurite@{AZURITE_VERSION} -> {entry}")
            proc = subprocess.run([npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                                   "--ignore-scripts", "--no-save", f"azurite@{AZURITE_VERSION}"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, cwd=staging)
            if proc.returncode != 0 or not _blob_bin(staging).exists():
                tail = "\n".join(proc.stdout.splitlines()[-30:])
                raise BuildError(f"npm install azurite@{AZURITE_VERSION} failed (exit {proc.returncode}):\n{tail}",
                                 key="azurite")
            staging.rename(entry)  # .bin holds relative links: they survive the rename
            seconds = time.monotonic() - t0
            tmp = entry / f"{_MARKER}.tmp"
            tmp.write_text(json.dumps({"version": AZURITE_VERSION, "install_seconds": round(seconds, 1)}))
            os.replace(tmp, entry / _MARKER)
            log(f"[azurite] installed in {seconds:.0f}s")
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return _blob_bin(entry)


class AzuriteServer(_Server):
    """A real Azurite blob service on ``127.0.0.1`` (installed from npm on first use, see :func:`ensure_azurite`).

    Attributes:
        endpoint: the blob account URL, ``http://127.0.0.1:PORT/devstoreaccount1`` (plain HTTP).
        account, key: the development account's name and well-known key (:data:`DEV_ACCOUNT`, :data:`DEV_KEY`).
        connection_string: the same as an Azure connection string.
        port: the TCP port (int).
    """

    name = "azurite"
    account = DEV_ACCOUNT
    key = DEV_KEY

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT/devstoreaccount1``."""
        return f"http://127.0.0.1:{self.port}/{self.account}"

    @property
    def connection_string(self) -> str:
        """``DefaultEndpointsProtocol=http;AccountName=...;AccountKey=...;BlobEndpoint=<endpoint>;``."""
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
                f"BlobEndpoint={self.endpoint};")

    def start(self):
        self._binary = ensure_azurite()  # installs on first use
        return super().start()

    def _argv(self, port: int) -> list[str]:
        return [str(self._binary), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                "--location", str(self.state_dir / "data"), "--skipApiVersionCheck", "--loose",
                "--disableTelemetry", "--silent"]

    def _answers(self) -> bool:
        # an unsigned request: any answer from the blob service (here a 403) means it is up
        url = f"http://127.0.0.1:{self._port}/{self.account}?comp=list"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback only
                server = resp.headers.get("Server", "")
        except urllib.error.HTTPError as err:
            server = err.headers.get("Server", "")
        return server.startswith("Azurite-Blob")
