"""Failure injection for local runs: ``--inject-failure trainer:rank=1:step=20``.

Kinds:

* ``trainer`` — SIGKILL the rank's trainer process (its sidecar keeps L0: a crash).
* ``sidecar`` — SIGKILL the rank's sidecar (its L0 copies and the L1 copies it held are lost).
* ``node`` — SIGKILL sidecar and trainer together and mark the rank's node lost (a node failure:
  the rank moves to another node and restores from a peer's L1 copy).
* ``hang`` — SIGSTOP the rank's trainer (no progress: the hang timeout detects it).

Each fires once, when the catalog shows the rank reported ``step`` (or later).
"""

from __future__ import annotations

from dataclasses import dataclass

from lifeline.errors import ConfigError

__all__ = ["KINDS", "Injection", "parse_injection", "random_injections", "due"]

KINDS = ("trainer", "sidecar", "node", "hang")


@dataclass(frozen=True)
class Injection:
    """Kill ``kind`` of ``rank`` once its reported step reaches ``step``."""

    kind: str
    rank: int
    step: int

    def __str__(self) -> str:
        return f"{self.kind}:rank={self.rank}:step={self.step}"

    @property
    def kills(self) -> tuple[str, ...]:
        """The roles it SIGKILLs: ``trainer`` and/or ``sidecar`` (none for a hang, which SIGSTOPs)."""
        return {"trainer": ("trainer",), "sidecar": ("sidecar",), "node": ("trainer", "sidecar")}.get(self.kind, ())


def due(pending: list[Injection], reached: dict[int, int]) -> list[Injection]:
    """Remove from ``pending`` and return the injections whose rank reached their step
    (``reached``: rank -> the highest step it reported)."""
    fire = [inj for inj in pending if reached.get(inj.rank, 0) >= inj.step]
    for inj in fire:
        pending.remove(inj)
    return fire


def parse_injection(text: str, *, world_size: int | None = None, steps: int | None = None) -> Injection:
    """Parse ``KIND:rank=R:step=S`` (fields in any order after the kind).

    Raises:
        ConfigError: unknown kind or field, a missing or non-integer field, a rank outside the
            world size, or a step outside ``[1, steps)`` (``field`` is ``--inject-failure``).
    """
    fix = f"write KIND:rank=R:step=S with KIND one of {', '.join(KINDS)}, e.g. node:rank=1:step=20"
    kind, *parts = text.strip().split(":")
    if kind not in KINDS:
        raise ConfigError(f"--inject-failure {text!r}: unknown kind {kind!r}; {fix}", field="--inject-failure")
    values: dict[str, int] = {}
    for part in parts:
        name, eq, value = part.partition("=")
        if not eq or name not in ("rank", "step"):
            raise ConfigError(f"--inject-failure {text!r}: unknown field {part!r}; {fix}", field="--inject-failure")
        try:
            values[name] = int(value)
        except ValueError:
            raise ConfigError(f"--inject-failure {text!r}: {name} must be an integer; {fix}",
                              field="--inject-failure") from None
    missing = [n for n in ("rank", "step") if n not in values]
    if missing:
        raise ConfigError(f"--inject-failure {text!r}: missing {', '.join(missing)}; {fix}", field="--inject-failure")
    rank, step = values["rank"], values["step"]
    if rank < 0 or (world_size is not None and rank >= world_size):
        raise ConfigError(f"--inject-failure {text!r}: rank {rank} outside [0, {world_size})", field="--inject-failure")
    if step < 1 or (steps is not None and step >= steps):
        raise ConfigError(f"--inject-failure {text!r}: step {step} outside [1, {steps}) (it must happen before the "
                          "last step)", field="--inject-failure")
    return Injection(kind, rank, step)


def random_injections(seed: int, kinds: tuple[str, ...], *, world_size: int, steps: int,
                      first_step: int = 2) -> tuple[Injection, ...]:
    """One injection per entry of ``kinds`` at seeded random ranks and strictly increasing steps in
    ``[first_step, steps - 1)``; deterministic for a given ``seed`` (for tests and benchmarks)."""
    import random

    rng = random.Random(seed)
    span = list(range(first_step, steps - 1))
    if len(span) < len(kinds):
        raise ConfigError(f"{len(kinds)} failures need more than {steps} steps", field="steps")
    chosen = sorted(rng.sample(span, len(kinds)))
    return tuple(Injection(kind, rng.randrange(world_size), step) for kind, step in zip(kinds, chosen))
