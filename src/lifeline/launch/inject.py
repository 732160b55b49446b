"""Failure injection for local runs: ``--inject-failure trainer:rank=1:step=20``.

Kinds (what :mod:`lifeline.launch.faults` does when one fires):

* ``trainer`` — SIGKILL the rank's trainer process (its sidecar keeps L0: a crash).
* ``sidecar`` — SIGKILL the rank's sidecar (its L0 copies and the L1 copies it held are lost).
* ``node`` — SIGKILL sidecar and trainer together and mark the rank's node lost (a node failure:
  the rank moves to another node and restores from a peer's L1 copy).
* ``hang`` — SIGSTOP the rank's trainer (no progress: the hang timeout detects it).
* ``preempt`` — a preemption with a grace of ``seconds`` (default 10, Kubernetes'
  ``terminationGracePeriodSeconds``): SIGTERM to the rank's trainer, which checkpoints the step it
  completed to L1 and exits (:mod:`lifeline.runtime._preempt`); once it exited, or after the grace,
  SIGKILL what is left of the pod and mark its node lost (a preempted node goes away: the rank moves
  to another node and restores the step it saved, the others that same step; docs/preemption.md).
* ``redis`` — SIGKILL the Redis server; the launcher restarts it, empty, on the same address (a Redis
  pod without persistence) and repairs what only it knows (the job's ACL user, the current plan, the
  L2 holdings); sidecars re-register their holdings themselves. No ``rank``.
* ``minio`` — SIGKILL the run's MinIO server and restart it ``seconds`` later (default 3) on the same
  address and data directory: an object-store outage. No ``rank``; needs the MinIO ``lifeline run``
  starts (an ``s3://`` L2 URI without ``--s3-endpoint``).
* ``flip`` — flip one byte of a copy of the rank's newest checkpoint at ``tier``, then cause the
  failure that makes Lifeline read that copy: ``L0`` (the rank's own arena slot) with a trainer
  SIGKILL (its restart in place reads L0), ``L1`` (every peer's in-memory replica, through
  ``/proc/PID/mem``) with the loss of the rank's node (its replacement reads L1), ``L2`` (the rank's
  blob of the newest step committed to storage) with the loss of the rank's node and of the nodes
  holding its replicas (only L2 holds its shard). The corruption must be detected and the copy not used
  (DESIGN.md invariant 4).
* ``nan`` — the trainer of ``rank`` poisons its batch of ``step``: the loss and gradient norm its step
  check reads turn NaN (every try of the step, or only the first with ``transient=1``). The numerics
  check (docs/numerics.md) must stop the update, re-run the step and skip the batch (or, transient,
  report a faulty rank). Delivered by the launcher in :data:`NAN_ENV` (the trainer poisons itself; the
  launcher's record fires once the rank reported the step); needs ``spec.recovery.lossSpike.enabled``.
* ``slow`` — a slow node: from ``step`` on, the trainer of ``rank`` sleeps before each step so that its
  compute time becomes ``factor ×`` what it was before (``factor`` default 2;
  :mod:`lifeline.runtime._stragglers`), for as long as the rank stays on its first node
  (``node-R``; a replacement elsewhere is not slow). Delivered in :data:`SLOW_ENV` like ``nan``; the
  straggler detection (``spec.recovery.straggler``, docs/stragglers.md) must flag the rank and, with
  ``action: replace``, move it.

Fields: ``rank=R`` (process kinds and ``flip``), ``step=S`` (always), ``tier=L0|L1|L2`` (``flip``),
``seconds=D`` (``minio``: the outage; ``preempt``: the grace), ``transient=1`` (``nan``),
``factor=F`` (``slow``), ``when=recovery`` (any kind but ``nan`` and ``slow``).

When it fires — deterministically at step ``S``: the launcher gives the trainer of the rank hit (rank
0 for ``redis`` and ``minio``) the steps of its faults (:func:`hold_steps`, see
:mod:`lifeline.runtime._hold`); once it completed step ``S`` — reported it and handed the step's
checkpoint to its sidecar — it creates a ``hold-S`` file and waits. The fault fires when the launcher
sees that file (``due(..., held=)``; faults due at the same step fire together, once every one of
them holds) and the launcher then writes ``release-S``: a fault that did not kill or stop the trainer
lets it go on, and a re-run of step ``S`` after a recovery does not hold again. Fallback (a hold that
timed out, a step the rank never trained in this run): the fault fires once the rank (any rank, for
the service kinds) reported a step past ``S``. ``when=recovery`` faults do not hold: they fire once
the rank (any rank, for the service kinds) reported ``step`` or later while a recovery is in progress
(a plan published, training not yet resumed): a fault during a recovery.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from lifeline.errors import ConfigError

__all__ = ["KINDS", "TIERS", "SERVICE_KINDS", "SELF_KINDS", "NAN_ENV", "SLOW_ENV", "LATE_KINDS", "Injection", "parse_injection",
           "random_injections", "due",
           "hold_steps"]

KINDS = ("trainer", "sidecar", "node", "hang", "redis", "minio", "flip", "preempt", "nan", "slow")
LATE_KINDS = ("trainer", "sidecar", "node")
"""Kinds that may hit the last step (``step == steps``): the rank holds after training and saving it
while the others finish and report ``done``; the fault then lands after they finished (issue 26)."""
SERVICE_KINDS = ("redis", "minio", "operator")
"""Kinds that hit a shared service, not a rank (no ``rank`` field); ``operator`` (the operator's pod
killed) exists on a cluster only (``lifeline bench chaos --bed devcluster``), not in :data:`KINDS`."""
TIERS = ("L0", "L1", "L2")
SELF_KINDS = ("nan", "slow")
"""Kinds the trainer of the rank carries out itself (told by :data:`NAN_ENV`, :data:`SLOW_ENV`): no hold,
nothing killed."""
SLOW_ENV = "LIFELINE_FAULT_SLOW"
"""The ``slow`` fault of a rank's trainer: ``S:F`` (same name in :mod:`lifeline.runtime._stragglers`)."""
SLOW_FACTOR = 2.0
"""A ``slow`` injection's factor unless ``factor`` says otherwise."""
NAN_ENV = "LIFELINE_FAULT_NAN"
"""The ``nan`` faults of a rank's trainer: comma-separated ``S`` or ``S:transient`` (same name in
:mod:`lifeline.runtime._numerics`)."""
MINIO_OUTAGE_SECONDS = 3.0
"""A ``minio`` injection's outage unless ``seconds`` says otherwise."""
PREEMPT_GRACE_SECONDS = 10.0
"""A ``preempt`` injection's grace (``terminationGracePeriodSeconds``) unless ``seconds`` says otherwise."""


