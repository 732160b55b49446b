"""Which copies of which steps a run held at a given moment, rebuilt from its logs (``bench fuzz``'s rung check).

The recovery ladder (``lifeline.control.plan``) restores the latest step every shard has a verified
copy of, from memory (L0/L1) when it can. To check that a recovery took the cheapest rung the copies
allowed, :class:`Copies` rebuilds, from what the processes logged, a *lower bound* on the copies
that existed when the recovery was planned:

* L0: the trainer's ``save`` event (the copy handed to its sidecar), ``replicated shard step S to rank
  T`` lines of the sidecars (L1, held by rank T's sidecar), ``committed step S to L2`` (L2, every
  shard of S).
* A copy counts only once it is :data:`SETTLE_SECONDS` old when the recovery is planned (the catalog
  learns of it after the sidecar sealed and verified it) and only if it was taken after every
  earlier recovery that restored an older step (the catalog may drop the abandoned timeline).
* Memory copies beyond the newest ``min(keep, MEMORY_KEEP)`` per rank are evicted (both the newest by
  time and the highest by step number are kept; a copy counts only if both rules keep it).
* A copy is destroyed when its holder's sidecar dies — a ``sidecar``, ``node`` or ``flip`` at L1 kill
  of that rank; an L2 ``flip`` takes down several nodes: every memory copy counts as lost — also when
  it was logged up to :data:`DEATH_GRACE_SECONDS` after the death (a dying process's last line), and
  when a ``flip`` corrupted it (the fault's ``copies``).

Everything uncertain removes copies, never adds one, so "the recovery restored an older step than
:meth:`Copies.covered`" is a finding, not noise.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["SETTLE_SECONDS", "DEATH_GRACE_SECONDS", "MEMORY_KEEP", "Copies"]

SETTLE_SECONDS = 5.0
DEATH_GRACE_SECONDS = 2.0
"""A copy logged up to this long after its holder died may be the dying process's last line: lost too."""
MEMORY_KEEP = 2
"""A sidecar's arena has 3 slots (``DEFAULT_SLOTS``), one of them taken by the save in flight."""


def _epoch(text: str) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _lines(path: Path):
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                continue


class Copies:
    """The copies of a run (its ``state_dir/logs``) and its fired faults (the summary's ``faults``)."""

    def __init__(self, logs: Path, faults: list[dict[str, Any]], *, world: int, keep: int) -> None:
        self.world = world
        self.keep = max(1, min(keep, MEMORY_KEEP))
        self.saves: dict[int, list[tuple[float, int]]] = {r: [] for r in range(world)}
        self.replicas: dict[tuple[int, int], list[tuple[float, int]]] = {}  # (rank, holder) -> [(t, step)]
        self.l2: list[tuple[float, int]] = []
        node_rank: dict[str, int] = {}
        for path in sorted(Path(logs).glob("rank-*-trainer.log")):
            for ev in _lines(path):
                if ev.get("event") == "save" and not ev.get("skipped") and ev.get("step") is not None \
                        and ev.get("rank") in self.saves:
                    self.saves[ev["rank"]].append((float(ev["time"]), int(ev["step"])))
        for path in sorted(Path(logs).glob("rank-*-sidecar.log")):
            parts = path.name.split("-")  # rank-R-node-N-sidecar.log
            if len(parts) >= 4:
                node_rank["-".join(parts[2:-1])] = int(parts[1])
            for ev in _lines(path):
                msg, t = str(ev.get("message", "")), _epoch(ev.get("time", ""))
                if t is None:
                    continue
                if msg.startswith("replicated shard step") and ev.get("target") is not None:
                    self.replicas.setdefault((int(ev["rank"]), int(ev["target"])), []).append((t, int(ev["step"])))
                elif msg.startswith("committed step") and "L2" in msg:
                    try:
                        self.l2.append((t, int(msg.split()[2])))
                    except (IndexError, ValueError):
                        continue
        # sidecar deaths: (time, rank or None for every rank); flipped copies: (step, rank, tier, holder)
        self.deaths: list[tuple[float, int | None]] = []
        self.flipped: list[tuple[float, int, int, str, Any]] = []
        for f in faults:
            if f.get("ineffective"):
                continue
            kind, tier, at = f["kind"], f.get("tier"), float(f["at"])
            if kind in ("sidecar", "node") or (kind == "flip" and tier == "L1"):
                self.deaths.append((at, int(f["rank"])))
            elif kind == "flip" and tier == "L2":
                self.deaths.append((at, None))
            for node in f.get("nodes") or []:
                if node in node_rank:
                    self.deaths.append((at, node_rank[node]))
            for c in f.get("copies") or []:
                self.flipped.append((at, int(c["step"]), int(c["rank"]), str(c["tier"]), c.get("holder")))

    def _kept(self, events: list[tuple[float, int]], until: float) -> set[int]:
        """Steps of ``events`` still held at ``until``: newest by time and highest by number."""
        seen = [(t, s) for t, s in events if t <= until]
        last: dict[int, float] = {}
        for t, s in seen:
            last[s] = t
        by_time = {s for s, _ in sorted(last.items(), key=lambda kv: kv[1])[-self.keep:]}
        by_step = set(sorted(last)[-self.keep:])
        return by_time & by_step

    def _dead(self, rank: int, since: float, until: float) -> bool:
        return any(since - DEATH_GRACE_SECONDS <= t <= until and (r is None or r == rank) for t, r in self.deaths)

    def _is_flipped(self, step: int, rank: int, tier: str, until: float, holder: Any = None) -> bool:
        return any(t <= until and s == step and r == rank and ti == tier and (holder is None or h is None or h == holder)
                   for t, s, r, ti, h in self.flipped)

    def held(self, rank: int, at: float, tiers: tuple[str, ...], restores: list[tuple[float, int]]) -> set[int]:
        """Steps of ``rank``'s shard with a copy at one of ``tiers`` when a recovery is planned at ``at``
        (``restores``: ``(round_at, restore_step)`` of the earlier recoveries)."""
        ready = at - SETTLE_SECONDS

        def valid(t: float, step: int) -> bool:
            return t <= ready and not any(t <= rt < at and step > rs for rt, rs in restores)

        out: set[int] = set()
        if "L0" in tiers:
            kept = self._kept(self.saves[rank], at)
            for t, s in self.saves[rank]:
                if s in kept and valid(t, s) and not self._dead(rank, t, at) \
                        and not self._is_flipped(s, rank, "L0", at):
                    out.add(s)
        if "L1" in tiers:
            for (src, holder), events in self.replicas.items():
                if src != rank:
                    continue
                kept = self._kept(events, at)
                for t, s in events:
                    if s in kept and valid(t, s) and not self._dead(holder, t, at) \
                            and not self._is_flipped(s, rank, "L1", at, holder):
                        out.add(s)
        if "L2" in tiers:
            for t, s in self.l2:
                if valid(t, s) and not self._is_flipped(s, rank, "L2", at):
                    out.add(s)
        return out

    def covered(self, at: float, tiers: tuple[str, ...], restores: list[tuple[float, int]], *,
                ranks: range | list[int] | None = None, upto: int | None = None) -> int | None:
        """The latest step every rank of ``ranks`` (default: all) held a copy of at one of ``tiers``
        (see :meth:`held`), at most ``upto``; ``None`` when there is none."""
        common: set[int] | None = None
        for r in ranks if ranks is not None else range(self.world):
            steps = self.held(r, at, tiers, restores)
            common = steps if common is None else common & steps
        found = [s for s in common or () if s >= 1 and (upto is None or s <= upto)]
        return max(found) if found else None
