"""Sidecar-to-sidecar protocol over TCP: the peer client (replication, restore, upstream logs).

After the mutual HMAC handshake (:mod:`lifeline.sidecar.auth`) a connection carries any number of
requests, each a control frame answered by a control frame (plus data frames); every frame carries
a sequence number and an AES-GMAC tag under a per-connection, per-direction key
(:mod:`lifeline.sidecar._channel`), so the receiver acknowledges only bytes that are authentic:

* ``put`` ``{kind, name, step, rank, nbytes, meta}`` → ``ready`` | ``error``; then the blob in data
  frames of at most ``chunk_bytes`` (upstream logs: each with its crc32c, checked on arrival;
  shards: every checksum block verified against ``meta`` as it arrives); the receiver registers its
  holding *before* answering ``ack`` (or ``error``: the copy is discarded).
* ``get`` ``{kind, name, step, rank, offset, length}`` → ``data {nbytes, meta}`` + data frames |
  ``error {missing}``. Byte ranges serve resharding restores.
* ``delete`` ``{kind, name, step, rank}`` → ``ok`` (upstream-log garbage collection).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from lifeline.errors import AuthError, ChecksumError, PeerError
from lifeline.sidecar._channel import Channel

__all__ = ["PeerClient"]


class PeerClient:
    """An authenticated connection to one peer sidecar.

    Args:
        host, port: the peer's pod IP and peer port (from the catalog).
        secret: the job secret (bytes).
        job: the job name.
        chunk_bytes: bytes per data frame when sending.
        timeout: socket timeout in seconds.
        source: local address to bind (so a sidecar speaks from its pod IP).
        on_refuse: called with every :class:`AuthError` of this connection (handshake or a frame
            that failed its tag or sequence check) before it is raised; the sidecar counts
            ``errors_total{kind="auth"}`` with it.

    Raises:
        PeerError: cannot connect; AuthError: the handshake failed.

    Every method raises :class:`AuthError` (a :class:`PeerError`) when a frame from the peer fails
    its authentication; the connection is then closed and the client must be dropped.
    """

    def __init__(
        self, host: str, port: int, *, secret: bytes, job: str, chunk_bytes: int = 4 << 20, timeout: float = 30.0,
        source: str | None = None, on_refuse: Callable[[AuthError], None] | None = None,
    ) -> None:
        self.peer = f"{host}:{port}"
        self.chunk_bytes = chunk_bytes
        self.job = job
        try:
            self.sock = socket.create_connection(
                (host, port), timeout=timeout, source_address=(source, 0) if source else None
            )
        except OSError as err:
            raise PeerError(f"cannot connect to peer sidecar {self.peer}: {err}", job=job) from err
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # buffers: kernel autotuning
        self.chan = Channel.connect(self.sock, secret=secret, job=job, peer=self.peer, on_refuse=on_refuse)

    def _err(self, msg: dict[str, Any], what: str, **ctx) -> PeerError:
        if msg.get("kind") == "checksum":
            return ChecksumError(f"peer {self.peer} rejected {what}: {msg.get('error')}", job=self.job, tier="L1", **ctx)
        err = PeerError(f"peer {self.peer} refused {what}: {msg.get('error')}", job=self.job, **ctx)
        err.missing = msg.get("kind") == "missing"  # type: ignore[attr-defined]  # the peer does not hold it
        return err

    def put(self, *, kind: str, step: int, rank: int, blob: memoryview, meta: str, name: str = "") -> None:
        """Stream ``blob`` to the peer; returns once the peer verified and registered it.

        Raises:
            PeerError: refused (e.g. memory bound), disconnected mid-transfer.
            ChecksumError: the peer found the bytes corrupt (nothing was kept).
        """
        blob = memoryview(blob).cast("B")
        n = len(blob)
        try:
            ch = self.chan
            ch.send_ctrl({"op": "put", "kind": kind, "name": name, "step": step, "rank": rank, "nbytes": n, "meta": meta})
            reply = ch.recv_ctrl()
            if reply.get("op") != "ready":
                raise self._err(reply, f"{kind} {name} step {step} rank {rank}", step=step, rank=rank)
            for off in range(0, n, self.chunk_bytes):  # shards: the receiver checks every chunk's checksum
                ch.send_data(blob[off : off + self.chunk_bytes], checksum=kind != "shard")
            reply = ch.recv_ctrl()
        except OSError as err:
            raise PeerError(f"peer {self.peer} disconnected during put: {err}", job=self.job, step=step, rank=rank) from err
        if reply.get("op") != "ack":
            raise self._err(reply, f"{kind} {name} step {step} rank {rank}", step=step, rank=rank)

    def get(
        self, *, kind: str, step: int, rank: int, name: str = "", offset: int = 0, length: int | None = None,
        into: memoryview | None = None,
    ) -> tuple[memoryview, str]:
        """Fetch a held blob (or the byte range ``[offset, offset+length)``) with its metadata JSON.

        Bytes land in ``into`` when given (must be large enough), else in a new bytearray.
        Frames that carry a crc32c (upstream logs) are checked on arrival; for shards the caller
        verifies the chunk checksums.

        Raises:
            PeerError: the peer does not hold it or disconnected; ChecksumError: a frame was corrupt.
        """
        try:
            self.chan.send_ctrl({"op": "get", "kind": kind, "name": name, "step": step, "rank": rank, "offset": offset, "length": length})
            reply = self.chan.recv_ctrl()
            if reply.get("op") != "data":
                raise self._err(reply, f"get {kind} {name} step {step} rank {rank}", step=step, rank=rank)
            n = int(reply["nbytes"])
            if into is None:
                into = memoryview(bytearray(n))
            elif len(into) < n:
                raise PeerError(f"peer {self.peer} offers {n} bytes, more than the {len(into)} room", step=step, rank=rank)
            got = 0
            while got < n:
                got += self.chan.recv_data_into(into[got:n])
        except OSError as err:
            raise PeerError(f"peer {self.peer} disconnected during get: {err}", job=self.job, step=step, rank=rank) from err
        return into[:n], reply.get("meta", "")

    def delete(self, *, kind: str, step: int, rank: int, name: str = "") -> None:
        """Drop a holding on the peer (no error when it is not held).

        Raises:
            PeerError: the peer refused or disconnected.
        """
        try:
            self.chan.send_ctrl({"op": "delete", "kind": kind, "name": name, "step": step, "rank": rank})
            reply = self.chan.recv_ctrl()
        except OSError as err:
            raise PeerError(f"peer {self.peer} disconnected during delete: {err}", job=self.job) from err
        if reply.get("op") != "ok":
            raise self._err(reply, "delete")

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self.chan.close()

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
