"""Authenticated frames between sidecars: every frame after the handshake carries a MAC.

The handshake (:mod:`lifeline.sidecar.auth`) proves the job secret both ways and yields two fresh
nonces ``Ns`` (server) and ``Nc`` (client). From them and the secret, each side derives one key
per direction (HKDF-SHA256, 32 bytes each)::

    K_cs = HKDF(secret, salt=Ns|Nc, info="lifeline/sidecar/" + FRAME_PROTOCOL + "|" + job + "|client->server")
    K_sc = HKDF(secret, salt=Ns|Nc, info="lifeline/sidecar/" + FRAME_PROTOCOL + "|" + job + "|server->client")

Wire format of one authenticated frame (all integers big-endian)::

    header  24 bytes  !BB2xIQQ: type (u8: 1 control, 2 data), flags (u8; bit 0: the crc field is
                      set), 2 zero bytes, crc32c of the payload (u32), payload length (u64),
                      sequence number (u64: 0, 1, 2, ... per direction and connection)
    payload length bytes (control: UTF-8 JSON object; data: raw bytes)
    tag     16 bytes  AES-256-GCM(K_dir, nonce = 4 zero bytes | seq (u64), plaintext = empty,
                      associated data = header | payload).tag — i.e. AES-GMAC of the whole frame

The tag binds the direction (its key), the connection (both nonces), the position in the stream
(the sequence number, in the header and as the GCM nonce) and every header and payload byte. A
frame tampered with, replayed (its sequence number is spent), reordered, reflected back to its
sender (the other direction's key), injected, or carried over from another connection fails its
tag or its sequence check: the receiver closes the connection, logs a warning, calls the
``on_refuse`` hook (the sidecar counts ``errors_total{kind="auth"}``) and raises
:class:`~lifeline.errors.AuthError`; the caller keeps and acknowledges nothing of that transfer.
GCM nonces never repeat under one key: the keys are fresh per connection and the counter is never
reset. GMAC was chosen by measurement (``scripts/bench_frame_mac.py``; docs/sidecar.md): about 20
GB/s on 1 MiB pieces here (AES-NI, VPCLMULQDQ), against 12 for Poly1305 and 1.8 for HMAC-SHA256,
and fed incrementally, piece by piece, as ``recv_into`` fills the destination buffer.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lifeline.errors import AuthError, ChecksumError, PeerError
from lifeline.sidecar.frames import (
    CTRL,
    DATA,
    HAS_CRC,
    MAX_CTRL_BYTES,
    crc32c,
    recv_into_exact,
    sendall_parts,
)
from lifeline.sidecar.auth import FRAME_PROTOCOL, client_handshake, server_handshake

__all__ = ["HEADER", "TAG_BYTES", "Channel", "derive_keys"]

log = logging.getLogger("lifeline.sidecar.channel")

HEADER = struct.Struct("!BB2xIQQ")
TAG_BYTES = 16
_NONCE = struct.Struct("!4xQ")
_PIECE = 1 << 20  # bytes per recv_into (and MAC update) unless the caller says otherwise
_SEQ_LIMIT = 1 << 64


def derive_keys(secret: bytes, job: str, nonce_s: bytes, nonce_c: bytes) -> tuple[bytes, bytes]:
    """The connection's frame keys ``(client→server, server→client)``, 32 bytes each (HKDF-SHA256).

    Args:
        secret: the job secret (bytes).
        job: the job name.
        nonce_s, nonce_c: the server's and the client's handshake nonces (32 bytes each).
    """
    def one(direction: str) -> bytes:
        info = f"lifeline/sidecar/{FRAME_PROTOCOL}|{job}|{direction}".encode()
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=nonce_s + nonce_c, info=info).derive(secret)

    return one("client->server"), one("server->client")


def _gmac(key: bytes, seq: int) -> Any:
    """A fresh GMAC context (a GCM encryptor fed associated data only) for frame ``seq``."""
    return Cipher(algorithms.AES(key), modes.GCM(_NONCE.pack(seq))).encryptor()


class Channel:
    """One sidecar-to-sidecar connection after the handshake: frames with tags and sequence numbers.

    Build one with :meth:`connect` (client side) or :meth:`accept` (server side); both run the HMAC
    handshake first. Not thread-safe: one request at a time per connection, as the peer protocol is.

    Args:
        sock: the connected TCP socket (the channel owns it from now on).
        send_key, recv_key: 32-byte AES keys of this side's sending and receiving direction.
        peer: the peer's address, for logs and errors.
        job: the job name, for errors.
        on_refuse: called with the :class:`AuthError` before it is raised, for every refusal
            (handshake or frame); the sidecar counts ``errors_total{kind="auth"}`` with it.
    """

    def __init__(self, sock: socket.socket, *, send_key: bytes, recv_key: bytes, peer: str = "?", job: str = "",
                 on_refuse: Callable[[AuthError], None] | None = None) -> None:
        self.sock, self.peer, self.job, self.on_refuse = sock, peer, job, on_refuse
        self._send_key, self._recv_key = send_key, recv_key
        self._send_seq = 0
        self._recv_seq = 0

    @classmethod
    def connect(cls, sock: socket.socket, *, secret: bytes, job: str, peer: str = "?",
                on_refuse: Callable[[AuthError], None] | None = None) -> Channel:
        """Run the client's handshake on ``sock`` and return the channel.

        Raises:
            AuthError: the handshake failed (reported through ``on_refuse``; ``sock`` is closed).
            PeerError, OSError: the server disconnected or spoke out of protocol (``sock`` is closed).
        """
        return cls._open(sock, client_handshake, client=True, secret=secret, job=job, peer=peer,
                         on_refuse=on_refuse)

    @classmethod
    def accept(cls, sock: socket.socket, *, secret: bytes, job: str, peer: str = "?",
               on_refuse: Callable[[AuthError], None] | None = None) -> Channel:
        """Run the server's handshake on an accepted ``sock`` and return the channel.

        Raises:
            AuthError: the client failed to prove the job secret (reported through ``on_refuse``;
                ``sock`` is closed).
            PeerError, OSError: the client disconnected or spoke out of protocol (``sock`` is closed).
        """
        return cls._open(sock, server_handshake, client=False, secret=secret, job=job, peer=peer,
                         on_refuse=on_refuse)

    @classmethod
    def _open(cls, sock: socket.socket, handshake: Callable[..., tuple[bytes, bytes]], *, client: bool, secret: bytes,
              job: str, peer: str, on_refuse: Callable[[AuthError], None] | None) -> Channel:
        """Run ``handshake`` (closing ``sock`` if it fails) and key the channel for this side."""
        try:
            nonce_s, nonce_c = handshake(sock, secret=secret, job=job, peer=peer)
        except AuthError as err:
            _report(on_refuse, err)
            sock.close()
            raise
        except BaseException:
            sock.close()
            raise
        c2s, s2c = derive_keys(secret, job, nonce_s, nonce_c)
        send, recv = (c2s, s2c) if client else (s2c, c2s)
        return cls(sock, send_key=send, recv_key=recv, peer=peer, job=job, on_refuse=on_refuse)

    # ------------------------------------------------------------------ sending
    def _send(self, ftype: int, flags: int, crc: int, payload: memoryview) -> None:
        seq = self._send_seq
        if seq + 1 >= _SEQ_LIMIT:
            raise PeerError(f"connection to {self.peer} exhausted its frame sequence numbers", job=self.job)
        header = HEADER.pack(ftype, flags, crc, len(payload), seq)
        mac = _gmac(self._send_key, seq)
        mac.authenticate_additional_data(header)
        self._send_seq = seq + 1  # spent even if the send fails: a nonce is never used twice
        if len(payload) <= _PIECE:
            mac.authenticate_additional_data(payload)
            mac.finalize()
            sendall_parts(self.sock, [header, payload, mac.tag])
            return
        # large payloads: each piece is MACed right after the kernel copied it (still in the CPU
        # cache), and the first bytes leave without waiting for a pass over the whole frame; the
        # last piece is MACed first and leaves with the tag (one send, no lone 16-byte segment)
        last = (len(payload) - 1) // _PIECE * _PIECE
        for off in range(0, last, _PIECE):
            piece = payload[off : off + _PIECE]
            sendall_parts(self.sock, [header, piece] if off == 0 else [piece])
            mac.authenticate_additional_data(piece)
        mac.authenticate_additional_data(payload[last:])
        mac.finalize()
        sendall_parts(self.sock, [payload[last:], mac.tag])

    def send_ctrl(self, msg: dict[str, Any]) -> None:
        """Send one control frame holding ``msg`` as JSON. Raises OSError when the socket fails."""
        payload = json.dumps(msg, separators=(",", ":")).encode()
        self._send(CTRL, 0, 0, memoryview(payload))

    def send_data(self, buf: Any, *, checksum: bool = True) -> None:
        """Send one data frame: the bytes of ``buf`` (any buffer), with their crc32c when ``checksum``.

        Raises OSError when the socket fails.
        """
        view = memoryview(buf).cast("B")
        self._send(DATA, HAS_CRC if checksum else 0, crc32c(view) if checksum else 0, view)

    # ------------------------------------------------------------------ receiving
    def refuse(self, reason: str) -> AuthError:
        """Close the connection, log and report (``on_refuse``) a refused frame; return the error to raise."""
        err = AuthError(f"refused a frame from peer {self.peer}: {reason}; connection closed", job=self.job)
        log.warning("refused a frame from peer %s: %s; connection closed", self.peer, reason,
                    extra={"peer": self.peer, "job": self.job})
        _report(self.on_refuse, err)
        self.close()
        return err

    def _header(self) -> tuple[int, int, int, int, Any]:
        """Read the next header: ``(type, flags, crc, length, GMAC context already fed the header)``."""
        hdr = bytearray(HEADER.size)
        try:
            recv_into_exact(self.sock, memoryview(hdr))
        except PeerError as err:
            raise PeerError(f"peer {self.peer}: {err}", job=self.job) from None
        ftype, flags, crc, length, seq = HEADER.unpack(hdr)
        if seq != self._recv_seq:
            raise self.refuse(f"frame out of sequence (number {seq}, expected {self._recv_seq}): replayed, "
                              "reordered or injected")
        if ftype not in (CTRL, DATA) or flags & ~HAS_CRC:
            raise self.refuse(f"unknown frame type {ftype} or flags {flags:#x}")
        mac = _gmac(self._recv_key, seq)
        mac.authenticate_additional_data(bytes(hdr))
        return ftype, flags, crc, length, mac

    def _check_tag(self, mac: Any) -> None:
        """Read the frame's tag and compare; refuses the frame (raises :class:`AuthError`) on a mismatch."""
        tag = bytearray(TAG_BYTES)
        try:
            recv_into_exact(self.sock, memoryview(tag))
        except PeerError as err:
            raise PeerError(f"peer {self.peer} closed the connection before a frame's tag: {err}",
                            job=self.job) from None
        mac.finalize()
        if not hmac.compare_digest(mac.tag, bytes(tag)):
            raise self.refuse("tag mismatch: the frame was altered, reflected or forged")
        self._recv_seq += 1

    def _small(self, length: int, mac: Any) -> bytearray:
        """Read and authenticate a whole payload of at most :data:`MAX_CTRL_BYTES` bytes."""
        if length > MAX_CTRL_BYTES:
            raise self.refuse(f"unexpected frame of {length} bytes")
        buf = bytearray(length)
        recv_into_exact(self.sock, memoryview(buf))
        mac.authenticate_additional_data(buf)
        self._check_tag(mac)
        return buf

    def recv_ctrl(self) -> dict[str, Any]:
        """Read one authenticated control frame and return its JSON object.

        Raises:
            AuthError: the frame failed its sequence or tag check, or a data frame came instead (the
                connection is closed and the refusal reported).
            PeerError: EOF, or an authenticated frame that is not a JSON object.
            OSError: the socket failed (e.g. timed out).
        """
        ftype, _flags, _crc, length, mac = self._header()
        if ftype != CTRL:
            raise self.refuse(f"a data frame of {length} bytes where a control frame was expected")
        buf = self._small(length, mac)
        try:
            msg = json.loads(buf)
        except ValueError as err:
            raise PeerError(f"protocol error: control frame is not JSON ({err})", job=self.job) from None
        if not isinstance(msg, dict):
            raise PeerError("protocol error: control frame is not a JSON object", job=self.job)
        return msg

    def recv_data_into(self, view: memoryview, *, verify: bool = True,
                       progress: Callable[[int], None] | None = None, piece: int = _PIECE) -> int:
        """Read one authenticated data frame straight into ``view`` (which must be large enough).

        The payload comes in ``recv_into`` reads of at most ``piece`` bytes; each piece is fed to
        the frame's GMAC, then ``progress(received)`` is called with the payload bytes received so
        far (e.g. to verify shard checksums while the bytes are in the CPU cache). The tag is
        checked after the last byte: until this returns, the bytes in ``view`` are unauthenticated.

        Returns:
            The payload length in bytes.

        Raises:
            AuthError: sequence or tag check failed, or a frame longer than ``view`` (the connection
                is closed and the refusal reported; discard what landed in ``view``).
            PeerError: EOF mid-frame (discard ``view``), or an authenticated control frame came
                instead (the peer's error answer, quoted).
            ChecksumError: the authenticated payload does not match the frame's crc32c (when it
                has one and ``verify``).
            OSError: the socket failed (e.g. timed out).
        """
        ftype, flags, crc, length, mac = self._header()
        if ftype == CTRL:
            buf = self._small(length, mac)
            raise PeerError(f"peer {self.peer} sent a control frame instead of data: {bytes(buf[:200])!r}",
                            job=self.job)
        if length > len(view):
            raise self.refuse(f"data frame of {length} bytes exceeds the {len(view)} expected")
        target = view[:length]
        sock, update = self.sock, mac.authenticate_additional_data
        got = 0
        while got < length:
            r = sock.recv_into(target[got:], min(length - got, piece))
            if r == 0:
                raise PeerError(f"peer {self.peer} closed the connection after {got} of {length} bytes of a frame",
                                job=self.job)
            update(target[got : got + r])
            got += r
            if progress is not None:
                progress(got)
        self._check_tag(mac)
        if verify and flags & HAS_CRC and crc32c(target) != crc:
            raise ChecksumError("data frame failed its crc32c check", job=self.job)
        return length

    def close(self) -> None:
        """Close the socket (idempotent)."""
        try:
            self.sock.close()
        except OSError:
            pass


def _report(hook: Callable[[AuthError], None] | None, err: AuthError) -> None:
    if hook is not None:
        try:
            hook(err)
        except Exception:  # a metrics hook must never mask the refusal
            log.exception("on_refuse hook failed")