@dataclass(frozen=True)
class Injection:
    """Inject ``kind`` when ``rank``'s trainer holds at ``step`` (see the module docstring).

    Attributes:
        kind: one of :data:`KINDS`.
        rank: the rank hit (0 for the service kinds: rank 0 holds for them; the fallback and
            ``when=recovery`` count their ``step`` on any rank).
        step: the step it fires at (the rank completed it and holds there).
        tier: ``L0``/``L1``/``L2`` for ``flip``, else ``None``.
        seconds: a ``minio`` outage's length, or a ``preempt`` grace, seconds (``None``:
            :data:`MINIO_OUTAGE_SECONDS`, :data:`PREEMPT_GRACE_SECONDS`).
        when: ``"recovery"``: only while a recovery is in progress; ``None``: at once.
        transient: a ``nan`` that poisons the first try of the step only (its re-run is clean).
        factor: a ``slow`` rank's slowdown (``None``: :data:`SLOW_FACTOR`).
    """

    kind: str
    rank: int
    step: int
    tier: str | None = None
    seconds: float | None = None
    when: str | None = None
    transient: bool = False
    factor: float | None = None

    def __str__(self) -> str:
        parts = [self.kind] + ([] if self.kind in SERVICE_KINDS else [f"rank={self.rank}"]) + [f"step={self.step}"]
        if self.tier is not None:
            parts.append(f"tier={self.tier}")
        if self.seconds is not None:
            parts.append(f"seconds={self.seconds:g}")
        if self.when is not None:
            parts.append(f"when={self.when}")
        if self.transient:
            parts.append("transient=1")
        if self.factor is not None:
            parts.append(f"factor={self.factor:g}")
        return ":".join(parts)

    @property
    def kills(self) -> tuple[str, ...]:
        """The roles of ``rank`` it SIGKILLs: ``trainer`` and/or ``sidecar`` (a hang SIGSTOPs; a flip
        kills what its tier needs, see the module docstring; the service kinds kill a server)."""
        if self.kind == "flip":
            return ("trainer",) if self.tier == "L0" else ("trainer", "sidecar")
        return {"trainer": ("trainer",), "sidecar": ("sidecar",), "node": ("trainer", "sidecar")}.get(self.kind, ())

    @property
    def loses_node(self) -> bool:
        """Whether the rank's node is marked lost (``node``, ``preempt``; ``flip`` at L1 or L2)."""
        return self.kind in ("node", "preempt") or (self.kind == "flip" and self.tier in ("L1", "L2"))

    @property
    def holds(self) -> bool:
        """Whether the trainer of :attr:`rank` holds at :attr:`step` until it fires (every fault but
        ``when=recovery``, which waits for a recovery instead; see the module docstring)."""
        return self.when is None and self.kind not in SELF_KINDS

    @property
    def outage_seconds(self) -> float:
        """A ``minio`` injection's outage, seconds."""
        return MINIO_OUTAGE_SECONDS if self.seconds is None else self.seconds

    @property
    def slow_factor(self) -> float:
        """A ``slow`` injection's slowdown factor."""
        return SLOW_FACTOR if self.factor is None else self.factor

    @property
    def grace_seconds(self) -> float:
        """A ``preempt`` injection's grace between SIGTERM and SIGKILL, seconds."""
        return PREEMPT_GRACE_SECONDS if self.seconds is None else self.seconds


