"""The trainer's side of the sidecar: one memcpy per save, restores from the nearest verified copy.

>>> client = SidecarClient(TrainerSettings())          # doctest: +SKIP
>>> receipt = client.save(step, state, plan)           # returns once the bytes are in the arena
>>> result = client.restore(into=state)                # latest complete step, L0 → L1 → L2
"""

from __future__ import annotations

import base64
import hashlib
import pickle
import socket
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from lifeline.api.pod import PodSettings
from lifeline.checkpoint import (
    Layout,
    PatternRules,
    ShardMetadata,
    plan_shard,
    read_shard,
)
from lifeline.errors import (
    ArenaFullError,
    ConfigError,
    LayoutError,
    PeerError,
    RecoveryError,
    SidecarError,
)
from lifeline.sidecar.client._copy import write_parallel
from lifeline.sidecar.frames import recv_ctrl, recv_data_into, send_ctrl, send_data
from lifeline.sidecar.client._logkey import LogKey
from lifeline.sidecar.client._receipts import RestoreResult, SaveReceipt
from lifeline.sidecar.client._staging import host_bytes
from lifeline.sidecar.client.arena import ArenaView

__all__ = ["PendingSave", "SidecarClient"]


class PendingSave:
    """An overlapped save in flight (:meth:`SidecarClient.save_overlapped`).

    :meth:`wait` joins the background memcpy, commits the slot and returns the
    :class:`SaveReceipt`, whose ``stall_seconds`` counts only the trainer's own time: the slot
    handover, the part of the copy it waited for, and the commit. A copy that failed aborts the
    slot (nothing is committed) and its error is raised. Calling :meth:`wait` again returns the
    same receipt.
    """

    def __init__(self, client: SidecarClient, copy: Any, receipt: SaveReceipt | None, *, slot: int = -1,
                 step: int = 0, plan: Any = None, waited: float = 0.0, handed: float = 0.0) -> None:
        self._client, self._copy, self.receipt = client, copy, receipt
        self._slot, self._step, self._plan, self._waited, self._handed = slot, step, plan, waited, handed

    def wait(self) -> SaveReceipt:
        if self.receipt is not None:
            return self.receipt
        if self._client._pending is self:
            self._client._pending = None
        t0 = time.perf_counter()
        try:
            self._copy.result()
        except BaseException:
            self._client._call({"op": "abort", "slot": self._slot}, "abort")
            raise
        self.receipt = self._client._commit(self._slot, self._step, self._plan, self._waited,
                                            self._handed + (time.perf_counter() - t0), t0)
        return self.receipt


def _raise(msg: dict[str, Any], what: str) -> None:
    if msg.get("op") == "error":
        kind = msg.get("type", "")
        cls = RecoveryError if kind == "RecoveryError" else SidecarError
        raise cls(f"sidecar refused {what}: {msg.get('error')}")


