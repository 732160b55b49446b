"""The sidecar's side of the peer protocol on TCP (one thread per authenticated connection).

See :mod:`lifeline.sidecar.peer` for the requests. Every frame is authenticated
(:mod:`lifeline.sidecar._channel`): one that fails its tag or sequence check closes the
connection, counts ``errors_total{kind="auth"}`` and drops the transfer it belonged to. A
received blob is written straight into its final buffer (bounded by the memory bound, refused
beyond it); a shard's checksum blocks are verified as they arrive (:mod:`._verify`), an
upstream-log entry's frame and entry crc32c on arrival; the holding is registered and
acknowledged only after every byte checked out (and every frame's tag). A peer that disconnects
mid-transfer leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import TYPE_CHECKING

from lifeline.errors import AuthError, ChecksumError, LifelineError, PeerError
from lifeline.sidecar import _format
from lifeline.sidecar._channel import Channel
from lifeline.sidecar.frames import crc32c
from lifeline.sidecar._verify import BlobVerifier
from lifeline.sidecar.store import Holding

if TYPE_CHECKING:  # what these handlers may use of the sidecar (no import of server: no circle)
    from lifeline.sidecar._roles import PeerSide

log = logging.getLogger("lifeline.sidecar.peer")

_PIECE = 1 << 20  # bytes per recv_into: verified while still in the CPU cache


def serve_peer(sc: PeerSide, conn: socket.socket, addr) -> None:
    """Authenticate, then serve requests until the peer closes (or a frame is refused)."""
    peer = f"{addr[0]}:{addr[1]}"
    conn.settimeout(60.0)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:  # every AuthError (handshake or frame) is counted by the hook, once
        ch = Channel.accept(conn, secret=sc.secret, job=sc.job, peer=peer,
                            on_refuse=lambda err: sc.metrics.errors.labels("auth").inc())
    except AuthError:
        return
    except (PeerError, OSError):
        sc.metrics.errors.labels("peer").inc()
        return
    try:
        _serve(sc, ch, peer)
    except (PeerError, OSError):  # refused frames were reported by the channel; a vanished peer is no error
        pass
    finally:
        ch.close()


def _serve(sc: PeerSide, ch: Channel, peer: str) -> None:
    while not sc.stopping.is_set():
        msg = ch.recv_ctrl()
        op = msg.get("op")
        try:
            if op == "put":
                if not _put(sc, ch, msg, peer):
                    return
            elif op == "get":
                _get(sc, ch, msg)
            elif op == "delete":
                h = sc.store.get(msg["kind"], int(msg["step"]), int(msg["rank"]), msg.get("name", ""))
                if h is not None:
                    sc.store.remove(h)
                ch.send_ctrl({"op": "ok"})
            else:
                ch.send_ctrl({"op": "error", "error": f"unknown request {op!r}"})
        except (KeyError, ValueError, TypeError) as err:
            sc.metrics.errors.labels("protocol").inc()
            ch.send_ctrl({"op": "error", "error": f"bad request: {err}"})


def verify_blob(kind: str, meta: str, blob: memoryview, *, step: int, rank: int) -> None:
    """Verify a received blob: shard chunk checksums, or an upstream-log entry's crc32c."""
    if kind == "shard":
        _format.verify(meta, blob, rank=rank, step=step, tier="L1")
    else:
        expected = json.loads(meta)["crc32c"]
        if crc32c(blob) != expected:
            raise ChecksumError("upstream-log entry failed its crc32c", rank=rank, step=step, tier="L1")


def _put(sc: PeerSide, ch: Channel, msg: dict, peer: str) -> bool:
    kind, name = msg["kind"], msg.get("name", "")
    step, rank, n, meta = int(msg["step"]), int(msg["rank"]), int(msg["nbytes"]), msg["meta"]
    if kind not in ("shard", "ulog") or n < 0:
        ch.send_ctrl({"op": "error", "error": f"bad put of kind {kind!r} and {n} bytes"})
        return True
    if not sc.store.make_room(n):
        sc.metrics.errors.labels("memory").inc()
        log.warning("refused %d bytes from %s: over LIFELINE_MEMORY_BYTES", n, peer)
        ch.send_ctrl({"op": "error", "error": "memory bound reached", "kind": "memory"})
        return True
    buf = sc.take_buffer(n)
    verifier = None
    if kind == "shard":
        try:  # every checksum block is verified as soon as its bytes have arrived
            verifier = BlobVerifier(meta, buf, rank=rank, step=step, tier="L1")
        except (LifelineError, ValueError, KeyError, TypeError) as err:  # unreadable metadata
            sc.give_buffer(buf)
            sc.metrics.errors.labels("protocol").inc()
            ch.send_ctrl({"op": "error", "error": f"bad shard metadata: {err}"})
            return True
    ch.send_ctrl({"op": "ready"})
    got = 0
    try:
        while got < n:
            base = got
            progress = None if verifier is None else (lambda r, base=base: verifier.check(base + r))
            got += ch.recv_data_into(buf[got:], progress=progress, piece=_PIECE)
        if verifier is not None:
            verifier.finish()
        else:
            verify_blob(kind, meta, buf, step=step, rank=rank)
    except AuthError as err:  # a frame failed its tag or sequence check: counted by the channel, closed
        sc.give_buffer(buf)
        log.warning("discarded %s step %d rank %d from %s (%d of %d bytes): %s", kind, step, rank, peer, got, n, err)
        return False
    except ChecksumError as err:
        sc.give_buffer(buf)
        sc.report_corrupt(err, "L1", f"transfer from {peer}")
        ch.send_ctrl({"op": "error", "error": str(err), "kind": "checksum"})
        return False
    except (PeerError, OSError) as err:
        sc.give_buffer(buf)
        sc.metrics.errors.labels("peer").inc()
        log.warning("peer %s disconnected mid-transfer of %s step %d rank %d (%d of %d bytes); discarded: %s",
                    peer, kind, step, rank, got, n, err)
        return False
    h = Holding(kind, step, rank, n, buf, meta, "L1", None, name)
    sc.store.add(h, keep=sc.s.keep if kind == "shard" else None)
    if kind == "shard":
        sc.catalog_try(sc.catalog.add_holding, step, rank, "L1", sc.rank, meta)
    sc.update_gauges()
    ch.send_ctrl({"op": "ack"})
    return True


def _get(sc: PeerSide, ch: Channel, msg: dict) -> None:
    kind, name, step, rank = msg["kind"], msg.get("name", ""), int(msg["step"]), int(msg["rank"])
    h = sc.store.pin(kind, step, rank, name)
    if h is None:
        ch.send_ctrl({"op": "error", "error": f"{kind} {name} step {step} rank {rank} is not held here",
                         "kind": "missing"})
        return
    try:
        off = int(msg.get("offset") or 0)
        length = msg.get("length")
        end = h.nbytes if length is None else off + int(length)
        if off < 0 or end > h.nbytes or off > end:
            raise LifelineError(f"byte range [{off}, {end}) outside the {h.nbytes}-byte blob")
        view = h.buf[off:end]
        ch.send_ctrl({"op": "data", "nbytes": len(view), "meta": h.meta})
        chunk = sc.s.chunk_bytes
        for o in range(0, len(view), chunk):  # shard bytes are verified by chunk checksums at the reader
            ch.send_data(view[o : o + chunk], checksum=kind != "shard")
    except LifelineError as err:
        ch.send_ctrl({"op": "error", "error": str(err)})
    finally:
        sc.unpin(h)
