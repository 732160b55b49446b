"""The sidecar bench's in-process peers: what a save, a replication and an upload cost without the sidecar.

Each peer is a callable measuring one operation (seconds, ``time.perf_counter``); peers holding
resources have ``close()``. DLRover's flash checkpoint, which runs in its own process, is in
:mod:`lifeline.bench._sidecar_dlrover`.
"""

from __future__ import annotations

import ctypes
import io
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from minio import Minio

from lifeline._poll import wait_for
from lifeline.checkpoint import S3Storage

__all__ = ["wait", "Memcpy", "TorchSave", "DcpAsync", "RawTcp", "PlainUpload"]

State = dict[str, torch.Tensor]


def wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``cond`` until truthy, at most ``timeout`` seconds; returns its value.

    Raises:
        TimeoutError: the deadline passed (the message names ``what``).
    """
    return wait_for(cond, timeout, f"bench: {what}")


class Memcpy:
    """The floor: libc ``memcpy`` (``ctypes.memmove``) of every tensor into one pre-faulted buffer.

    :meth:`parallel` copies the same bytes split over ``threads`` threads (``memmove`` releases the
    GIL): it shows whether this machine's memory bandwidth leaves room below the one-thread floor.
    """

    def __init__(self, state: State, threads: int = 2) -> None:
        self.state = state
        self.dst = torch.empty(sum(t.numel() * t.element_size() for t in state.values()), dtype=torch.uint8)
        self.dst.fill_(1)  # fault every page in now
        self.pool = ThreadPoolExecutor(threads)
        self.threads = threads

    def __call__(self) -> float:
        """One copy of every tensor, in one thread; seconds."""
        base = self.dst.data_ptr()
        t0 = time.perf_counter()
        off = 0
        for t in self.state.values():
            n = t.numel() * t.element_size()
            ctypes.memmove(base + off, t.data_ptr(), n)
            off += n
        return time.perf_counter() - t0

    def parallel(self) -> float:
        """The same copy split over ``threads`` threads; seconds."""
        jobs, off = [], self.dst.data_ptr()
        for t in self.state.values():
            n = t.numel() * t.element_size()
            step = -(-n // self.threads)
            jobs += [(off + i, t.data_ptr() + i, min(step, n - i)) for i in range(0, n, step)]
            off += n
        t0 = time.perf_counter()
        for f in [self.pool.submit(ctypes.memmove, *j) for j in jobs]:
            f.result()
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop the copy threads."""
        self.pool.shutdown()


class TorchSave:
    """``torch.save`` of the state to a file on local disk; one call, one save (the file is removed after)."""

    def __init__(self, state: State, workdir: Path) -> None:
        self.state, self.path = state, workdir / "torch-save.pt"

    def __call__(self) -> float:
        """One save; seconds."""
        t0 = time.perf_counter()
        torch.save(self.state, self.path)
        took = time.perf_counter() - t0
        self.path.unlink()
        return took


class DcpAsync:
    """``torch.distributed.checkpoint.async_save`` (world size 1, gloo); one call, one save:
    ``(blocking seconds, seconds until the save completed)``. Creates the default process group."""

    def __init__(self, state: State, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        self.state, self.dir = state, workdir / "dcp"

    def __call__(self) -> tuple[float, float]:
        """One save; ``(blocking seconds, seconds until complete)``."""
        t0 = time.perf_counter()
        fut = dcp.async_save(dict(self.state), checkpoint_id=str(self.dir))
        t1 = time.perf_counter()
        fut.result()
        t2 = time.perf_counter()
        shutil.rmtree(self.dir, ignore_errors=True)
        return t1 - t0, t2 - t0

    def close(self) -> None:
        """Destroy the process group."""
        dist.destroy_process_group()


class RawTcp:
    """Raw loopback TCP of the same bytes between two processes (127.0.0.1 → 127.0.0.2); one call, one send.

    ``blob`` is the state's bytes (the memcpy floor's destination buffer: no second copy of the state
    in memory), sent with one blocking ``sendall`` and received with ``recv_into`` into one reused buffer.
    """

    _RECV = textwrap.dedent("""
        import socket, sys
        n = int(sys.argv[1])
        ls = socket.socket(); ls.bind(("127.0.0.2", 0)); ls.listen(1)
        print(ls.getsockname()[1], flush=True)
        c, _ = ls.accept()
        buf = memoryview(bytearray(n))
        while True:
            got = 0
            while got < n:
                r = c.recv_into(buf[got:], n - got)
                if not r:
                    sys.exit(0)
                got += r
            c.sendall(b"k")
    """)

    def __init__(self, blob: memoryview) -> None:
        self.blob = memoryview(blob).cast("B")
        nbytes = len(self.blob)
        self.p = subprocess.Popen([sys.executable, "-c", self._RECV, str(nbytes)], stdout=subprocess.PIPE, text=True)
        port = int(self.p.stdout.readline())
        self.s = socket.create_connection(("127.0.0.2", port), source_address=("127.0.0.1", 0))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __call__(self) -> float:
        """One send until the receiver's acknowledgement; seconds. Raises RuntimeError if the receiver failed."""
        t0 = time.perf_counter()
        self.s.sendall(self.blob)
        if self.s.recv(1) != b"k":
            raise RuntimeError("raw TCP receiver failed")
        return time.perf_counter() - t0

    def close(self) -> None:
        """Close the connection and wait for the receiver to exit."""
        self.s.close()
        self.p.wait(30)


class PlainUpload:
    """A plain parallel multipart upload of the same bytes with the minio client (same part size and
    parallelism as the sidecar's storage); one call, one upload."""

    def __init__(self, state: State, endpoint: str, access: str, secret: str) -> None:
        defaults = S3Storage("x:1", "a", "b", "c")  # the part size and parallelism the sidecar uses
        self.part, self.par = defaults.part_size, defaults.max_concurrency
        self.client = Minio(endpoint, access_key=access, secret_key=secret, secure=False)
        self.bucket = "bench-plain"
        if not self.client.bucket_exists(self.bucket):
            self.client.make_bucket(self.bucket)
        self.data = b"".join(t.numpy().tobytes() for t in state.values())

    def __call__(self) -> float:
        """One upload (the object is removed after); seconds."""
        t0 = time.perf_counter()
        self.client.put_object(self.bucket, "plain.bin", io.BytesIO(self.data), len(self.data), part_size=self.part,
                               num_parallel_uploads=self.par)
        took = time.perf_counter() - t0
        self.client.remove_object(self.bucket, "plain.bin")
        return took
