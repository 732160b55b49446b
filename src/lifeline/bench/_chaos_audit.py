"""What ``lifeline bench chaos`` checks at the end of a trial, while every sidecar still runs.

* :func:`audit_tiers`: every copy a reader can see — each L0 and L1 holding the catalog lists (the
  newest :data:`RECENT_STEPS` steps) whose holder's sidecar is registered (one that is not — a lost
  node's — is *stale*: no reader can get it) and every checkpoint committed to L2 — is read and verified against
  its checksums: the L0 copy in the rank's arena slot files, the L1 copy from the holding sidecar over
  the authenticated peer protocol, the L2 blobs from storage. A copy that fails is *torn* unless the
  trial flipped a byte in it on purpose (then it counts as a flipped copy still visible).
* :func:`corruption_outcomes`: for every copy a ``flip`` corrupted, whether a sidecar reported it
  (catalog corruption reports, gathered during the run, and the sidecars' logs), restored it without a
  report (used: a failure), or nothing read it (gone, or still listed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lifeline.checkpoint import ShardMetadata, TensorMeta, blob_key, list_steps, read_manifest
from lifeline.errors import ChecksumError, LifelineError

__all__ = ["RECENT_STEPS", "audit_tiers", "corruption_outcomes", "reports_in_logs", "restores_in_logs", "report_key"]

RECENT_STEPS = 64


def report_key(step: Any, rank: Any, tier: Any) -> tuple[int, int, str]:
    """The ``(step, rank, tier)`` a corruption report or a flipped copy is about."""
    return int(step), int(rank), str(tier)


def reports_in_logs(logs: Path | list[Path], *, job: str | None = None) -> list[dict[str, Any]]:
    """Corruption reports the sidecars logged (``corrupt copy detected and not used``), each with its
    ``step``, ``rank``, ``tier``, ``by`` (the logging rank) and ``message``.

    Args:
        logs: a run's log directory (its ``rank-*-sidecar.log`` files are read) or the log files.
        job: only lines of this job (``None``: every line).
    """
    files = sorted(Path(logs).glob("rank-*-sidecar.log")) if isinstance(logs, Path) else logs
    out = []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            if "corrupt copy detected" not in line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if job is not None and doc.get("job") != job:
                continue
            msg = str(doc.get("message", ""))
            ctx = dict(part.split("=", 1) for part in msg.rsplit("(", 1)[-1].rstrip(")").split(", ") if "=" in part)
            if {"rank", "step", "tier"} <= set(ctx):
                out.append({"step": int(ctx["step"]), "rank": int(ctx["rank"]), "tier": ctx["tier"],
                            "by": doc.get("rank"), "message": msg[:300]})
    return out


def restores_in_logs(logs: Path | list[Path], *, job: str | None = None) -> list[dict[str, Any]]:
    """Copies the sidecars restored (``restored step S rank R from T``): ``step``, ``rank``, ``tier``,
    ``by`` (the restoring rank) and ``at`` (seconds since the epoch)."""
    from datetime import datetime

    files = sorted(Path(logs).glob("rank-*-sidecar.log")) if isinstance(logs, Path) else logs
    out = []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            if "restored step" not in line:
                continue
            try:
                doc = json.loads(line)
                _, _, step, _, rank, _, tier = str(doc["message"]).split()[:7]
                at = datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError):
                continue
            if job is None or doc.get("job") == job:
                out.append({"step": int(step), "rank": int(rank), "tier": tier, "by": doc.get("rank"), "at": at})
    return out


def _shard_of(manifest: Any, rank: int) -> ShardMetadata:
    tensors = tuple(TensorMeta(fqn, rec.dtype, tuple(rec.shape), dict(rec.pattern),
                               tuple(ref.chunk for ref in rec.chunks if ref.rank == rank))
                    for fqn, rec in sorted(manifest.tensors.items()) if any(ref.rank == rank for ref in rec.chunks))
    return ShardMetadata(job=manifest.job, step=manifest.step, rank=rank, layout=manifest.layout,
                         nbytes=manifest.blobs[rank], tensors=tensors,
                         bytes_entries=tuple(manifest.bytes_entries.get(rank, {}).values()))


def l0_copy_ok(arena_dir: Path, meta: ShardMetadata) -> bool | None:
    """Whether the arena slot holding ``meta``'s blob verifies: ``True``; ``False`` when the slot that
    holds it (more than half of its chunks verify) has a chunk that does not; ``None`` when no slot
    holds it."""
    chunks = [c for t in meta.tensors for c in t.chunks]
    best = 0
    for path in sorted(Path(arena_dir).glob("slot-*.bin")):
        try:
            data = path.read_bytes()[: meta.nbytes]
        except OSError:
            continue
        good = 0
        for c in chunks:
            try:
                c.verify(memoryview(data)[c.byte_offset: c.byte_offset + c.byte_length], 0, name="", rank=meta.rank)
                good += 1
            except ChecksumError:
                pass
        if good == len(chunks):
            try:
                meta.verify(data)
                return True
            except ChecksumError:
                best = max(best, good)
        best = max(best, good)
    return False if chunks and best * 2 > len(chunks) else None


def _fetch_l1(sup: Any, holder: int, step: int, rank: int) -> bytes | None:
    """Rank ``rank``'s copy of ``step`` from ``holder``'s sidecar (``None``: it does not hold it)."""
    from lifeline.errors import PeerError
    from lifeline.sidecar.peer import PeerClient

    reg = sup.catalog.sidecar(holder)
    if reg is None:
        return None
    with PeerClient(reg.host, reg.port, secret=sup.secrets.hmac_key.encode(), job=sup.name, timeout=30.0) as pc:
        try:
            data, _ = pc.get(kind="shard", step=step, rank=rank)
        except PeerError as err:
            if getattr(err, "missing", False):
                return None
            raise
        return bytes(data)


def audit_tiers(sup: Any, flipped: set[tuple[int, int, str]]) -> dict[str, Any]:
    """Read and verify every visible copy (see the module docstring).

    Args:
        sup: the trial's :class:`~lifeline.launch.supervisor.Supervisor`, processes still running.
        flipped: ``(step, rank, tier)`` of the copies the trial corrupted on purpose.

    Returns:
        ``{"checked": {tier: n}, "torn": [..], "flipped_visible": [..], "stale": [..]}``: ``torn``
        lists copies that failed verification and were not flipped (must be empty), ``flipped_visible``
        flipped copies still listed, ``stale`` holdings listed but not held by their holder.
    """
    cat = sup.catalog
    out: dict[str, Any] = {"checked": {"L0": 0, "L1": 0, "L2": 0}, "torn": [], "flipped_visible": [], "stale": []}

    def bad(step: int, rank: int, tier: str, holder: Any, why: str) -> None:
        entry = {"step": step, "rank": rank, "tier": tier, "holder": holder, "error": why[:300]}
        out["flipped_visible" if (step, rank, tier) in flipped else "torn"].append(entry)

    steps = cat.steps()[-RECENT_STEPS:]
    live = cat.sidecars()
    for h in sorted(cat.holdings_at(steps), key=lambda h: (h.step, h.rank, h.tier, h.holder or 0)):
        if h.tier == "L2":
            continue
        if h.holder not in live:  # its sidecar is gone (a lost node): no reader can get this copy
            out["stale"].append({"step": h.step, "rank": h.rank, "tier": h.tier, "holder": h.holder,
                                 "error": "the holder's sidecar is not registered"})
            continue
        raw = cat.meta(h.step, h.rank)
        if raw is None:
            out["stale"].append({"step": h.step, "rank": h.rank, "tier": h.tier, "holder": h.holder,
                                 "error": "no shard metadata"})
            continue
        meta = ShardMetadata.from_json(raw)
        out["checked"][h.tier] += 1
        if h.tier == "L0":
            pod = sup.pods.get(h.holder)
            ok = pod is not None and l0_copy_ok(pod.spec.arena_dir, meta)
            if ok is None:
                out["stale"].append({"step": h.step, "rank": h.rank, "tier": "L0", "holder": h.holder,
                                     "error": "no arena slot holds it"})
            elif not ok:
                bad(h.step, h.rank, "L0", h.holder, "an arena slot holds it with a checksum mismatch")
            continue
        try:
            data = _fetch_l1(sup, h.holder, h.step, h.rank)
        except LifelineError as err:
            out["stale"].append({"step": h.step, "rank": h.rank, "tier": "L1", "holder": h.holder,
                                 "error": str(err)[:300]})
            continue
        if data is None:
            out["stale"].append({"step": h.step, "rank": h.rank, "tier": "L1", "holder": h.holder,
                                 "error": "the holder does not hold it"})
            continue
        try:
            meta.verify(data)
        except ChecksumError as err:
            bad(h.step, h.rank, "L1", h.holder, str(err))
    found = sup.services.storage()
    if found is not None:
        storage, prefix = found
        for step in list_steps(storage, prefix, sup.name):
            manifest = read_manifest(storage, prefix, sup.name, step)
            for rank in range(manifest.layout.world_size):
                out["checked"]["L2"] += 1
                try:
                    _shard_of(manifest, rank).verify(storage.get(blob_key(prefix, sup.name, step, rank)))
                except LifelineError as err:
                    bad(step, rank, "L2", None, str(err))
    return out


def corruption_outcomes(copies: list[dict[str, Any]], reports: list[dict[str, Any]],
                        visible: list[dict[str, Any]], restores: list[dict[str, Any]] | None = None,
                        flipped_at: dict[tuple[int, int, str], float] | None = None) -> dict[str, Any]:
    """For every flipped copy: ``detected`` (a report names its step, rank and tier), ``used`` (a
    restore from that step, rank and tier after the flip, with no report: a failure), ``gone_unread``
    (evicted before anything read it) or ``visible_unread`` (still listed at the end and never read —
    a newer copy was restored instead, or the job ended first: with verified reads, a corrupt copy is
    found only when read).

    Returns ``{"copies", "detected", "gone_unread", "visible_unread", "used": [...]}``.
    """
    seen = {report_key(r["step"], r["rank"], r["tier"]) for r in reports if r.get("step") is not None}
    still = {report_key(v["step"], v["rank"], v["tier"]) for v in visible}
    flipped_at = flipped_at or {}
    out: dict[str, Any] = {"copies": len(copies), "detected": 0, "gone_unread": 0, "visible_unread": 0, "used": []}
    for c in copies:
        key = report_key(c["step"], c["rank"], c["tier"])
        if key in seen:
            out["detected"] += 1
        elif any(report_key(r["step"], r["rank"], r["tier"]) == key and r["at"] >= flipped_at.get(key, 0.0)
                 for r in restores or []):
            out["used"].append(c)
        elif key in still:
            out["visible_unread"] += 1
        else:
            out["gone_unread"] += 1
    return out
