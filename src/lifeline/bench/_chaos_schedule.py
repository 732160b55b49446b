"""The seeded fault schedules of ``lifeline bench chaos``: which faults a trial injects, where and when.

A trial's schedule is a pure function of its seed (:func:`schedule`), so a failed trial replays with
``--seed``. Each trial draws 1..``max_faults`` faults from :data:`FAULTS` at distinct random steps; with
probability :data:`DURING_RECOVERY` one more process fault is armed ``when=recovery`` at the step of
the first fault that calls for a recovery, so it fires while that recovery is in progress.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lifeline.launch.inject import Injection

__all__ = ["FAULTS", "CLUSTER_FAULTS", "PROCESS_FAULTS", "DURING_RECOVERY", "TrialSpec", "schedule", "fault_name"]

FAULTS = ("trainer", "sidecar", "node", "hang", "redis", "minio", "flip:L0", "flip:L1", "flip:L2")
"""The faults drawn (``flip:T``: a flipped byte in a copy at tier ``T``)."""
CLUSTER_FAULTS = FAULTS + ("operator",)
"""The cluster test bed adds killing the operator (its pod force-deleted; the Deployment starts another)."""
PROCESS_FAULTS = ("trainer", "sidecar", "node", "hang")
"""Faults that may be armed to fire during a recovery."""
DURING_RECOVERY = 0.4
"""Probability that a trial also arms a fault during a recovery."""


def fault_name(inj: Injection) -> str:
    """The fault's name in counts: its kind, ``flip:L0``..``flip:L2`` for flips, and a
    ``+recovery`` suffix for one armed ``when=recovery``."""
    base = f"flip:{inj.tier}" if inj.kind == "flip" else inj.kind
    return base + ("+recovery" if inj.when == "recovery" else "")


@dataclass(frozen=True)
class TrialSpec:
    """One trial: its ``seed`` and the ``injections`` it runs with."""

    seed: int
    injections: tuple[Injection, ...]

    @property
    def needs_minio(self) -> bool:
        """Whether the trial takes MinIO down (its L2 must then be the run's own MinIO)."""
        return any(i.kind == "minio" for i in self.injections)

    @property
    def lost_nodes(self) -> int:
        """Nodes the trial can lose at most (a node loss: 1; an L2 flip: the rank's and its replicas')."""
        return sum(2 if (i.kind == "flip" and i.tier == "L2") else 1 for i in self.injections if i.loses_node)

    def describe(self) -> list[str]:
        """The ``--inject-failure`` values that replay it."""
        return [str(i) for i in self.injections]


def schedule(seed: int, *, world_size: int, steps: int, persist_every: int, max_faults: int = 2,
             faults: tuple[str, ...] = FAULTS) -> TrialSpec:
    """The trial of ``seed``: 1..``max_faults`` faults of ``faults`` at distinct steps in
    ``[2, steps - 2]`` (an L2 flip after the first L2 checkpoint), random ranks, plus possibly one
    fault during a recovery (see the module docstring). Deterministic in its arguments."""
    rng = random.Random(seed)
    n = rng.randint(1, max_faults)
    kinds = [rng.choice(faults) for _ in range(n)]
    span = list(range(2, steps - 1))
    chosen = sorted(rng.sample(span, min(n, len(span))))
    out: list[Injection] = []
    for kind, step in zip(kinds, chosen):
        base, _, tier = kind.partition(":")
        if base == "flip" and tier == "L2":
            step = max(step, persist_every + 1)
        if base == "minio":
            out.append(Injection("minio", 0, step, seconds=float(rng.randint(2, 5))))
        elif base in ("redis", "operator"):
            out.append(Injection(base, 0, step))
        else:
            out.append(Injection(base, rng.randrange(world_size), step, tier or None))
    first = next((i for i in sorted(out, key=lambda i: i.step) if i.kind not in ("redis", "minio", "operator")), None)
    if first is not None and rng.random() < DURING_RECOVERY:
        kind = rng.choice(PROCESS_FAULTS)
        out.append(Injection(kind, rng.randrange(world_size), first.step, when="recovery"))
    return TrialSpec(seed, tuple(sorted(out, key=lambda i: (i.step, i.when is not None))))
