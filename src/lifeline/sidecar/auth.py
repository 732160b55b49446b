"""Mutual HMAC-SHA256 challenge–response on every sidecar-to-sidecar connection.

Protocol (control frames, see :mod:`lifeline.sidecar.frames`)::

    server → client  {"op": "challenge", "nonce": Ns}
    client → server  {"op": "auth", "job": J, "nonce": Nc, "frames": V, "mac": HMAC(secret, "client"|J|Ns|Nc|V)}
    server → client  {"op": "ok", "mac": HMAC(secret, "server"|J|Nc|Ns|V)}     (or nothing: closed)

Nonces are 32 random bytes (hex). ``V`` is :data:`FRAME_PROTOCOL`, the version of the authenticated
frame layout that follows the handshake (:mod:`lifeline.sidecar._channel`); both MACs cover it, and
a server of another version refuses the client. A client that presents a wrong or missing MAC gets
no further frame: the server logs the attempt and closes the connection. The client checks the
server's MAC too, so a sidecar never sends shard bytes to an impostor. Both functions return the
two nonces, from which :mod:`lifeline.sidecar._channel` derives the connection's frame keys.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import socket
from typing import Any

from lifeline.errors import AuthError, PeerError
from lifeline.sidecar.frames import (
    CTRL,
    recv_ctrl,
    recv_header,
    recv_into_exact,
    send_ctrl,
)

__all__ = ["FRAME_PROTOCOL", "server_handshake", "client_handshake"]

log = logging.getLogger("lifeline.sidecar.auth")

FRAME_PROTOCOL = "frames-v1/aes256-gmac"  # the frame layout after the handshake (docs/sidecar.md)
_MAX_AUTH_BYTES = 4096  # the client's auth message is ~300 bytes; an unauthenticated peer gets no more room


def _mac(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def _is_hex(x: object, n: int) -> bool:
    """``x`` is a string of ``n`` hexadecimal digits."""
    return isinstance(x, str) and len(x) == n and all(c in "0123456789abcdefABCDEF" for c in x)


def server_handshake(sock: socket.socket, *, secret: bytes, job: str, peer: str = "?") -> tuple[bytes, bytes]:
    """Authenticate an accepted connection; returns when the client proved the job secret.

    Returns:
        ``(Ns, Nc)``: the server's and the client's nonce (32 bytes each).

    Raises:
        AuthError: wrong or missing MAC, a different job, or another frame protocol version (the
            connection should be closed; nothing was sent to the peer beyond the challenge).
        PeerError: the client disconnected or spoke out of protocol.
    """
    nonce_s = secrets.token_hex(32)
    send_ctrl(sock, {"op": "challenge", "nonce": nonce_s})
    msg = _recv_auth(sock)
    nonce_c = msg.get("nonce")
    mac = msg.get("mac")
    proto = msg.get("frames")
    if msg.get("op") != "auth" or not _is_hex(nonce_c, 64) or not _is_hex(mac, 64) or not isinstance(proto, (str, type(None))):
        log.warning("peer %s sent no valid authentication; refused", peer, extra={"peer": peer, "job": job})
        raise AuthError(f"peer {peer} sent no valid authentication", job=job)
    versioned = () if proto is None else (proto,)  # a sidecar before frames-v1 sent no version (and MACed none)
    if msg.get("job") != job or not hmac.compare_digest(mac, _mac(secret, "client", job, nonce_s, nonce_c, *versioned)):
        log.warning("peer %s failed HMAC authentication; refused", peer, extra={"peer": peer, "job": job})
        raise AuthError(f"peer {peer} failed HMAC authentication (wrong job secret)", job=job)
    if proto != FRAME_PROTOCOL:
        log.warning("peer %s speaks frame protocol %s, not %s; refused", peer, proto or "frames-v0", FRAME_PROTOCOL)
        raise AuthError(f"peer {peer} speaks frame protocol {proto or 'frames-v0 (no frame MACs)'}, this sidecar "
                        f"{FRAME_PROTOCOL}: every sidecar of a job must run the same Lifeline version", job=job)
    send_ctrl(sock, {"op": "ok", "mac": _mac(secret, "server", job, nonce_c, nonce_s, proto)})
    return bytes.fromhex(nonce_s), bytes.fromhex(nonce_c)


def _recv_auth(sock: socket.socket) -> dict[str, Any]:
    """The client's first frame as a JSON object, or ``{}`` when it is anything else (then refused).

    Raises:
        PeerError: the client disconnected before a whole frame header.
    """
    ftype, _crc, length = recv_header(sock)
    if ftype != CTRL or length > _MAX_AUTH_BYTES:
        return {}
    buf = bytearray(length)
    recv_into_exact(sock, memoryview(buf))
    try:
        msg = json.loads(buf)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}


def client_handshake(sock: socket.socket, *, secret: bytes, job: str, peer: str = "?") -> tuple[bytes, bytes]:
    """Prove the job secret to the server at the other end and check its proof back.

    Returns:
        ``(Ns, Nc)``: the server's and the client's nonce (32 bytes each).

    Raises:
        AuthError: the server refused us (closed after our MAC) or its own MAC is wrong.
        PeerError: the server disconnected or spoke out of protocol.
    """
    msg = recv_ctrl(sock)
    nonce_s = msg.get("nonce")
    if msg.get("op") != "challenge" or not _is_hex(nonce_s, 64):
        raise PeerError(f"peer {peer} sent no challenge", job=job)
    nonce_c = secrets.token_hex(32)
    proto = FRAME_PROTOCOL
    send_ctrl(sock, {"op": "auth", "job": job, "nonce": nonce_c, "frames": proto,
                     "mac": _mac(secret, "client", job, nonce_s, nonce_c, proto)})
    try:
        reply = recv_ctrl(sock)
    except (PeerError, OSError) as err:
        raise AuthError(f"peer {peer} refused our authentication (is LIFELINE_SECRET the job's?)", job=job) from err
    mac = reply.get("mac")
    if reply.get("op") != "ok" or not _is_hex(mac, 64) or not hmac.compare_digest(
        mac, _mac(secret, "server", job, nonce_c, nonce_s, proto)
    ):
        log.warning("peer %s failed to prove the job secret", peer)
        raise AuthError(f"peer {peer} failed to prove the job secret", job=job)
    return bytes.fromhex(nonce_s), bytes.fromhex(nonce_c)
