"""Micro-benchmark: throughput of per-frame MAC candidates for the sidecar data path, fed in 1 MiB pieces.

Run: ``PYTHONPATH=src .venv/bin/python scripts/bench_frame_mac.py [--mib 64] [--repeats 5]``.
One JSON object on stdout: GB/s (10^9 bytes per second, best of ``--repeats``) of each candidate
computing one tag over 4 MiB frames fed in 1 MiB ``update`` calls (as ``recv_into`` pieces arrive),
over a buffer of ``--mib`` MiB (``cold``) and over one 1 MiB piece again and again (``hot``: the
bytes a ``recv_into`` just wrote are in the CPU cache), plus the crc32c the receiver already
computes, for reference. Candidates:

* ``hmac_sha256``: ``hmac.new(key, digestmod="sha256")`` (OpenSSL, SHA-NI), ``update`` per piece;
* ``poly1305``: ``cryptography`` Poly1305 with a one-time key per frame (HMAC-SHA256 of the
  connection key and the frame's sequence number), ``update`` per piece;
* ``gmac_stream``: AES-256-GCM through ``Cipher(...).encryptor()``, the pieces as associated data
  (``authenticate_additional_data`` per piece, no plaintext), 96-bit nonce = sequence number;
* ``aesgcm_oneshot``: ``AESGCM.encrypt(nonce, b"", frame)`` — one call per whole frame (not
  incremental: the receiver would need a second pass once the frame is complete).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import struct
import time

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.poly1305 import Poly1305

from lifeline.sidecar._verify import crc32c

PIECE = 1 << 20
FRAME = 4 << 20
KEY = os.urandom(32)


def _frames(view: memoryview):
    for off in range(0, len(view), FRAME):
        yield off // FRAME, view[off: off + FRAME]


def hmac_sha256(view: memoryview) -> None:
    for seq, frame in _frames(view):
        m = hmac.new(KEY, struct.pack("!Q", seq), "sha256")
        for o in range(0, len(frame), PIECE):
            m.update(frame[o: o + PIECE])
        m.digest()


def poly1305(view: memoryview) -> None:
    for seq, frame in _frames(view):
        p = Poly1305(hmac.digest(KEY, struct.pack("!Q", seq), "sha256"))
        for o in range(0, len(frame), PIECE):
            p.update(frame[o: o + PIECE])
        p.finalize()


def gmac_stream(view: memoryview) -> None:
    for seq, frame in _frames(view):
        enc = Cipher(algorithms.AES(KEY), modes.GCM(struct.pack("!4xQ", seq))).encryptor()
        for o in range(0, len(frame), PIECE):
            enc.authenticate_additional_data(frame[o: o + PIECE])
        enc.finalize()
        _ = enc.tag


def aesgcm_oneshot(view: memoryview) -> None:
    a = AESGCM(KEY)
    for seq, frame in _frames(view):
        a.encrypt(struct.pack("!4xQ", seq), b"", frame)


def crc32c_ref(view: memoryview) -> None:
    for o in range(0, len(view), PIECE):
        crc32c(view[o: o + PIECE])


CANDIDATES = {"hmac_sha256": hmac_sha256, "poly1305": poly1305, "gmac_stream": gmac_stream,
              "aesgcm_oneshot": aesgcm_oneshot, "crc32c (reference)": crc32c_ref}


def _best(fn, view: memoryview, repeats: int, times: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(times):
            fn(view)
        best = min(best, time.perf_counter() - t0)
    return len(view) * times / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="buffer size in MiB for the cold run")
    ap.add_argument("--repeats", type=int, default=5, help="repetitions; the best is reported")
    a = ap.parse_args()
    cold = memoryview(bytearray(os.urandom(a.mib << 20)))
    hot_piece = memoryview(bytearray(os.urandom(FRAME)))
    out: dict = {"piece_bytes": PIECE, "frame_bytes": FRAME, "unit": "GB/s", "cold": {}, "hot": {},
                 "load": os.getloadavg()[0]}
    for name, fn in CANDIDATES.items():
        fn(hot_piece)  # warm-up
        out["cold"][name] = round(_best(fn, cold, a.repeats), 2)
        out["hot"][name] = round(_best(fn, hot_piece, a.repeats, times=16), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
