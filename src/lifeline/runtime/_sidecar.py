"""The sidecar-backed :class:`~lifeline.runtime.Checkpointer` (the production path), with elastic
restores: a checkpoint saved in another layout is read from the sidecars' memory (L0/L1) and
resharded on load, L2 being the fallback."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lifeline.catalog import Catalog
from lifeline.checkpoint import (Layout, PatternRules, list_steps, load, load_shard, manifest_key, plan_shard,
                                 read_manifest, storage_from_uri, StorageOptions)
from lifeline.errors import CatalogError, CheckpointError, ChecksumError, ManifestError, StorageError
from lifeline.sidecar.client import SidecarClient
from lifeline.sidecar.client.reader import SidecarBlobReader, manifest_from_catalog

__all__ = ["ReshardReport", "SidecarCheckpointer"]


@dataclass(frozen=True)
class ReshardReport:
    """Where a resharding restore read its bytes.

    Attributes:
        step: the step restored.
        saved: the layout it was saved in.
        needed_bytes: bytes this rank's new shard needed (the plan's byte ranges).
        bytes_by_tier: bytes read per tier ``{"L0", "L1", "L2"}`` (fallbacks included).
        fallbacks: one line per holder or chunk copy that failed and was replaced by the next.
        local_bytes: of those, the bytes read in place from this pod's arena (shared memory).
    """

    step: int
    saved: Layout
    needed_bytes: int
    bytes_by_tier: dict[str, int]
    fallbacks: list[str]
    local_bytes: int = 0

    def fields(self) -> dict[str, Any]:
        """The report as fields of the trainer's ``restore`` event."""
        return {"source": "reshard", "saved_layout": self.saved.to_dict(), "needed_bytes": self.needed_bytes,
                "bytes_by_tier": self.bytes_by_tier, "local_bytes": self.local_bytes,
                "fallbacks": len(self.fallbacks)}


