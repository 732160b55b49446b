"""The upstream-log store: tensors a stage sent across a pipeline boundary, kept for localized replay.

An entry is keyed by ``(iteration, micro_batch, stage, direction)`` (direction ``"fwd"`` for
activations sent downstream, ``"bwd"`` for gradients sent upstream) and held in the sender's
sidecar memory, then replicated to the same peers as its checkpoints (Gemini placement), so a
failed stage's neighbours' logs survive a node loss (MoEvement's localized recovery). Entries are
verified with a crc32c on every transfer. Garbage collection drops entries of iterations before a
bound (typically the iteration of the latest complete checkpoint).

Sparse-checkpoint slots (direction ``"slot"``) are also persisted to L2 by the sidecar's
:class:`~lifeline.sidecar._windows.WindowPersister`; a slot held neither here nor by a peer is
read from its committed window in storage (verified against the window manifest).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from lifeline.catalog import LogCoverage
from lifeline.checkpoint import read_window_slot
from lifeline.control import place_replicas
from lifeline.errors import ChecksumError, LifelineError, PeerError
from lifeline.sidecar.frames import crc32c, recv_data_into, send_ctrl, send_data
from lifeline.sidecar.client import LogKey
from lifeline.sidecar._workers import CoverageMark
from lifeline.sidecar.store import Holding

if TYPE_CHECKING:  # what these handlers may use of the sidecar (no import of server: no circle)
    from lifeline.sidecar._roles import LogSide

__all__ = ["LogKey", "serve_trainer_op"]

log = logging.getLogger("lifeline.sidecar.ulog")


def serve_trainer_op(sc: LogSide, conn, msg: dict) -> None:
    """Serve ``log_put`` / ``log_get`` / ``log_done`` / ``log_gc`` from the trainer connection."""
    op = msg["op"]
    if op == "log_put":
        key = LogKey.from_dict(msg["key"])
        n = int(msg["nbytes"])
        if not sc.store.make_room(n):
            sc.metrics.errors.labels("memory").inc()
            raise LifelineError(f"upstream log of {n} bytes does not fit LIFELINE_MEMORY_BYTES")
        buf = memoryview(bytearray(n))
        got = 0
        while got < n:
            got += recv_data_into(conn, buf[got:])
        meta = json.dumps({"key": key.to_dict(), "crc32c": crc32c(buf)})
        h = Holding("ulog", key.iteration, sc.rank, n, buf, meta, "L0", None, key.name)
        sc.store.add(h)
        if sc.s.peer_replicas > 0:
            h.pins += 1
            sc.repl_q.put(h)
        if key.direction == "slot" and sc.windows is not None:  # sparse checkpoints persist to L2
            h.pins += 1
            sc.windows.offer(h)
        send_ctrl(conn, {"op": "ok"})
    elif op == "log_get":
        key = LogKey.from_dict(msg["key"])
        rank = int(msg.get("rank", sc.rank))
        buf, meta = _find(sc, key, rank)
        send_ctrl(conn, {"op": "data", "nbytes": len(buf), "meta": meta})
        send_data(conn, buf)
    elif op == "log_done":  # no reply: the trainer goes on with its next step
        mark = CoverageMark(sc.rank, int(msg["first"]), int(msg["last"]))
        if sc.s.peer_replicas > 0:
            sc.repl_q.put(mark)  # recorded once the entries queued before it were sent to the peers
        else:
            sc.link.call(sc.catalog.record_log_coverage, LogCoverage(mark.rank, mark.first, mark.last, replicas=0))
    elif op == "log_gc":
        before = int(msg["before"])
        dropped = 0
        for h in sc.store.items():
            if h.kind == "ulog" and h.step < before and sc.store.remove(h):
                dropped += 1
        send_ctrl(conn, {"op": "ok", "dropped": dropped})


def _find(sc: LogSide, key: LogKey, rank: int) -> tuple[memoryview, str]:
    h = sc.store.pin("ulog", key.iteration, rank, key.name)
    if h is not None:
        try:
            return h.buf[: h.nbytes], h.meta
        finally:
            sc.unpin(h)
    candidates: list[int] = []
    try:
        regs = sc.catalog.sidecars()
        world = sc.catalog.world_size
        if all(r in regs for r in range(world)) and rank < world:
            nodes = [regs[r].node for r in range(world)]
            candidates = list(place_replicas(nodes, sc.s.peer_replicas)[rank])
        candidates += [r for r in sorted(regs) if r not in candidates and r != sc.rank]
    except LifelineError:
        pass
    errors = []
    for k in candidates:
        try:
            with sc.peer(k) as pc:
                buf, meta = pc.get(kind="ulog", name=key.name, step=key.iteration, rank=rank)
            if crc32c(buf) != json.loads(meta)["crc32c"]:
                err = ChecksumError("upstream-log copy failed its crc32c", rank=rank, step=key.iteration, tier="L1")
                sc.report_corrupt(err, "L1", f"rank {k}")
                continue
            return buf, meta
        except (PeerError, LifelineError, OSError) as err:
            errors.append(f"rank {k}: {err}")
    if key.direction == "slot" and sc.storage is not None:
        try:
            data, _ = read_window_slot(sc.storage, sc.prefix, sc.job, rank, key.iteration)
            return memoryview(data), json.dumps({"key": key.to_dict(), "crc32c": crc32c(data), "tier": "L2"})
        except ChecksumError as err:
            sc.report_corrupt(err, "L2", "storage")
            errors.append(f"L2: {err}")
        except LifelineError as err:
            errors.append(f"L2: {err}")
    raise LifelineError(f"upstream log {key} of rank {rank} is not held anywhere: {'; '.join(errors) or 'no peers'}",
                        rank=rank, step=key.iteration)