def hold_steps(injections: Iterable[Injection], rank: int) -> tuple[int, ...]:
    """The steps at which ``rank``'s trainer holds: those of the holding injections that hit it (rank 0
    takes the service kinds'), sorted."""
    return tuple(sorted({inj.step for inj in injections if inj.holds and inj.rank == rank}))


def due(pending: list[Injection], reached: dict[int, int], *, recovering: bool = False,
        held: Collection[tuple[int, int]] | None = None) -> list[Injection]:
    """Remove from ``pending`` and return the injections that fire now.

    Args:
        pending: injections not fired yet (changed in place).
        reached: rank -> the highest step it reported.
        recovering: a recovery is in progress (``when=recovery`` injections fire only then).
        held: ``(rank, step)`` of the trainers holding at a step now (their ``hold-<step>`` files exist);
            ``None``: no trainer holds (every injection fires on the reported steps, as ``when=recovery``
            ones always do).
    """
    top = max(reached.values(), default=0)

    def seen(inj: Injection) -> int:
        return top if inj.kind in SERVICE_KINDS else reached.get(inj.rank, 0)

    if held is None:
        fire = [inj for inj in pending if seen(inj) >= inj.step and (inj.when is None or recovering)]
    else:
        # a holding injection is ready when its trainer holds at its step, or trained past it (the hold
        # timed out, or this run never trained that step); those due at one step fire together
        ready = {id(inj) for inj in pending if inj.holds and ((inj.rank, inj.step) in held or seen(inj) > inj.step)}
        waiting = {inj.step for inj in pending if inj.holds and id(inj) not in ready}
        fire = [inj for inj in pending
                if (inj.holds and id(inj) in ready and inj.step not in waiting)
                or (not inj.holds and seen(inj) >= inj.step and (recovering or inj.when is None))]
    for inj in fire:
        pending.remove(inj)
    return fire


_FIELDS = ("rank", "step", "tier", "seconds", "when", "transient", "factor")


def _number(values: dict[str, str], key: str, low: float, high: float, bad: Callable[[str], ConfigError]
            ) -> float | None:
    """``values[key]`` as a number in ``(low, high]`` (``None`` when absent); ``bad(message)`` otherwise."""
    if key not in values:
        return None
    try:
        number = float(values[key])
    except ValueError:
        raise bad(f"{key} must be a number") from None
    if not low < number <= high:
        raise bad(f"{key} {number:g} outside ({low:g}, {high:g}]")
    return number


