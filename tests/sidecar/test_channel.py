"""Authenticated frames between sidecars (``_channel``): every frame after the handshake is MACed.

Unit tests run two channels over real socket pairs with a man in the middle that sees raw frames;
the sidecar tests put a TCP proxy between a ``PeerClient`` and a real in-process sidecar (real
Redis) that tampers with, replays, reorders, reflects, truncates or injects frames: each is
refused (no holding, no ack, ``errors_total{kind="auth"}``, a warning in the log).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

import pytest
from _trainer import state_at
from conftest import SECRET, wait_for

from lifeline.catalog import Catalog
from lifeline.errors import AuthError, PeerError
from lifeline.sidecar import frames as _frames
from lifeline.sidecar._channel import HEADER, TAG_BYTES, Channel, derive_keys
from lifeline.sidecar.client import SidecarClient
from lifeline.sidecar.peer import PeerClient

PLAIN = _frames.HEADER  # the handshake's frames (before any key exists)
CHUNK = 16 << 10  # bytes per data frame of the puts through the proxy


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return bytes(buf)


def _read_frame(sock: socket.socket, header=HEADER) -> bytes:
    """One raw frame as it travels on the wire (authenticated: header, payload, tag)."""
    hdr = _recv_exact(sock, header.size)
    length = header.unpack(hdr)[3]
    return hdr + _recv_exact(sock, length + (TAG_BYTES if header is HEADER else 0))


def _flip(frame: bytes, at: int) -> bytes:
    b = bytearray(frame)
    b[at] ^= 0x01
    return bytes(b)


# ---------------------------------------------------------------- channels over socket pairs
_OPEN: list[socket.socket] = []


def _pair():
    """``(client, server, client_wire, server_wire, refused)``: channels whose frames pass through the test.

    The client's frames arrive on ``client_wire`` (raw), the server reads what the test writes to
    ``server_wire`` (and vice versa); ``refused`` collects the errors the ``on_refuse`` hooks saw.
    """
    c2s, s2c = derive_keys(SECRET.encode(), "j", os.urandom(32), os.urandom(32))
    c_sock, c_wire = socket.socketpair()
    s_sock, s_wire = socket.socketpair()
    _OPEN.extend((c_sock, c_wire, s_sock, s_wire))
    refused: list[AuthError] = []
    client = Channel(c_sock, send_key=c2s, recv_key=s2c, peer="client", job="j", on_refuse=refused.append)
    server = Channel(s_sock, send_key=s2c, recv_key=c2s, peer="server", job="j", on_refuse=refused.append)
    return client, server, c_wire, s_wire, refused


@pytest.fixture
def wire():
    """One :func:`_pair`; every socket pair made during the test is closed after it."""
    yield _pair()
    while _OPEN:
        _OPEN.pop().close()


def test_frames_pass_with_pieces_and_in_both_directions(wire):
    client, server, c_wire, s_wire, refused = wire
    payload = os.urandom(3 << 20)
    client.send_ctrl({"op": "put", "n": len(payload)})
    s_wire.sendall(_read_frame(c_wire))
    assert server.recv_ctrl() == {"op": "put", "n": len(payload)}
    threading.Thread(target=lambda: client.send_data(payload, checksum=False)).start()
    out, marks = bytearray(len(payload)), []
    relay = threading.Thread(target=lambda: s_wire.sendall(_read_frame(c_wire)))
    relay.start()
    assert server.recv_data_into(memoryview(out), progress=marks.append, piece=1 << 20) == len(payload)
    relay.join()
    assert out == payload and marks[-1] == len(payload) and all(b - a <= 1 << 20 for a, b in zip([0, *marks], marks))
    server.send_ctrl({"op": "ack"})
    c_wire.sendall(_read_frame(s_wire))
    assert client.recv_ctrl() == {"op": "ack"} and not refused


def _refused(refused: list, chan: Channel, fn: Callable, match: str | None = None) -> None:
    with pytest.raises(AuthError, match=match) as info:
        fn()
    assert refused == [info.value]
    assert chan.sock.fileno() == -1  # the channel closed the connection


def test_a_tampered_data_byte_is_refused_after_the_frame(wire):
    client, server, c_wire, s_wire, refused = wire
    client.send_data(b"x" * 100_000, checksum=False)
    s_wire.sendall(_flip(_read_frame(c_wire), HEADER.size + 54_321))
    _refused(refused, server, lambda: server.recv_data_into(memoryview(bytearray(100_000))), "tag mismatch")


@pytest.mark.parametrize("at", [0, 1, 4, 8, 15, 16, HEADER.size + 3, -1], ids=lambda a: f"byte{a}")
def test_a_tampered_control_frame_is_refused(wire, at):
    # type, flags, crc, length (8: huge, 15: one byte more, read from the next frame), sequence, payload, tag
    client, server, c_wire, s_wire, refused = wire
    client.send_ctrl({"op": "delete", "kind": "shard", "step": 1, "rank": 0})
    client.send_ctrl({"op": "next"})
    frame = _read_frame(c_wire)
    s_wire.sendall(_flip(frame, at if at >= 0 else len(frame) + at) + _read_frame(c_wire))
    _refused(refused, server, server.recv_ctrl)


def test_a_replayed_frame_is_refused(wire):
    client, server, c_wire, s_wire, refused = wire
    client.send_ctrl({"op": "delete", "step": 1})
    frame = _read_frame(c_wire)
    s_wire.sendall(frame + frame)
    assert server.recv_ctrl()["step"] == 1
    _refused(refused, server, server.recv_ctrl, "out of sequence")


def test_a_reordered_pair_is_refused_even_with_renumbered_headers(wire):
    client, server, c_wire, s_wire, refused = wire
    client.send_ctrl({"op": "a"})
    client.send_ctrl({"op": "b"})
    first, second = _read_frame(c_wire), _read_frame(c_wire)
    s_wire.sendall(second)
    _refused(refused, server, server.recv_ctrl, "out of sequence")
    # the same with the sequence numbers swapped back into order: the tags no longer match
    client, server, c_wire, s_wire, refused = _pair()
    client.send_ctrl({"op": "a"})
    client.send_ctrl({"op": "b"})
    first, second = _read_frame(c_wire), _read_frame(c_wire)
    s_wire.sendall(second[:16] + first[16:24] + second[24:])
    _refused(refused, server, server.recv_ctrl, "tag mismatch")


def test_a_reflected_frame_is_refused(wire):
    client, _server, c_wire, _s_wire, refused = wire
    client.send_ctrl({"op": "get", "step": 1})
    c_wire.sendall(_read_frame(c_wire))  # back to its sender: same sequence number, other direction's key
    _refused(refused, client, client.recv_ctrl, "tag mismatch")


def test_frames_from_another_connection_or_without_a_mac_are_refused(wire):
    _client, server, _c_wire, s_wire, refused = wire
    other, _, o_wire, _, _ = _pair()
    other.send_ctrl({"op": "delete", "step": 1})
    s_wire.sendall(_read_frame(o_wire))  # right sequence number, another connection's key
    _refused(refused, server, server.recv_ctrl, "tag mismatch")
    _client, server, _c_wire, s_wire, refused = _pair()
    _frames.send_ctrl(s_wire, {"op": "delete", "step": 1})  # the plain framing, no MAC
    _refused(refused, server, server.recv_ctrl)


def test_an_injected_frame_after_the_last_is_refused(wire):
    client, server, c_wire, s_wire, refused = wire
    client.send_ctrl({"op": "a"})
    s_wire.sendall(_read_frame(c_wire))
    server.recv_ctrl()
    body = b'{"op":"ack"}'
    s_wire.sendall(HEADER.pack(_frames.CTRL, 0, 0, len(body), 1) + body + os.urandom(TAG_BYTES))
    _refused(refused, server, server.recv_ctrl, "tag mismatch")


def test_a_connection_truncated_mid_frame_is_a_peer_error(wire):
    client, server, c_wire, s_wire, refused = wire
    client.send_data(b"y" * 50_000)
    s_wire.sendall(_read_frame(c_wire)[:30_000])
    s_wire.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerError, match="closed the connection") as info:
        server.recv_data_into(memoryview(bytearray(50_000)))
    assert not isinstance(info.value, AuthError) and not refused  # what a crashed peer looks like, too


def test_keys_differ_per_direction_connection_and_secret():
    ns, nc = os.urandom(32), os.urandom(32)
    c2s, s2c = derive_keys(b"s" * 32, "j", ns, nc)
    assert len(c2s) == len(s2c) == 32 and c2s != s2c
    assert derive_keys(b"s" * 32, "j", ns, nc) == (c2s, s2c)
    assert c2s not in derive_keys(b"s" * 32, "j", ns, os.urandom(32))
    assert c2s not in derive_keys(b"t" * 32, "j", ns, nc) and c2s not in derive_keys(b"s" * 32, "k", ns, nc)


# ---------------------------------------------------------------- a real sidecar behind a proxy
Edit = Callable[["Proxy", int, bytes], list[bytes]]


class Proxy:
    """TCP relay between one client and a sidecar; ``c2s``/``s2c`` edit the authenticated frames.

    ``edit(proxy, i, frame)`` gets the i-th authenticated frame of its direction (after the
    handshake's plain frames) and returns the frames to forward instead (``[]`` drops it; raising
    ``EOFError`` cuts both connections). ``proxy.client`` is the client's socket (to reflect frames).
    """

    def __init__(self, target: tuple[str, int], c2s: Edit | None = None, s2c: Edit | None = None) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.addr = self.lsock.getsockname()
        self.target, self.edits = target, (c2s, s2c)
        self.client: socket.socket | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        client, _ = self.lsock.accept()
        self.lsock.close()
        server = socket.create_connection(self.target)
        self.client = client
        threading.Thread(target=self._pump, args=(server, client, 2, self.edits[1]), daemon=True).start()
        self._pump(client, server, 1, self.edits[0])

    def _pump(self, src: socket.socket, dst: socket.socket, plain: int, edit: Edit | None) -> None:
        try:
            for _ in range(plain):  # the handshake
                dst.sendall(_read_frame(src, PLAIN))
            i = 0
            while True:
                frame = _read_frame(src)
                for out in edit(self, i, frame) if edit else [frame]:
                    dst.sendall(out)
                i += 1
        except (EOFError, OSError):
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _metric(sc, kind: str) -> float:
    return sc.metrics.registry.get_sample_value("lifeline_sidecar_errors_total", {"kind": kind}) or 0.0


@pytest.fixture
def held_shard(make_settings, sidecars):
    """A sidecar holding one sealed shard (step 0 of rank 0): ``(settings, sidecar, blob, meta)``."""
    s, t = make_settings(0, 1, peer_replicas=0, chunk_bytes=CHUNK)
    sc = sidecars(s)
    with SidecarClient(t) as c:
        c.save(0, state_at(0, 0))
    wait_for(lambda: sc.store.get("shard", 0, 0) is not None, what="step 0 sealed")
    h = sc.store.get("shard", 0, 0)
    return s, sc, bytes(h.buf[: h.nbytes]), h.meta


def _reorder(proxy: Proxy, i: int, f: bytes, held: list = []) -> list[bytes]:  # noqa: B006 (one use per test)
    if i == 1:
        held.append(f)
        return []
    return [f, held.pop()] if i == 2 else [f]


def _reflect(proxy: Proxy, i: int, f: bytes) -> list[bytes]:
    if i == 0:  # the put request goes back to the client, where it expects the server's frame 0 ("ready")
        proxy.client.sendall(f)
        return []
    return [f]


def _cut(proxy: Proxy, i: int, f: bytes) -> list[bytes]:
    if i == 2:
        raise EOFError  # half of the frame went out, then both connections are cut
    return [f[: len(f) // 2]] if i == 1 else [f]


CASES: dict[str, tuple[Edit, str]] = {  # name: (edit of the client's frames, who refuses)
    "tampered data byte": (lambda p, i, f: [_flip(f, HEADER.size + 7) if i == 2 else f], "sidecar"),
    "tampered control frame": (lambda p, i, f: [_flip(f, HEADER.size + 2) if i == 0 else f], "sidecar"),
    "replayed frame": (lambda p, i, f: [f, f] if i == 1 else [f], "sidecar"),
    "reordered pair": (_reorder, "sidecar"),
    "injected frame": (lambda p, i, f: [HEADER.pack(1, 0, 0, 2, 1) + b"{}" + bytes(16), f] if i == 1 else [f],
                       "sidecar"),
    "reflected frame": (_reflect, "client"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_sidecar_refuses_a_bad_frame_and_keeps_nothing(held_shard, caplog, case):
    s, sc, blob, meta = held_shard
    caplog.set_level(logging.WARNING, logger="lifeline")
    assert len(blob) > 4 * (CHUNK)  # several data frames
    edit, refuser = CASES[case]
    proxy = Proxy((s.pod_ip, sc.peer_port), c2s=edit)
    refused: list[AuthError] = []
    with PeerClient(*proxy.addr, secret=SECRET.encode(), job=s.job, chunk_bytes=CHUNK,
                    on_refuse=refused.append) as pc, pytest.raises(PeerError) as info:
        pc.put(kind="shard", step=5, rank=3, blob=memoryview(blob), meta=meta)
    if refuser == "client":
        assert isinstance(info.value, AuthError) and refused == [info.value]
    else:  # the sidecar closed the connection without an ack
        wait_for(lambda: _metric(sc, "auth") == 1, what="the refusal counted")
        assert not refused
    assert sc.store.get("shard", 5, 3) is None and _metric(sc, "peer") == 0
    cat = Catalog(s.redis_url, s.job, s.world_size)
    try:
        assert not cat.holder_names(5, 3)
    finally:
        cat.close()
    assert any(r.name == "lifeline.sidecar.channel" and r.levelno == logging.WARNING for r in caplog.records)
    with PeerClient(s.pod_ip, sc.peer_port, secret=SECRET.encode(), job=s.job) as pc:  # it still serves
        pc.put(kind="shard", step=6, rank=3, blob=memoryview(blob), meta=meta)
    assert sc.store.get("shard", 6, 3).tier == "L1"


def test_a_connection_cut_mid_frame_leaves_nothing(held_shard):
    s, sc, blob, meta = held_shard
    proxy = Proxy((s.pod_ip, sc.peer_port), c2s=_cut)
    with PeerClient(*proxy.addr, secret=SECRET.encode(), job=s.job, chunk_bytes=CHUNK) as pc, \
            pytest.raises(PeerError):
        pc.put(kind="shard", step=5, rank=3, blob=memoryview(blob), meta=meta)
    wait_for(lambda: _metric(sc, "peer") == 1, what="the cut connection counted")
    assert sc.store.get("shard", 5, 3) is None and _metric(sc, "auth") == 0


def test_the_client_refuses_tampered_bytes_from_the_sidecar(held_shard, caplog):
    s, sc, blob, _meta = held_shard
    proxy = Proxy((s.pod_ip, sc.peer_port), s2c=lambda p, i, f: [_flip(f, HEADER.size + 100) if i == 1 else f])
    refused: list[AuthError] = []
    into = memoryview(bytearray(len(blob)))
    with PeerClient(*proxy.addr, secret=SECRET.encode(), job=s.job, on_refuse=refused.append) as pc, \
            pytest.raises(AuthError, match="tag mismatch") as info:
        pc.get(kind="shard", step=0, rank=0, into=into)
    assert refused == [info.value]


def test_a_connection_that_skips_the_handshake_gets_nothing(held_shard):
    s, sc, _blob, _meta = held_shard
    for forged in (HEADER.pack(1, 0, 0, 2, 0) + b"{}" + bytes(16),  # an authenticated-looking frame, no handshake
                   HEADER.pack(2, 0, 0, 1 << 40, 0)):  # a huge data frame
        with socket.create_connection((s.pod_ip, sc.peer_port), timeout=10) as raw:
            assert _frames.recv_ctrl(raw)["op"] == "challenge"
            raw.sendall(forged)
            try:
                assert raw.recv(1) == b""
            except ConnectionResetError:  # closed with the forged bytes unread
                pass
    wait_for(lambda: _metric(sc, "auth") == 2, what="both refusals counted")
