"""The sidecar-backed :class:`~lifeline.runtime.Checkpointer` (the production path), with elastic
restores: a checkpoint saved in another layout is read from L2 and resharded on load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lifeline.catalog import Catalog
from lifeline.checkpoint import Layout, PatternRules, list_steps, load, plan_shard, storage_from_uri
from lifeline.errors import CheckpointError
from lifeline.sidecar.client import SidecarClient

__all__ = ["SidecarCheckpointer"]


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
    checkpoint from L2 (``LIFELINE_PERSIST_URI``, S3 settings as the sidecar's) with
    :func:`lifeline.checkpoint.load`, which intersects this rank's chunks with the stored ones.

    Args:
        settings: the rank's :class:`~lifeline.api.pod.TrainerSettings` (socket, arena, policy,
            ``redis_url`` and ``persist_uri`` for elastic restores).
        layout, rules: the job's layout and the model's pattern rules.
        client: an existing ``SidecarClient`` (default: one connected from ``settings`` at first
            use — a replacement rank joins its generation while its new sidecar is still starting,
            and only its restore waits for the sidecar).
    """

    def __init__(self, settings: Any, layout: Layout, rules: PatternRules, client: Any = None) -> None:
        self.settings = settings
        self._client = client
        self.layout, self.rules, self.rank = layout, rules, settings.rank
        self._plan = None
        self.last_receipt = None
        self.last_restore = None

    @property
    def client(self) -> Any:
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
        (L0, L1, L2) through the sidecar when it was saved in this layout, else from L2 resharded.

        Raises:
            RecoveryError: no tier holds a verified copy.
            CheckpointError: saved in another layout and no ``LIFELINE_PERSIST_URI`` to reshard from.
        """
        out = dict(into)
        saved = self.saved_layout(step)
        if saved is not None and saved != self.layout:
            self._reshard(step, saved, out)
            self.last_restore = None
            return out
        self.last_restore = self.client.restore(step, into=out, plan=self._plan_for(out))
        return out

    def saved_layout(self, step: int | None) -> Layout | None:
        """The layout checkpoint ``step`` was saved in (rank 0's shard metadata in the catalog), or
        ``None`` when unknown (no step, no catalog, no metadata)."""
        url = getattr(self.settings, "redis_url", "")
        if step is None or not url:
            return None
        catalog = Catalog(url, self.settings.job, self.settings.world_size)
        try:
            raw = catalog.meta(step, 0)
        finally:
            catalog.close()
        return None if raw is None else Layout.from_dict(json.loads(raw)["layout"])

    def _l2(self) -> tuple[Any, str]:
        s = self.settings
        uri = getattr(s, "persist_uri", "")
        if not uri:
            raise CheckpointError("restoring into another layout reads L2, but LIFELINE_PERSIST_URI is not set",
                                  job=s.job, rank=self.rank)
        options: dict[str, Any] = {}
        if uri.startswith("s3://"):
            options = dict(endpoint=s.s3_endpoint, access_key=s.s3_access_key,
                           secret_key=s.s3_secret_key.get_secret_value(), secure=s.s3_secure)
        return storage_from_uri(uri, **options)

    def _reshard(self, step: int | None, saved: Layout, out: dict[str, Any]) -> None:
        storage, prefix = self._l2()
        if step is None:
            steps = list_steps(storage, prefix, self.settings.job)
            if not steps:
                raise CheckpointError("no committed checkpoint in L2 to reshard from", job=self.settings.job,
                                      rank=self.rank)
            step = steps[-1]
        load(storage, prefix, self.settings.job, step, self.layout, self.rank, self.rules, out)

    def latest_step(self) -> int | None:
        """The job's latest complete step, or ``None``."""
        return self.client.latest_complete_step()

