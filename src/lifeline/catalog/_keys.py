"""Every Redis key of a job, spelled once. Nothing outside :mod:`lifeline.catalog` builds a key.

All keys are namespaced ``lifeline:<job>:``:

=============================  =====================================================================
``sidecar:<rank>``             :class:`~lifeline.catalog.SidecarRegistration` JSON; expires after the
                               heartbeat TTL unless refreshed (the registration *is* the heartbeat)
``holders:<step>:<rank>``      set of holdings of rank's shard at step: ``L0@<r>``, ``L1@<r>``
                               (held by rank r's sidecar) or ``L2`` (persisted object)
``held:<h>``                   sorted set of ``<step>:<rank>:<tier>`` (score: step), the memory copies
                               rank h's sidecar holds: the reverse index of ``holders`` (forgetting a
                               dead sidecar's copies reads it, not every step x rank)
``meta:<step>:<rank>``         the shard's ``ShardMetadata`` JSON (checksums of every chunk)
``filed:<step>``               set of the ranks whose metadata of step is filed (what pruning deletes)
``steps``                      sorted set of steps with any holding (pruned past a horizon once no
                               copy of a step is left: ``Catalog.prune``)
``pruned``                     the newest step pruning has examined
``complete``                   the job's latest complete step (advanced only by a Lua script)
``complete:floors``            hash rank -> the step that rank derived or had seen complete, while
                               ``complete`` is missing (a new job, or Redis restarted empty)
``persisted:<step>``           set of ranks whose blob is in L2; ``commit:<step>`` the rank committing it
``corrupt``                    list of :class:`~lifeline.catalog.CorruptionReport` JSON
``plan:<generation>``          a :class:`~lifeline.api.recovery.RecoveryPlan` JSON
``generation``                 the job's current generation
``progress``                   hash rank -> the rank's latest :class:`~lifeline.catalog.ProgressReport`
``beats``                      hash rank -> seconds since the epoch of the rank's latest recovery beat
                               (written every second while its trainer starts or recovers)
``rdzv:<generation>``          ``host:port`` of that generation's rendezvous store
``logs``                       hash rank -> upstream-log coverage ``{"first": s, "last": s, "replicas": n}``
``logs:gone``                  hash ``o:<rank>`` / ``r:<rank>`` -> the last step of the rank's log whose
                               original / replica died with a sidecar (written by plans)
``logs:floor``                 hash rank -> the last step of its log with no copy left (coverage
                               starts after it)
``windows``                    hash rank -> its sparse windows committed to L2 ``{"starts": [...], "window": W}``
``owner``                      UID of the TrainingJob owning these keys
``spared``                     a step no sidecar evicts from memory (set, with a TTL, atomically with the
                               check that a plan's memory copies are still recorded; docs/elastic.md)
=============================  =====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from lifeline.api.recovery import Tier

__all__ = ["Keys", "held_entry", "holder_member", "parse_held_entry", "parse_member"]


@dataclass(frozen=True)
class Keys:
    """The key names of one job (``prefix`` is ``lifeline:<job>:``)."""

    job: str

    @property
    def prefix(self) -> str:
        """``lifeline:<job>:`` (every key of the job starts with it)."""
        return f"lifeline:{self.job}:"

    @property
    def pattern(self) -> str:
        """A SCAN pattern matching every key of the job."""
        return self.prefix + "*"

    def sidecar(self, rank: int) -> str:
        return f"{self.prefix}sidecar:{rank}"

    def holders(self, step: int, rank: int) -> str:
        return f"{self.prefix}holders:{step}:{rank}"

    @property
    def holders_prefix(self) -> str:
        """What the Lua script appends ``<step>:<rank>`` to."""
        return f"{self.prefix}holders:"

    def held(self, holder: int) -> str:
        return f"{self.prefix}held:{holder}"

    @property
    def held_prefix(self) -> str:
        """What the Lua script appends ``<holder>`` to."""
        return f"{self.prefix}held:"

    def meta(self, step: int, rank: int) -> str:
        return f"{self.prefix}meta:{step}:{rank}"

    def persisted(self, step: int) -> str:
        return f"{self.prefix}persisted:{step}"

    def commit(self, step: int) -> str:
        return f"{self.prefix}commit:{step}"

    def plan(self, generation: int) -> str:
        return f"{self.prefix}plan:{generation}"

    def rendezvous(self, generation: int) -> str:
        return f"{self.prefix}rdzv:{generation}"

    def filed(self, step: int) -> str:
        return f"{self.prefix}filed:{step}"

    steps = property(lambda self: f"{self.prefix}steps")
    pruned = property(lambda self: f"{self.prefix}pruned")
    complete = property(lambda self: f"{self.prefix}complete")
    complete_floors = property(lambda self: f"{self.prefix}complete:floors")
    corrupt = property(lambda self: f"{self.prefix}corrupt")
    generation = property(lambda self: f"{self.prefix}generation")
    progress = property(lambda self: f"{self.prefix}progress")
    beats = property(lambda self: f"{self.prefix}beats")
    logs = property(lambda self: f"{self.prefix}logs")
    logs_gone = property(lambda self: f"{self.prefix}logs:gone")
    logs_floor = property(lambda self: f"{self.prefix}logs:floor")
    windows = property(lambda self: f"{self.prefix}windows")
    owner = property(lambda self: f"{self.prefix}owner")
    spared = property(lambda self: f"{self.prefix}spared")


def holder_member(tier: Tier, holder: int | None) -> str:
    """The set member recording a holding: ``L0@<r>``/``L1@<r>`` (rank r's sidecar) or ``L2``.

    Raises:
        ValueError: a memory tier without a holder, or L2 with one.
    """
    if tier == "L2":
        if holder is not None:
            raise ValueError("an L2 holding has no holder rank")
        return "L2"
    if holder is None:
        raise ValueError(f"an {tier} holding needs the holder rank")
    return f"{tier}@{holder}"


def parse_member(member: str) -> tuple[Tier, int | None] | None:
    """The inverse of :func:`holder_member`; ``None`` for a member it does not recognise."""
    tier, _, holder = member.partition("@")
    if tier == "L2" and not holder:
        return "L2", None
    if tier in ("L0", "L1") and holder.isdigit():
        return tier, int(holder)  # type: ignore[return-value]
    return None


def held_entry(step: int, rank: int, tier: Tier) -> str:
    """The member of ``held:<holder>`` recording the holder's copy of (step, rank): ``<step>:<rank>:<tier>``."""
    return f"{step}:{rank}:{tier}"


def parse_held_entry(entry: str) -> tuple[int, int, Tier] | None:
    """``(step, rank, tier)`` of a :func:`held_entry`; ``None`` for a malformed one (ignored)."""
    parts = entry.split(":")
    if len(parts) != 3 or parts[2] not in ("L0", "L1") or not all(x.lstrip("-").isdigit() for x in parts[:2]):
        return None
    return int(parts[0]), int(parts[1]), parts[2]  # type: ignore[return-value]
