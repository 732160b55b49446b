"""A real fake-gcs-server (a Google Cloud Storage emulator, github.com/fsouza/fake-gcs-server) on loopback, for tests.

The server is built from source by :mod:`lifeline.devcluster.build` (component ``fake-gcs-server``,
pinned :data:`~lifeline.devcluster.build.FAKE_GCS_SERVER_VERSION`: ``go install`` through the Go
module proxy into the versioned cache, once; ``build.binary("fake-gcs-server")``).

:class:`FakeGCSServer` serves GCS's JSON API (uploads: multipart and resumable; ranged downloads;
listing; compose) over plain HTTP on ``127.0.0.1`` and a free port, anonymously (no credentials are
checked), with the objects in memory (``backend="memory"``, the default: GCS's flat name space) or
under its state directory (``backend="filesystem"``: they survive :meth:`~FakeGCSServer.restart`, but
object names become paths, so ``a`` and ``a/b`` cannot both exist). ``-public-host`` and
``-external-url`` name the server's own address, so the URLs it hands out (a resumable upload's
session) point back to it. :meth:`~FakeGCSServer.start` returns once the JSON API answers (polled with
a deadline). A context manager, like the servers of :mod:`lifeline.devcluster.services`.

Example::

    with FakeGCSServer() as gcs:
        GCSStorage("ckpt", endpoint=gcs.endpoint, credentials="anonymous").put("k", b"v")
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from lifeline.devcluster import build
from lifeline.devcluster.services import _Server
from lifeline.errors import ClusterError

__all__ = ["FakeGCSServer"]


class FakeGCSServer(_Server):
    """A real fake-gcs-server on ``127.0.0.1`` (built from source on first use, see :mod:`lifeline.devcluster.build`).

    Args:
        backend: ``"memory"`` (default) or ``"filesystem"`` (objects under ``state_dir/data``).

    Attributes:
        endpoint: the JSON API's base URL, ``http://127.0.0.1:PORT`` (plain HTTP; anonymous access).
        port: the TCP port (int).
    """

    name = "fake-gcs-server"

    def __init__(self, *, state_dir: str | Path | None = None, port: int | None = None, backend: str = "memory",
                 startup_timeout: float = 60.0) -> None:
        if backend not in ("memory", "filesystem"):
            raise ClusterError(f"fake-gcs-server backend {backend!r}: use 'memory' or 'filesystem'", field="backend")
        super().__init__(state_dir=state_dir, port=port, startup_timeout=startup_timeout)
        self.backend = backend

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        self._binary = build.binary("fake-gcs-server")  # builds on first use
        return super().start()

    def _env(self) -> dict[str, str]:
        # its FAKE_GCS_* variables would set what the flags leave out (pub/sub events, a seed directory)
        return {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GCS_")}

    def _argv(self, port: int) -> list[str]:
        address = f"127.0.0.1:{port}"
        return [str(self._binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                "-public-host", address, "-external-url", f"http://{address}",
                "-backend", self.backend, "-filesystem-root", str(self.state_dir / "data")]

    def _answers(self) -> bool:
        # the JSON API's bucket list: the emulator's answer, not merely an open port
        with urllib.request.urlopen(f"http://127.0.0.1:{self._port}/storage/v1/b", timeout=1) as resp:  # noqa: S310
            return json.loads(resp.read()).get("kind") == "storage#buckets"