class SidecarClient:
    """Connection of one trainer process to its pod's sidecar (Unix socket + shared-memory arena).

    Args:
        settings: the pod's :class:`~lifeline.api.pod.TrainerSettings` (a plain
            :class:`~lifeline.api.pod.PodSettings` gets the default policy ``wait``).

    Raises:
        SidecarError: the sidecar's socket did not appear within ``connect_timeout_seconds``.

    Not thread-safe: one client per trainer process (or a lock around it).
    """

    def __init__(self, settings: PodSettings) -> None:
        self.settings = settings
        self.policy = getattr(settings, "backpressure", "wait")
        self.wait_timeout = float(getattr(settings, "wait_timeout_seconds", 600.0))
        self.rank = settings.rank
        self._sock = self._connect(float(getattr(settings, "connect_timeout_seconds", 60.0)))
        hello = recv_ctrl(self._sock)
        if hello.get("op") != "hello" or hello.get("rank") != settings.rank or hello.get("job") != settings.job:
            raise SidecarError(f"the socket {settings.socket_path} belongs to another sidecar: {hello}",
                               job=settings.job, rank=settings.rank)
        self.slot_bytes = int(hello["slot_bytes"])
        self.arena = ArenaView(hello["arena_dir"], self.slot_bytes)
        for i in range(int(hello["slots"])):  # map (and populate) every slot now, not inside a save
            self.arena.view(i)
        self._plan: Any = None
        self._plan_id = ""
        self._sent_plans: set[str] = set()
        self._copy_threads = 0  # threads of the memcpy into the arena (set at the first save)
        self._copy_pool = None
        self._background = None  # the thread of overlapped saves (started at the first one)
        self._pending: PendingSave | None = None

    def _connect(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        path = str(self.settings.socket_path)
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except OSError as err:
                s.close()
                if time.monotonic() > deadline:
                    raise SidecarError(f"no sidecar listening on {path} after {timeout:.0f} s: {err}",
                                       job=self.settings.job, rank=self.settings.rank) from err
                time.sleep(0.05)

    def _call(self, msg: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            send_ctrl(self._sock, msg)
            reply = recv_ctrl(self._sock)
        except (OSError, PeerError) as err:
            raise SidecarError(f"lost the sidecar during {what}: {err}", job=self.settings.job, rank=self.rank) from err
        _raise(reply, what)
        return reply

    # ------------------------------------------------------------------ planning
    def _plan_for(self, state: Mapping[str, Any], plan: Any) -> Any:
        if plan is None:
            if self._plan is not None and self._plan.matches(state):
                plan = self._plan
            else:  # no layout given: every entry is this rank's own, replicated over data parallelism
                plan = plan_shard(state, Layout(data=self.settings.world_size), self.rank, PatternRules([]))
        if plan is not self._plan:
            blob = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
            self._plan, self._plan_id = plan, hashlib.sha256(blob).hexdigest()[:32]
            self._plan_blob = base64.b64encode(blob).decode()
        return plan

    # ------------------------------------------------------------------ save
    def save_overlapped(self, step: int, state: Mapping[str, Any], plan: Any = None) -> PendingSave:
        """Start a save whose memcpy overlaps the trainer's next step (CheckFreq's pipelined
        snapshot, Mohan et al., FAST'21 §4.2): the arena slot is acquired here, the copy runs on a
        background thread, and :meth:`PendingSave.wait` — which the trainer calls before its next
        optimizer update modifies the state — joins the copy and commits the slot. Until then the
        tensors of ``state`` must not be written (forward and backward only read them).

        Raises what :meth:`save` raises (the copy's errors from :meth:`PendingSave.wait`).
        """
        self.settle()
        t0 = time.perf_counter()
        plan = self._plan_for(state, plan)
        slot, waited, skipped = self._acquire(step, plan, t0)
        if skipped is not None:
            return PendingSave(self, None, skipped)
        if self._background is None:
            from concurrent.futures import ThreadPoolExecutor

            self._background = ThreadPoolExecutor(1, thread_name_prefix="arena-overlap")
        copy = self._background.submit(self._write, plan, state, self.arena.view(slot, plan.nbytes))
        self._pending = PendingSave(self, copy, None, slot=slot, step=step, plan=plan, waited=waited,
                                    handed=time.perf_counter() - t0)
        return self._pending

    def settle(self) -> SaveReceipt | None:
        """Finish the overlapped save in flight, if any (see :meth:`save_overlapped`); its receipt."""
        pending, self._pending = self._pending, None
        return pending.wait() if pending is not None else None

    def save(self, step: int, state: Mapping[str, Any], plan: Any = None) -> SaveReceipt:
        """Copy ``state`` into a free arena slot and hand it to the sidecar; returns once the bytes are there.

        Args:
            step: number of completed optimizer steps (>= 0).
            state: fully qualified name → local CPU tensor or bytes-like entry.
            plan: a ``ShardPlan`` from ``lifeline.checkpoint.plan_shard`` (layout, rank, pattern
                rules); None plans a data-parallel (replicated) layout, reusing the last plan while
                it matches.

        Returns:
            :class:`SaveReceipt` with the stall, the backpressure wait and whether it was skipped.

        Raises:
            ArenaFullError: no slot freed within ``wait_timeout_seconds`` (policy ``wait``).
            SidecarError: the blob exceeds the slot size, or the sidecar is gone.
            LayoutError: ``state`` does not match ``plan``.
        """
        self.settle()
        t0 = time.perf_counter()
        plan = self._plan_for(state, plan)
        slot, waited, skipped = self._acquire(step, plan, t0)
        if skipped is not None:
            return skipped
        try:
            self._write(plan, state, self.arena.view(slot, plan.nbytes))
        except BaseException:
            self._call({"op": "abort", "slot": slot}, "abort")
            raise
        return self._commit(slot, step, plan, waited, time.perf_counter() - t0, t0)

    def _acquire(self, step: int, plan: Any, t0: float) -> tuple[int, float, SaveReceipt | None]:
        """``(slot, seconds waited, None)``, or ``(-1, waited, receipt)`` when skipped (policy ``skip``)."""
        if step < 0:
            raise ConfigError(f"step must be >= 0, got {step}", field="step")
        if plan.rank != self.rank:
            raise LayoutError(f"plan is for rank {plan.rank}, this trainer is rank {self.rank}", rank=self.rank)
        reply = self._call({"op": "acquire", "nbytes": plan.nbytes, "policy": self.policy,
                            "timeout": self.wait_timeout}, "acquire")
        waited = float(reply.get("waited", 0.0))
        if reply["op"] == "skipped":
            if self.policy == "wait":
                raise ArenaFullError(f"no arena slot freed within {self.wait_timeout:.0f} s", job=self.settings.job,
                                     rank=self.rank, step=step)
            stall = time.perf_counter() - t0
            self._report(stall, waited, True)
            return -1, waited, SaveReceipt(step, stall, waited, True, 0)
        return int(reply["slot"]), waited, None

    def _commit(self, slot: int, step: int, plan: Any, waited: float, stalled: float, t0: float) -> SaveReceipt:
        """Hand the filled ``slot`` to the sidecar; ``stalled`` is the trainer's time so far, the
        commit's own time is added to it."""
        t1 = time.perf_counter()
        msg = {"op": "commit", "slot": slot, "step": step, "nbytes": plan.nbytes, "plan_id": self._plan_id}
        if self._plan_id not in self._sent_plans:
            msg["plan"] = self._plan_blob
        self._call(msg, "commit")
        self._sent_plans.add(self._plan_id)
        stall = stalled + (time.perf_counter() - t1)
        self._report(stall, waited, False)
        return SaveReceipt(step, stall, waited, False, plan.nbytes)

    def _write(self, plan: Any, state: Mapping[str, Any], view: memoryview) -> None:
        """The one memcpy: ``write_shard`` split over up to ``min(torch intra-op threads, 4)`` threads."""
        if not self._copy_threads:
            import torch

            self._copy_threads = max(1, min(torch.get_num_threads(), 4))
            if self._copy_threads > 1:
                from concurrent.futures import ThreadPoolExecutor

                self._copy_pool = ThreadPoolExecutor(self._copy_threads - 1, thread_name_prefix="arena-copy")
        write_parallel(plan, state, view, self._copy_pool, self._copy_threads)

    def _report(self, stall: float, waited: float, skipped: bool) -> None:
        send_ctrl(self._sock, {"op": "report", "stall": stall, "waited": waited, "skipped": skipped})

    # ------------------------------------------------------------------ restore
    def restore(self, step: int | None = None, into: MutableMapping[str, Any] | None = None, plan: Any = None,
                rank: int | None = None) -> RestoreResult:
        """Restore ``into`` (in place) from the nearest verified copy of this rank's shard.

        The sidecar takes the copy from its memory (L0), else a peer (L1), else storage (L2),
        verifying every chunk checksum and falling back on any failure; the trainer then copies
        from the arena slot into ``into``'s tensors (byte entries are replaced in ``into``).

        Args:
            step: the step to restore; None for the job's latest complete step.
            into: fqn → tensor (filled in place) / bytes entries, with the saved names, shapes, dtypes.
            plan: the ``ShardPlan`` used to save (None: the default data-parallel plan of ``into``).
            rank: whose shard (default: this trainer's rank).

        Raises:
            RecoveryError: no tier holds a verified copy.
            LayoutError: ``into`` does not match the stored blob.
        """
        self.settle()  # an overlapped copy still reads the tensors the restore writes
        t0 = time.perf_counter()
        reply = self._call({"op": "restore", "step": step, "rank": self.rank if rank is None else rank}, "restore")
        slot, nbytes = int(reply["slot"]), int(reply["nbytes"])
        try:
            if into is not None:
                plan = self._plan_for(into, plan)
                stored = ShardMetadata.from_json(reply["meta"])
                read_shard(plan, stored, self.arena.view(slot, nbytes), into)
        finally:
            self._call({"op": "release", "slot": slot}, "release")
        return RestoreResult(int(reply["step"]), reply["tier"], nbytes, time.perf_counter() - t0)

    def pin_shard(self, step: int, rank: int) -> tuple[int, memoryview] | None:
        """Pin rank's shard of ``step`` where this pod's sidecar holds it in an arena slot, and map it:
        ``(slot, a read-only view of its bytes)``; ``None`` when not held there. The bytes are the
        stored blob, unverified: the caller verifies what it reads (the loader checks every chunk).
        :meth:`unpin_shard` releases it (the sidecar may evict it again)."""
        reply = self._call({"op": "pin", "step": step, "rank": rank}, "pin")
        if reply.get("op") != "slot":
            return None
        slot = int(reply["slot"])
        return slot, self.arena.view(slot, int(reply["nbytes"])).toreadonly()

    def unpin_shard(self, slot: int) -> None:
        """Release a shard pinned by :meth:`pin_shard`."""
        self._call({"op": "release", "slot": slot}, "release")

    def latest_complete_step(self) -> int | None:
        """The job's latest complete step (every rank verified at the required tier), None if none yet."""
        return self._call({"op": "latest"}, "latest")["step"]

    # ------------------------------------------------------------------ upstream logs
    def put_log(self, key: LogKey, data: Any) -> None:
        """Store an upstream-log entry (bytes-like, or a tensor's bytes: a device tensor is staged to host
        memory first); replicated to peers."""
        view = _bytes_view(data)
        try:
            send_ctrl(self._sock, {"op": "log_put", "key": key.to_dict(), "nbytes": len(view)})
            send_data(self._sock, view)
            _raise(recv_ctrl(self._sock), "log_put")
        except (OSError, PeerError) as err:
            raise SidecarError(f"lost the sidecar during log_put: {err}", rank=self.rank) from err

    def get_log(self, key: LogKey, rank: int | None = None) -> bytearray:
        """Fetch an upstream-log entry of ``rank`` (default this rank) from the nearest holder, verified."""
        reply = self._call({"op": "log_get", "key": key.to_dict(), "rank": self.rank if rank is None else rank},
                           "log_get")
        out = bytearray(int(reply["nbytes"]))
        recv_data_into(self._sock, memoryview(out))
        return out

    def log_done(self, first: int, last: int) -> None:
        """This rank's upstream log now covers steps ``first..last`` (completed steps). No reply: the
        sidecar records the coverage in the catalog once every entry logged before this call reached
        the peers (only from past an entry that could not be sent), so a plan relies on replicated
        coverage only.

        Raises:
            SidecarError: the sidecar connection is gone.
        """
        try:
            send_ctrl(self._sock, {"op": "log_done", "first": int(first), "last": int(last)})
        except OSError as err:
            raise SidecarError(f"lost the sidecar during log_done: {err}", rank=self.rank) from err

    def gc_logs(self, before: int) -> int:
        """Drop every upstream-log entry of iterations < ``before`` held by this sidecar; returns the count."""
        return int(self._call({"op": "log_gc", "before": before}, "log_gc")["dropped"])

    def close(self) -> None:
        """Close the socket, stop the copy threads and unmap the arena (an overlapped copy in flight
        is let finish first, and not committed)."""
        if self._pending is not None:
            try:
                self._pending._copy.result()
            except BaseException:  # noqa: BLE001 - closing anyway
                pass
            self._pending = None
        try:
            self._sock.close()
            if self._copy_pool is not None:
                self._copy_pool.shutdown()
            if self._background is not None:
                self._background.shutdown()
        finally:
            self.arena.close()

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _bytes_view(data: Any) -> memoryview:
    """The bytes of an upstream-log entry: a tensor on any device (a device tensor staged to host
    memory through a pinned buffer of its own, :mod:`lifeline.sidecar.client._staging`: entries may be put from
    several threads) or bytes-like."""
    return host_bytes(data)
