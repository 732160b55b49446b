"""Length-prefixed, typed frames over stream sockets (Unix and TCP).

Wire format of one frame: a 16-byte header ``!BB2xIQ`` — frame type (u8), flags (u8; bit 0:
the crc field is set), crc32c of the payload (u32) and payload length in bytes (u64) — then the
payload. Control frames (:data:`CTRL`) carry a UTF-8 JSON object; data frames (:data:`DATA`)
carry raw bytes, with their crc32c unless the payload is verified end to end by other means
(shard blobs: every chunk's checksum is verified on arrival against the shard metadata). Large payloads go out with
``socket.sendmsg`` from ``memoryview`` slices and come in with ``recv_into`` straight into the
destination buffer: no concatenation and no intermediate copies of payload bytes.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from lifeline.checkpoint import crc32c as _crc
from lifeline.errors import ChecksumError, PeerError

HEADER = struct.Struct("!BB2xIQ")
HAS_CRC = 1
CTRL = 1
DATA = 2
MAX_CTRL_BYTES = 64 << 20  # a control frame (JSON: metadata, plans) never exceeds this


def crc32c(buf) -> int:
    """crc32c (Castagnoli) of any buffer, without copying (the checkpoint core's ctypes binding)."""
    return _crc(buf)


def sendall_parts(sock: socket.socket, parts: list) -> None:
    """Send every buffer in ``parts`` in order with ``sendmsg``, handling partial sends."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views[:64])
        while sent:
            n = len(views[0])
            if sent >= n:
                sent -= n
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def send_ctrl(sock: socket.socket, msg: dict[str, Any]) -> None:
    """Send one control frame holding ``msg`` as JSON."""
    payload = json.dumps(msg, separators=(",", ":")).encode()
    sendall_parts(sock, [HEADER.pack(CTRL, 0, 0, len(payload)), payload])


def send_data(sock: socket.socket, buf, *, checksum: bool = True) -> None:
    """Send one data frame: the bytes of ``buf`` (any buffer), with their crc32c when ``checksum``."""
    view = memoryview(buf).cast("B")
    crc = crc32c(view) if checksum else 0
    sendall_parts(sock, [HEADER.pack(DATA, HAS_CRC if checksum else 0, crc, len(view)), view])


def recv_into_exact(sock: socket.socket, view: memoryview, progress=None, piece: int = 1 << 30) -> None:
    """Fill ``view`` completely from ``sock``; raises :class:`PeerError` on EOF.

    ``progress(received)``, when given, is called after every ``recv_into`` of at most ``piece``
    bytes with the number of bytes of ``view`` filled so far (e.g. to verify checksums of bytes
    that just arrived, while they are still in the CPU cache).
    """
    got = 0
    n = len(view)
    while got < n:
        r = sock.recv_into(view[got:], min(n - got, piece))
        if r == 0:
            raise PeerError(f"peer closed the connection after {got} of {n} bytes")
        got += r
        if progress is not None:
            progress(got)


def recv_header(sock: socket.socket) -> tuple[int, int | None, int]:
    """Read one frame header: ``(type, crc or None when the frame carries none, length)``."""
    hdr = bytearray(HEADER.size)
    recv_into_exact(sock, memoryview(hdr))
    ftype, flags, crc, length = HEADER.unpack(hdr)
    return ftype, (crc if flags & HAS_CRC else None), length


def recv_ctrl(sock: socket.socket) -> dict[str, Any]:
    """Read one control frame and return its JSON object.

    Raises:
        PeerError: EOF, a data frame where a control frame was expected, an oversized frame,
            or invalid JSON. A control frame with an ``"error"`` field is returned as is.
    """
    ftype, _crc, length = recv_header(sock)
    if ftype != CTRL or length > MAX_CTRL_BYTES:
        raise PeerError(f"protocol error: expected a control frame, got type {ftype} of {length} bytes")
    buf = bytearray(length)
    recv_into_exact(sock, memoryview(buf))
    try:
        msg = json.loads(buf)
    except ValueError as err:
        raise PeerError(f"protocol error: control frame is not JSON ({err})") from None
    if not isinstance(msg, dict):
        raise PeerError("protocol error: control frame is not a JSON object")
    return msg


def recv_data_into(sock: socket.socket, view: memoryview, *, verify: bool = True, progress=None,
                   piece: int = 1 << 30) -> int:
    """Read one data frame straight into ``view`` (which must be large enough).

    ``progress(received)`` is called as the payload arrives, in reads of at most ``piece`` bytes
    (see :func:`recv_into_exact`). Returns the payload length in bytes.

    Raises:
        PeerError: EOF, wrong frame type, a payload longer than ``view``.
        ChecksumError: the payload does not match the frame's crc32c (when it has one and ``verify``).
    """
    ftype, crc, length = recv_header(sock)
    if ftype != DATA:
        if ftype == CTRL and length <= MAX_CTRL_BYTES:
            buf = bytearray(length)
            recv_into_exact(sock, memoryview(buf))
            raise PeerError(f"peer sent a control frame instead of data: {bytes(buf[:200])!r}")
        raise PeerError(f"protocol error: expected a data frame, got type {ftype}")
    if length > len(view):
        raise PeerError(f"protocol error: data frame of {length} bytes exceeds the {len(view)} expected")
    target = view[:length]
    recv_into_exact(sock, target, progress, piece)
    if verify and crc is not None and crc32c(target) != crc:
        raise ChecksumError("data frame failed its crc32c check in transit")
    return length
