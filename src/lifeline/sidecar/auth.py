"""Mutual HMAC-SHA256 challenge–response on every sidecar-to-sidecar connection.

Protocol (control frames, see :mod:`lifeline.sidecar._frames`)::

    server → client  {"op": "challenge", "nonce": Ns}
    client → server  {"op": "auth", "job": J, "nonce": Nc, "mac": HMAC(secret, "client"|J|Ns|Nc)}
    server → client  {"op": "ok", "mac": HMAC(secret, "server"|J|Nc|Ns)}     (or nothing: closed)

Nonces are 32 random bytes (hex). A client that presents a wrong or missing MAC gets no
further frame: the server logs the attempt and closes the connection. The client checks the
server's MAC too, so a sidecar never sends shard bytes to an impostor.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket

from lifeline.errors import AuthError, PeerError
from lifeline.sidecar._frames import recv_ctrl, send_ctrl

__all__ = ["server_handshake", "client_handshake"]

log = logging.getLogger("lifeline.sidecar.auth")


def _mac(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def server_handshake(sock: socket.socket, *, secret: bytes, job: str, peer: str = "?") -> None:
    """Authenticate an accepted connection; returns when the client proved the job secret.

    Raises:
        AuthError: wrong or missing MAC, or a different job (the connection should be closed;
            nothing was sent to the peer beyond the challenge).
        PeerError: the client disconnected or spoke out of protocol.
    """
    nonce_s = secrets.token_hex(32)
    send_ctrl(sock, {"op": "challenge", "nonce": nonce_s})
    msg = recv_ctrl(sock)
    nonce_c = msg.get("nonce")
    mac = msg.get("mac")
    if msg.get("op") != "auth" or not isinstance(nonce_c, str) or not isinstance(mac, str) or len(nonce_c) != 64:
        log.warning("peer %s sent no valid authentication; refused", peer, extra={"peer": peer, "job": job})
        raise AuthError(f"peer {peer} sent no valid authentication", job=job)
    if msg.get("job") != job or not hmac.compare_digest(mac, _mac(secret, "client", job, nonce_s, nonce_c)):
        log.warning("peer %s failed HMAC authentication; refused", peer, extra={"peer": peer, "job": job})
        raise AuthError(f"peer {peer} failed HMAC authentication (wrong job secret)", job=job)
    send_ctrl(sock, {"op": "ok", "mac": _mac(secret, "server", job, nonce_c, nonce_s)})


def client_handshake(sock: socket.socket, *, secret: bytes, job: str, peer: str = "?") -> None:
    """Prove the job secret to the server at the other end and check its proof back.

    Raises:
        AuthError: the server refused us (closed after our MAC) or its own MAC is wrong.
        PeerError: the server disconnected or spoke out of protocol.
    """
    msg = recv_ctrl(sock)
    nonce_s = msg.get("nonce")
    if msg.get("op") != "challenge" or not isinstance(nonce_s, str):
        raise PeerError(f"peer {peer} sent no challenge", job=job)
    nonce_c = secrets.token_hex(32)
    send_ctrl(sock, {"op": "auth", "job": job, "nonce": nonce_c, "mac": _mac(secret, "client", job, nonce_s, nonce_c)})
    try:
        reply = recv_ctrl(sock)
    except (PeerError, OSError) as err:
        raise AuthError(f"peer {peer} refused our authentication (is LIFELINE_SECRET the job's?)", job=job) from err
    mac = reply.get("mac")
    if reply.get("op") != "ok" or not isinstance(mac, str) or not hmac.compare_digest(
        mac, _mac(secret, "server", job, nonce_c, nonce_s)
    ):
        log.warning("peer %s failed to prove the job secret", peer)
        raise AuthError(f"peer {peer} failed to prove the job secret", job=job)
