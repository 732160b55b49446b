"""The sidecar's side of the trainer protocol on the Unix socket (one thread per trainer connection).

Requests (control frames; see :mod:`lifeline.sidecar.client` for the trainer's side):

* ``acquire {nbytes, policy, timeout}`` → ``slot {slot, waited}`` | ``skipped {waited}`` | ``error``
* ``commit {slot, step, nbytes, plan_id, plan?}`` → ``ok`` (sealing happens later, off this path)
* ``abort {slot}`` → ``ok`` (the trainer failed while writing)
* ``report {stall, waited, skipped}`` (no reply): the trainer's measured stall, for metrics
* ``restore {step?, rank?}`` → ``slot {slot, step, nbytes, meta, tier}`` | ``error``; then ``release {slot}``
* ``latest`` → ``latest {step}``
* ``log_put {key, nbytes}`` + one data frame → ``ok``; ``log_get {key, rank?}`` → ``data`` + data frame;
  ``log_done {first, last}`` (no reply): the log covers steps ``first..last``, recorded in the catalog
  once its entries reached the peers; ``log_gc {before}`` → ``ok {dropped}``

Plans travel pickled (pod-local, trusted peer on a 0600 socket; no tensor data inside) and are
cached by ``plan_id`` so a steady-state save sends only small frames.
"""

from __future__ import annotations

import base64
import logging
import pickle
import select
import socket
import time
from typing import TYPE_CHECKING

from lifeline.errors import LifelineError, PeerError
from lifeline.sidecar import ulog
from lifeline.sidecar.frames import recv_ctrl, send_ctrl

if TYPE_CHECKING:  # what these handlers may use of the sidecar (no import of server: no circle)
    from lifeline.sidecar._roles import TrainerSide

log = logging.getLogger("lifeline.sidecar.trainer")


def serve_trainer(sc: TrainerSide, conn: socket.socket, addr) -> None:
    """Serve one trainer connection until it closes; lent slots and pins are returned on exit."""
    s = sc.s
    send_ctrl(conn, {"op": "hello", "rank": sc.rank, "job": sc.job, "slots": s.slots, "slot_bytes": s.slot_bytes,
                     "arena_dir": str(s.arena_dir)})
    lent: set[int] = set()
    restoring: dict[int, object] = {}
    plans: dict[str, object] = {}
    try:
        while True:
            try:
                msg = recv_ctrl(conn)
            except (PeerError, OSError):
                return
            op = msg.get("op")
            try:
                if op == "acquire":
                    _acquire(sc, conn, msg, lent)
                elif op == "commit":
                    slot = int(msg["slot"])
                    if slot not in lent:
                        raise LifelineError(f"slot {slot} was not lent to this connection")
                    pid = msg["plan_id"]
                    if "plan" in msg:
                        plans[pid] = pickle.loads(base64.b64decode(msg["plan"]))
                    if pid not in plans:
                        raise LifelineError(f"unknown plan_id {pid}; send the plan")
                    lent.discard(slot)
                    sc.commit_slot(slot, int(msg["step"]), int(msg["nbytes"]), plans[pid])
                    send_ctrl(conn, {"op": "ok"})
                elif op == "abort":
                    slot = int(msg["slot"])
                    if slot in lent:
                        lent.discard(slot)
                        sc.release_slot(slot)
                    send_ctrl(conn, {"op": "ok"})
                elif op == "report":
                    sc.metrics.stall.observe(float(msg["stall"]))
                    sc.metrics.saves.labels("skipped" if msg.get("skipped") else "saved").inc()
                elif op == "restore":
                    rank = int(msg.get("rank", sc.rank))
                    h, tier = sc.fetch(msg.get("step"), rank)
                    restoring[h.slot] = h
                    send_ctrl(conn, {"op": "slot", "slot": h.slot, "step": h.step, "nbytes": h.nbytes, "meta": h.meta,
                                     "tier": tier})
                elif op == "pin":  # a held shard still in its arena slot, read in place (resharding restores)
                    h = sc.store.pin("shard", int(msg["step"]), int(msg["rank"]))
                    if h is not None and (h.slot is None or h.slot in restoring):
                        sc.unpin(h)
                        h = None
                    if h is None:
                        send_ctrl(conn, {"op": "missing"})
                    else:
                        restoring[h.slot] = h
                        send_ctrl(conn, {"op": "slot", "slot": h.slot, "step": h.step, "nbytes": h.nbytes})
                elif op == "release":
                    h = restoring.pop(int(msg["slot"]), None)
                    if h is not None:
                        sc.unpin(h)
                    send_ctrl(conn, {"op": "ok"})
                elif op == "latest":
                    step = sc.catalog_try(sc.catalog.latest_complete_step)
                    send_ctrl(conn, {"op": "latest", "step": step, "catalog": not sc.catalog_dirty})
                elif op in ("log_put", "log_get", "log_done", "log_gc"):
                    ulog.serve_trainer_op(sc, conn, msg)
                else:
                    raise LifelineError(f"unknown request {op!r}")
            except LifelineError as err:
                sc.metrics.errors.labels("protocol").inc()
                send_ctrl(conn, {"op": "error", "error": str(err), "type": type(err).__name__})
    finally:
        for slot in lent:
            sc.release_slot(slot)
        for h in restoring.values():
            sc.unpin(h)


def _hung_up(conn) -> bool:
    """Whether the trainer closed its end (a killed trainer's wait for a slot must end: its connection
    holds the pins of what it was restoring until this thread returns). Never blocks."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _acquire(sc: TrainerSide, conn, msg, lent: set[int]) -> None:
    nbytes = int(msg["nbytes"])
    if nbytes > sc.s.slot_bytes:
        raise LifelineError(
            f"a save of {nbytes} bytes does not fit a {sc.s.slot_bytes}-byte slot; raise LIFELINE_SLOT_BYTES"
        )
    policy = msg.get("policy", "wait")
    t0 = time.perf_counter()
    if policy == "skip":
        slot = sc.acquire_slot(0)
    else:
        sc.metrics.waiting.inc()
        try:
            slot = sc.acquire_slot(float(msg.get("timeout", 600.0)), lambda: _hung_up(conn))
        finally:
            sc.metrics.waiting.dec()
    waited = time.perf_counter() - t0
    sc.metrics.wait.observe(waited)
    if slot is None:
        log.warning("arena full: save %s after %.3f s (policy %s)", "skipped" if policy == "skip" else "timed out",
                    waited, policy)
        send_ctrl(conn, {"op": "skipped", "waited": waited, "policy": policy})
        return
    lent.add(slot)
    send_ctrl(conn, {"op": "slot", "slot": slot, "waited": waited})