def parse_injection(text: str, *, world_size: int | None = None, steps: int | None = None) -> Injection:
    """Parse ``KIND:rank=R:step=S[:tier=T][:seconds=D][:transient=1][:when=recovery]`` (fields in any order
    after the kind).

    Raises:
        ConfigError: unknown kind or field, a missing, non-integer or misplaced field (``rank`` on a
            service kind, ``tier`` off ``flip``, ``seconds`` off ``minio`` and ``preempt``), a rank outside the world
            size, a step outside ``[1, steps)`` (``[1, steps]`` for :data:`LATE_KINDS` without ``when``), a tier not L0/L1/L2, seconds not in (0, 600], or
            ``when`` not ``recovery`` (``field`` is ``--inject-failure``).
    """
    fix = (f"write KIND:rank=R:step=S with KIND one of {', '.join(KINDS)} (redis:step=S, minio:step=S:seconds=D, "
           "flip:rank=R:step=S:tier=L0|L1|L2, preempt:rank=R:step=S:seconds=G, "
           "nan:rank=R:step=S[:transient=1], slow:rank=R:step=S[:factor=F]; any kind but nan and slow may add "
           ":when=recovery), e.g. node:rank=1:step=20")

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--inject-failure {text!r}: {why}; {fix}", field="--inject-failure")

    kind, *parts = text.strip().split(":")
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}")
    values: dict[str, str] = {}
    for part in parts:
        name, eq, value = part.partition("=")
        if not eq or name not in _FIELDS:
            raise bad(f"unknown field {part!r}")
        values[name] = value
    for name in ("rank", "step"):
        if name in values:
            try:
                int(values[name])
            except ValueError:
                raise bad(f"{name} must be an integer") from None
    service = kind in SERVICE_KINDS
    missing = [n for n in (("step",) if service else ("rank", "step")) + (("tier",) if kind == "flip" else ())
               if n not in values]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    if service and "rank" in values:
        raise bad(f"{kind} hits a shared server, not a rank: leave out rank")
    if "tier" in values and kind != "flip":
        raise bad("tier applies to flip only")
    if "seconds" in values and kind not in ("minio", "preempt"):
        raise bad("seconds applies to minio and preempt only")
    if "transient" in values and (kind != "nan" or values["transient"] not in ("0", "1")):
        raise bad("transient=0|1 applies to nan only")
    if "when" in values and kind in SELF_KINDS:
        raise bad(f"{kind} acts from its step on, in the trainer: leave out when")
    if "factor" in values and kind != "slow":
        raise bad("factor applies to slow only")
    factor = _number(values, "factor", 1, 100, bad)
    rank, step = int(values.get("rank", 0)), int(values["step"])
    if rank < 0 or (world_size is not None and rank >= world_size):
        raise ConfigError(f"--inject-failure {text!r}: rank {rank} outside [0, {world_size})", field="--inject-failure")
    # a trainer, sidecar or node fault may hit the last step: the rank holds after training and saving it
    # while the others finish, and the fault comes after they reported done (a late failure)
    last = steps if kind in LATE_KINDS and values.get("when") is None else (steps - 1 if steps is not None else None)
    if step < 1 or (last is not None and step > last):
        raise ConfigError(f"--inject-failure {text!r}: step {step} outside [1, {last}] (it must happen before the "
                          f"last step; {', '.join(LATE_KINDS)} faults may hit the last step)", field="--inject-failure")
    tier = values.get("tier")
    if tier is not None and tier not in TIERS:
        raise bad(f"tier {tier!r} is not one of {', '.join(TIERS)}")
    seconds = _number(values, "seconds", 0, 600, bad)
    when = values.get("when")
    if when is not None and when != "recovery":
        raise bad(f"when={when!r}: the only moment is when=recovery")
    return Injection(kind, rank, step, tier, seconds, when, transient=values.get("transient") == "1", factor=factor)


def random_injections(seed: int, kinds: tuple[str, ...], *, world_size: int, steps: int,
                      first_step: int = 2) -> tuple[Injection, ...]:
    """One injection per entry of ``kinds`` at seeded random ranks and strictly increasing steps in
    ``[first_step, steps - 1)``; deterministic for a given ``seed`` (for tests and benchmarks).
    Entries ``flip:L0`` etc. name a flip's tier; service kinds get rank 0."""
    import random

    rng = random.Random(seed)
    span = list(range(first_step, steps - 1))
    if len(span) < len(kinds):
        raise ConfigError(f"{len(kinds)} failures need more than {steps} steps", field="steps")
    chosen = sorted(rng.sample(span, len(kinds)))
    out = []
    for kind, step in zip(kinds, chosen):
        base, _, tier = kind.partition(":")
        rank = rng.randrange(world_size)
        out.append(Injection(base, 0 if base in SERVICE_KINDS else rank, step, tier or None))
    return tuple(out)