class SidecarCheckpointer:
    """Saves through the pod's checkpoint sidecar: one memcpy into the shared-memory arena.

    Wraps :class:`lifeline.sidecar.SidecarClient`. The shard plan is made once from the
    model's pattern rules and the layout (``plan_shard``) and reused while shapes hold, so the
    sidecar can seal, replicate (L1) and persist (L2) the blob in the universal format. A
    checkpoint is complete when the sidecars have verified every rank's shard at the required
    tier (the catalog's ``complete`` step). ``last_receipt`` / ``last_restore`` keep the
    latest :class:`~lifeline.sidecar.SaveReceipt` / :class:`~lifeline.sidecar.RestoreResult`
    (``last_restore`` is ``None`` after a resharding restore from L2).

    Elastic restores: when the catalog's shard metadata says checkpoint ``step`` was saved in
    another layout, this rank's blob does not exist; the restore then reads the universal
    checkpoint resharded (:func:`lifeline.checkpoint.load_shard` intersects this rank's chunks with
    the stored ones and reads only those byte ranges): from the sidecars holding the step in memory
    (:class:`~lifeline.sidecar.client.reader.SidecarBlobReader`, manifest from the catalog), a range no
    sidecar serves from L2 (``LIFELINE_PERSIST_URI``, S3 settings as the sidecar's), and the whole
    load again from L2 when no memory copy of a chunk verifies. ``last_reshard`` then says where the
    bytes came from (:class:`ReshardReport`).

    Args:
        settings: the rank's :class:`~lifeline.api.pod.TrainerSettings` (socket, arena, policy,
            ``redis_url`` and ``persist_uri`` for elastic restores).
        layout, rules: the job's layout and the model's pattern rules.
        client: an existing ``SidecarClient`` (default: one connected from ``settings`` at first
            use — a replacement rank joins its generation while its new sidecar is still starting,
            and only its restore waits for the sidecar).
    """

    def __init__(self, settings: Any, layout: Layout, rules: PatternRules, client: SidecarClient | None = None) -> None:
        self.settings = settings
        self._client = client
        self.layout, self.rules, self.rank = layout, rules, settings.rank
        self._plan = None
        self.last_receipt = None
        self.last_restore = None
        self.last_reshard: ReshardReport | None = None
        self._l2_store: tuple[Any, str] | tuple[()] | None = None

    @property
    def client(self) -> SidecarClient:
        """The ``SidecarClient`` (connected on first use; waits for the sidecar's socket up to
        ``LIFELINE_CONNECT_TIMEOUT_SECONDS``).

        Raises:
            SidecarError: no sidecar answered in time.
        """
        if self._client is None:
            self._client = SidecarClient(self.settings)
        return self._client

    def _plan_for(self, state: Mapping[str, Any]):
        if self._plan is None or not self._plan.matches(state):
            self._plan = plan_shard(state, self.layout, self.rank, self.rules)
        return self._plan

    def save(self, step: int, state: Mapping[str, Any], *, generation: int = 0):
        """Hand this rank's state of ``step`` to the sidecar; returns its ``SaveReceipt`` (stall, wait, skipped).

        Raises:
            ArenaFullError: no arena slot freed in time (policy ``wait``).
            SidecarError: the sidecar is gone.
        """
        self.last_receipt = self.client.save(step, state, plan=self._plan_for(state))
        return self.last_receipt

    def save_overlapped(self, step: int, state: Mapping[str, Any], *, generation: int = 0) -> Any:
        """Start a save whose memcpy overlaps the next step; :meth:`settle` finishes it (see
        :meth:`lifeline.sidecar.SidecarClient.save_overlapped`). Returns the ``PendingSave``."""
        return self.client.save_overlapped(step, state, plan=self._plan_for(state))

    def settle(self) -> Any:
        """Finish the overlapped save in flight (join the copy, commit); its ``SaveReceipt`` or ``None``.

        Raises:
            SidecarError: the sidecar is gone.
        """
        if self._client is None:
            return None
        receipt = self._client.settle()
        if receipt is not None:
            self.last_receipt = receipt
        return receipt

    def restore(self, step: int | None = None, *, into: Mapping[str, Any]) -> dict[str, Any]:
        """Restore ``step`` (default: the latest complete one): from the nearest verified copy
        (L0, L1, L2) through the sidecar when the catalog knows it in this layout; else resharded (another
        layout, or a job started again whose catalog is new) from the sidecars holding it or from L2.

        Raises:
            RecoveryError: no tier holds a verified copy.
            CheckpointError: saved in another layout and no ``LIFELINE_PERSIST_URI`` to reshard from.
        """
        out = dict(into)
        saved, cataloged = self._saved(step)
        self.last_reshard = None
        if saved is not None and (saved != self.layout or not cataloged):  # another layout, or a job started again
            self.last_reshard = self._reshard(step, saved, out)
            self.last_restore = None
            return out
        self.last_restore = self.client.restore(step, into=out, plan=self._plan_for(out))
        return out

    def relayout(self, layout: Layout, world_size: int) -> None:
        """Save and restore in ``layout`` from now on (an elastic reshard kept this pod; its rank stays)."""
        self.layout = layout
        self.settings = self.settings.model_copy(update={"world_size": world_size, "layout": layout.to_dict()})
        self._plan = None

    def saved_layout(self, step: int | None) -> Layout | None:
        """The layout checkpoint ``step`` was saved in: rank 0's shard metadata in the catalog, else the
        manifest in L2 (a job started again), else ``None`` (no step, no catalog, no copy)."""
        return self._saved(step)[0]

    def _saved(self, step: int | None) -> tuple[Layout | None, bool]:
        """``(layout, in the catalog)`` of checkpoint ``step`` (see :meth:`saved_layout`)."""
        url = getattr(self.settings, "redis_url", "")
        if step is None:
            return None, False
        raw = None
        if url:
            catalog = Catalog(url, self.settings.job, self.settings.world_size)
            try:
                raw = catalog.meta(step, 0)
            finally:
                catalog.close()
        if raw is not None:
            return Layout.from_dict(json.loads(raw)["layout"]), True
        l2 = self._l2()
        if l2 is None or step not in list_steps(l2[0], l2[1], self.settings.job):
            return None, False
        return read_manifest(l2[0], l2[1], self.settings.job, step).layout, False

    def _l2(self) -> tuple[Any, str] | None:
        s = self.settings
        uri = getattr(s, "persist_uri", "")
        if not uri:
            return None
        return storage_from_uri(uri, StorageOptions(endpoint=s.s3_endpoint, access_key=s.s3_access_key,
                                                    secret_key=s.s3_secret_key.get_secret_value(), secure=s.s3_secure))

    def _reshard(self, step: int | None, saved: Layout, out: dict[str, Any]) -> ReshardReport:
        s = self.settings
        l2 = self._l2()
        if step is not None:
            memory = self._reshard_from_memory(step, saved, l2, out)
            if memory is not None:
                return memory
        if l2 is None:
            raise CheckpointError("restoring into another layout needs the step in the sidecars' memory or in L2, "
                                  "and LIFELINE_PERSIST_URI is not set", job=s.job, rank=self.rank, step=step)
        storage, prefix = l2
        if step is None:
            steps = list_steps(storage, prefix, s.job)
            if not steps:
                raise CheckpointError("no committed checkpoint in L2 to reshard from", job=s.job, rank=self.rank)
            step = steps[-1]
        report = load(storage, prefix, s.job, step, self.layout, self.rank, self.rules, out)
        return ReshardReport(step, saved, report.needed_bytes, {"L0": 0, "L1": 0, "L2": report.read_bytes},
                             report.fallbacks)

    def _reshard_from_memory(self, step: int, saved: Layout, l2: tuple[Any, str] | None,
                             out: dict[str, Any]) -> ReshardReport | None:
        """Load ``step`` resharded with the catalog's manifest from the sidecars holding it (a range none
        serves from L2); ``None`` when the catalog lacks the manifest or no intact copy of some chunk
        was found there (``out`` is then rewritten by the L2 load)."""
        s = self.settings
        catalog = Catalog(s.redis_url, s.job, saved.world_size, username=s.redis_username,
                          password=s.redis_password.get_secret_value())
        try:
            manifest = manifest_from_catalog(catalog, step, saved.world_size)
            storage, prefix = l2 if l2 is not None else (None, "")
            with SidecarBlobReader(catalog, secret=s.secret.get_secret_value().encode(), job=s.job, storage=storage,
                                   prefix=prefix, source=s.pod_ip, local=self.rank, local_client=self.client) as reader:
                report = load_shard(manifest, reader, self.layout, self.rank, self.rules, out)
            return ReshardReport(step, saved, report.needed_bytes, dict(reader.bytes_by_tier),
                                 [*reader.fallbacks, *report.fallbacks], reader.local_bytes)
        except (ManifestError, CatalogError):
            return None  # the step's metadata is gone from the catalog: L2 has the manifest
        except (ChecksumError, StorageError) as err:
            if l2 is None:
                raise
            print(json.dumps({"event": "reshard_fallback", "rank": self.rank, "step": step, "error": str(err)[:300]}),
                  flush=True)
            return None
        finally:
            catalog.close()

    def committed_to_l2(self, step: int) -> bool:
        """Whether checkpoint ``step`` is committed to L2 (its manifest, written last, exists); true
        when no L2 store is configured. Raises StorageError when the store cannot be reached."""
        if self._l2_store is None:
            self._l2_store = self._l2() or ()
        if not self._l2_store:
            return True
        storage, prefix = self._l2_store
        return storage.exists(manifest_key(prefix, self.settings.job, step))

    def latest_step(self) -> int | None:
        """The job's latest complete step: the catalog's, else (a job started again, its catalog new)
        the latest checkpoint committed to L2, in whatever layout it was saved; ``None`` when neither."""
        latest = self.client.latest_complete_step()
        if latest is not None:
            return latest
        l2 = self._l2()
        steps = list_steps(l2[0], l2[1], self.settings.job) if l2 is not None else []
        return max(steps) if steps else None

