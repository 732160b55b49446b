"""Micro-benchmark: the CPU floor of a reshard read from memory, per GiB, on this machine.

Run: ``PYTHONPATH=src .venv/bin/python scripts/reshard_floor.py [--mib 128] [--repeats 3]``.
One JSON object on stdout: CPU seconds per GiB (user + system of this process, all threads; best of
``--repeats``) of one ``memcpy`` (``torch.Tensor.copy_``), the loader's ``crc32c`` of every byte
(``lifeline.checkpoint._crc``), and one pass through a loopback TCP connection (sender thread and
receiver in this process: both kernel copies, no framing, no MAC) in 4 MiB sends and 1 MiB
``recv_into`` pieces, as the sidecars' frames. ``lifeline bench reshard``'s memory path pays the
TCP pass and the crc32c for every byte (plus AES-GMAC at ~20 GB/s, see ``bench_frame_mac.py``);
docs/checkpoint.md "Benchmark: ``lifeline bench reshard``" compares its CPU seconds with these.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import socket
import statistics
import tempfile
import threading
import uuid
from pathlib import Path

import torch

from lifeline.checkpoint._crc import crc32c


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _tcp(src: memoryview, dst: memoryview) -> None:
    n = len(src)
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        client = socket.create_connection(lst.getsockname())
        server, _ = lst.accept()
    with client, server:
        def send() -> None:
            for off in range(0, n, 4 << 20):
                client.sendall(src[off:off + (4 << 20)])

        sender = threading.Thread(target=send)
        sender.start()
        got = 0
        while got < n:
            got += server.recv_into(dst[got:], min(n - got, 1 << 20))
        sender.join()


def _sidecar_get(src: torch.Tensor, dst: memoryview, repeats: int) -> dict[str, float]:
    """Median CPU seconds of one read of ``src``'s bytes from a real sidecar: ``(reader, sidecar)``."""
    from lifeline.api.pod import TrainerSettings
    from lifeline.bench._reshard_row import _cpu as _cpu_of
    from lifeline.bench._sidecar_peers import wait
    from lifeline.bench._sidecar_runs import SidecarProcess, sidecar_env
    from lifeline.catalog import Catalog
    from lifeline.checkpoint import Layout, PatternRules, plan_shard
    from lifeline.devcluster.services import RedisServer
    from lifeline.sidecar.client import SidecarClient
    from lifeline.sidecar.peer import PeerClient

    state = {"w": src.view(-1, 1024)}
    plan = plan_shard(state, Layout(), 0, PatternRules([]))
    shm, job = Path(tempfile.mkdtemp(dir="/dev/shm")), f"floor-{uuid.uuid4().hex[:6]}"
    secret = "bench-secret-0123456789"
    redis = RedisServer().start()
    sidecar = SidecarProcess(sidecar_env(job, 0, 1, "a", "127.0.0.1", shm / "a", plan.nbytes, redis.url,
                                         PEER_REPLICAS=0), shm / "a.log")
    catalog = Catalog(redis.url, job, 1)
    try:
        settings = TrainerSettings(job=job, rank=0, world_size=1, node="a", secret=secret, arena_dir=shm / "a",
                                   slots=2, slot_bytes=plan.nbytes)
        with SidecarClient(settings) as client:
            client.save(1, state, plan)
        wait(lambda: "L0@0" in catalog.holder_names(1, 0), 120, "the sidecar to hold the blob")
        reg, n, piece = catalog.sidecar(0), plan.nbytes, 32 << 20
        runs = []
        for _ in range(repeats + 1):
            peer = PeerClient(reg.host, reg.port, secret=secret.encode(), job=job)
            me, side = _cpu(), _cpu_of(sidecar.p.pid)
            for off in range(0, n, piece):
                peer.get(kind="shard", step=1, rank=0, offset=off, length=min(piece, n - off),
                         into=dst[off:off + piece])
            runs.append((_cpu() - me, _cpu_of(sidecar.p.pid) - side))
            peer.close()
        return {"sidecar_get_reader": statistics.median(r[0] for r in runs[1:]),
                "sidecar_get_sidecar": statistics.median(r[1] for r in runs[1:])}
    finally:
        sidecar.stop()
        catalog.close()
        redis.stop()
        shutil.rmtree(shm, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=128, help="bytes per measurement, MiB")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per operation (best kept)")
    ap.add_argument("--sidecar", action="store_true", help="also read the bytes from a real sidecar")
    args = ap.parse_args()
    n = args.mib << 20
    src = torch.randn(n // 4)
    dst = torch.empty_like(src)
    smv, dmv = memoryview(src.numpy()).cast("B"), memoryview(dst.numpy()).cast("B")
    ops = {"memcpy": lambda: dst.copy_(src), "crc32c": lambda: crc32c(smv), "tcp_loopback": lambda: _tcp(smv, dmv)}
    out = {"mib": args.mib, "repeats": args.repeats, "cpu_s_per_gib": {}}
    for name, fn in ops.items():
        fn()  # warm: pages faulted in
        best = min(_timed(fn) for _ in range(args.repeats))
        out["cpu_s_per_gib"][name] = round(best * (1 << 30) / n, 4)
    if args.sidecar:
        for name, sec in _sidecar_get(src, dmv, args.repeats).items():
            out["cpu_s_per_gib"][name] = round(sec * (1 << 30) / n, 4)
    print(json.dumps(out, indent=1))


def _timed(fn) -> float:
    c0 = _cpu()
    fn()
    return _cpu() - c0


if __name__ == "__main__":
    main()
