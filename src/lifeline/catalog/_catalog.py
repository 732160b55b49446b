"""The :class:`Catalog` client: every read and write of a job's Redis keys (redis-py; a real Redis)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import os
import time

import redis

from lifeline.api.recovery import TIERS, Holding, RecoveryPlan, Tier
from lifeline.catalog import _scripts
from lifeline.catalog._acl import job_acl_rules, job_user
from lifeline.catalog._holdings import _Holdings
from lifeline.catalog._keys import Keys
from lifeline.catalog.documents import (
    CorruptionReport,
    LogCoverage,
    PersistedWindows,
    ProgressReport,
    SidecarRegistration,
)
from lifeline.errors import CatalogError, LifelineError

__all__ = ["Catalog", "CatalogView"]

T = TypeVar("T")


@dataclass(frozen=True)
class CatalogView:
    """One read of what a runner needs of the catalog each round (:meth:`Catalog.view`).

    Attributes:
        generation: the job's current generation.
        reports: rank -> its latest progress report.
        beats: rank -> seconds since the epoch of its latest recovery beat (:meth:`Catalog.beat`).
        registrations: rank -> its live sidecar registration (the heartbeat).
        holdings: verified copies at the steps read.
        complete_step: the latest complete step (``None``: none yet).
        log_coverage: upstream-log coverage per rank.
        windows: sparse windows committed to L2, per rank.
    """

    generation: int = 0
    reports: dict[int, ProgressReport] = field(default_factory=dict)
    beats: dict[int, float] = field(default_factory=dict)
    registrations: dict[int, SidecarRegistration] = field(default_factory=dict)
    holdings: frozenset[Holding] = frozenset()
    complete_step: int | None = None
    log_coverage: tuple[LogCoverage, ...] = ()
    windows: tuple[PersistedWindows, ...] = ()


class Catalog(_Holdings):
    """A typed client of one job's catalog keys (:mod:`lifeline.catalog._keys` lists them).

    Args:
        url: ``redis://[:password@]host:port/db``.
        job: TrainingJob name (the key namespace).
        world_size: number of ranks (completeness checks and per-rank reads).
        username, password: Redis AUTH (an ACL user, or the default user when ``username`` is
            empty). ``None`` (default): from ``LIFELINE_REDIS_USERNAME`` / ``LIFELINE_REDIS_PASSWORD``
            (pods get them from the job's Secret); empty everywhere: no AUTH (or the URL's).

    Every method raises :class:`~lifeline.errors.CatalogError` (job in its context) when Redis is
    unreachable or a stored document is malformed; callers on background threads catch it and
    resynchronise once Redis is back.
    """

    def __init__(self, url: str, job: str, world_size: int, *, username: str | None = None,
                 password: str | None = None) -> None:
        self.job = job
        self.world_size = world_size
        self.keys = Keys(job)
        username = os.environ.get("LIFELINE_REDIS_USERNAME", "") if username is None else username
        password = os.environ.get("LIFELINE_REDIS_PASSWORD", "") if password is None else password
        auth = {"username": username or None, "password": password} if password else {}
        self._r = redis.Redis.from_url(
            url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=5, decode_responses=True, **auth
        )
        self._advance = self._r.register_script(_scripts.ADVANCE)
        self._restore_complete = self._r.register_script(_scripts.RESTORE_COMPLETE)
        self._persisted = self._r.register_script(_scripts.PERSISTED)
        self._register_holding_scripts()
        self._put_plan = self._r.register_script(_scripts.PUT_PLAN)
        self._record_log = self._r.register_script(_scripts.RECORD_LOG)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as err:
            raise CatalogError(f"Redis catalog unavailable: {err}", job=self.job) from err
        except LifelineError as err:
            if err.job is None:
                err.job = self.job
            raise

    def ping(self) -> None:
        """Raises CatalogError when Redis does not answer."""
        self._call(self._r.ping)

    def close(self) -> None:
        """Close the connection pool."""
        self._r.close()

    # --- registry and heartbeats ---------------------------------------------------------------
    def register(self, registration: SidecarRegistration, ttl_seconds: float) -> None:
        """Write (or refresh) a sidecar's registration with a TTL: this is the heartbeat."""
        self._call(self._r.set, self.keys.sidecar(registration.rank), registration.to_json(),
                   px=int(ttl_seconds * 1000))

    def is_registered(self, rank: int) -> bool:
        """True when rank's registration exists (False after expiry or a Redis restart)."""
        return bool(self._call(self._r.exists, self.keys.sidecar(rank)))

    def sidecar(self, rank: int) -> SidecarRegistration | None:
        """Rank's registration, or ``None`` when its sidecar is not alive."""
        raw = self._call(self._r.get, self.keys.sidecar(rank))
        return None if raw is None else self._call(SidecarRegistration.from_json, raw)

    def sidecars(self) -> dict[int, SidecarRegistration]:
        """Every live registration, by rank."""
        raw = self._call(self._r.mget, [self.keys.sidecar(r) for r in range(self.world_size)])
        return {r: self._call(SidecarRegistration.from_json, v) for r, v in enumerate(raw) if v}

    # --- the latest complete step, persistence -------------------------------------------------
    def try_advance(self, steps: int | Iterable[int], tier: Tier, *, rank: int, floor: int = -1) -> int:
        """Atomically set the latest complete step to the newest of ``steps`` that every rank holds at
        ``tier``; never moves it backwards. Returns the latest complete step after the call (-1: none).

        While no complete step is recorded (a new job, or a Redis that restarted empty), the call
        records ``max(floor, derived)`` for ``rank`` and the step is set once every rank below the world
        size has called, to the highest recorded: a sidecar that re-files its copies before another
        rank's newer copy is filed again never publishes an older step than another rank had seen.

        Args:
            steps: the step (or steps, any order) to try.
            tier: the tier every rank's copy must have reached.
            rank: the calling sidecar's rank.
            floor: the latest complete step the caller had seen (-1: none).

        Raises:
            CatalogError: an unknown tier, or Redis unreachable.
        """
        if tier not in TIERS:
            raise CatalogError(f"unknown tier {tier!r}; expected one of {TIERS}", job=self.job, tier=str(tier))
        tried = sorted({steps} if isinstance(steps, int) else set(steps), reverse=True)
        args = [self.world_size, tier, self.keys.holders_prefix, rank, floor, *tried]
        keys = [self.keys.complete, self.keys.complete_floors]
        return int(self._call(self._advance, keys=keys, args=args))

    def restore_complete_step(self, step: int) -> int:
        """Raise the latest complete step to ``step``, a step the caller saw complete before (a runner
        repairing a Redis that came back empty); never lowers it. Returns the latest complete step after.

        Raises:
            CatalogError: Redis unreachable.
        """
        keys = [self.keys.complete, self.keys.complete_floors]
        return int(self._call(self._restore_complete, keys=keys, args=[int(step)]))

    def latest_complete_step(self) -> int | None:
        """The job's latest complete step, or ``None`` when no checkpoint is complete yet."""
        raw = self._call(self._r.get, self.keys.complete)
        return int(raw) if raw is not None and int(raw) >= 0 else None

    def mark_persisted(self, step: int, rank: int, world_size: int | None = None) -> bool:
        """Record rank's blob of step as persisted; True for exactly one rank once all ``world_size`` ranks
        are (the claimant of the commit; default: the catalog's world size, pass the step's own layout's
        after an elastic reshard), and again for that rank when it asks again: a retry after a failed
        manifest write, or its restarted sidecar, redoes the commit instead of leaving the step uncommitted at L2."""
        keys = [self.keys.persisted(step), self.keys.commit(step)]
        n = self.world_size if world_size is None else world_size
        return bool(self._call(self._persisted, keys=keys, args=[rank, n]))

    def committer(self, step: int) -> int | None:
        """The rank that claimed the L2 commit of ``step`` (:meth:`mark_persisted`), or ``None``."""
        raw = self._call(self._r.get, self.keys.commit(step))
        return int(raw) if raw is not None else None

    # --- corruption reports --------------------------------------------------------------------
    def report_corrupt(self, report: CorruptionReport) -> None:
        """Append a report of a copy that failed verification (kept for the operator)."""
        self._call(self._r.rpush, self.keys.corrupt, report.to_json())

    def corrupt_reports(self) -> list[CorruptionReport]:
        """Every corruption report so far, oldest first."""
        return [self._call(CorruptionReport.from_json, x) for x in self._call(self._r.lrange, self.keys.corrupt, 0, -1)]

    # --- generations and recovery plans --------------------------------------------------------
    def put_plan(self, plan: RecoveryPlan) -> int:
        """Store ``plan`` and make its generation the job's current one (atomically).

        When the plan advances the generation, the memory holdings (``L0``/``L1``) held by the sidecars
        of :attr:`RecoveryPlan.memory_lost_ranks` are forgotten in the same step (read from each one's
        reverse index ``held:<rank>``, so the cost is the copies they held): those copies died with the
        failure, and a later plan (a second failure before the replaced sidecar registers) must not
        name one (fuzz seed 193682496). Storing the same plan again (after a Redis restart) forgets nothing.

        The upstream logs die with them too: each dead sidecar held its rank's log and the replicas
        of other ranks' logs. A step of a rank's log whose original and replica have both died since
        (over any number of plans) is below the rank's floor, and its coverage
        (:meth:`log_coverage`) starts after the floor from then on (fuzz seed 3089: a replay was
        planned from log entries whose two holders had died in two failures).

        Returns:
            How many holdings were forgotten.

        Raises:
            CatalogError: Redis unreachable.
        """
        keys = [self.keys.plan(plan.generation), self.keys.generation, self.keys.logs, self.keys.logs_gone,
                self.keys.logs_floor]
        args = [plan.generation, plan.to_json(), self.keys.holders_prefix, self.keys.held_prefix,
                *plan.memory_lost_ranks]
        return int(self._call(self._put_plan, keys=keys, args=args) or 0)

    def plan(self, generation: int) -> RecoveryPlan | None:
        """The recovery plan of ``generation``, or ``None``.

        Raises:
            CatalogError: the stored document is not a plan.
        """
        raw = self._call(self._r.get, self.keys.plan(generation))
        if raw is None:
            return None
        try:
            return RecoveryPlan.from_json(raw)
        except LifelineError as err:
            raise CatalogError(f"plan of generation {generation}: {err.message}", job=self.job,
                               key=self.keys.plan(generation)) from None

    def generation(self) -> int:
        """The job's current generation (0 before the first recovery)."""
        raw = self._call(self._r.get, self.keys.generation)
        return int(raw) if raw else 0

    # --- trainer progress ----------------------------------------------------------------------
    def report(self, report: ProgressReport) -> None:
        """Store ``report`` as its rank's latest progress."""
        self._call(self._r.hset, self.keys.progress, str(report.rank), report.to_json())

    def progress(self) -> dict[int, ProgressReport]:
        """Each rank's latest report; unreadable entries are left out."""
        out = {}
        for rank, line in self._call(self._r.hgetall, self.keys.progress).items():
            try:
                out[int(rank)] = ProgressReport.from_json(line)
            except (CatalogError, ValueError):
                continue
        return out

    def beat(self, rank: int, at: float | None = None) -> None:
        """Record that ``rank``'s trainer is alive while it starts or recovers (``at``: seconds since
        the epoch, default now). A frozen trainer stops beating; the engine tells it from one that
        waits (docs/control.md "Hangs during a recovery")."""
        self._call(self._r.hset, self.keys.beats, str(rank), repr(time.time() if at is None else float(at)))

    def beats(self) -> dict[int, float]:
        """rank -> seconds since the epoch of its latest beat; unreadable entries are left out."""
        out = {}
        for rank, at in self._call(self._r.hgetall, self.keys.beats).items():
            try:
                out[int(rank)] = float(at)
            except ValueError:
                continue
        return out

    # --- rendezvous ----------------------------------------------------------------------------
    def publish_rendezvous(self, generation: int, address: str, ttl_seconds: float) -> None:
        """Publish ``host:port`` of generation's rendezvous store (rank 0 hosts it)."""
        self._call(self._r.set, self.keys.rendezvous(generation), address, px=int(ttl_seconds * 1000))

    def rendezvous_address(self, generation: int) -> str | None:
        """The published ``host:port`` of generation's rendezvous store, or ``None``."""
        return self._call(self._r.get, self.keys.rendezvous(generation))

    def rendezvous_key(self, generation: int) -> str:
        """The key of generation's rendezvous address (for error messages)."""
        return self.keys.rendezvous(generation)

    # --- upstream-log coverage -----------------------------------------------------------------
    def record_log_coverage(self, coverage: LogCoverage) -> bool:
        """Record which steps the upstream log of ``coverage.rank`` covers, from the step after the
        rank's floor on (steps whose every copy died, :meth:`put_plan`). False when nothing of the
        range is above the floor (the rank's coverage is then removed).

        Raises:
            CatalogError: Redis unreachable.
        """
        keys = [self.keys.logs, self.keys.logs_floor]
        args = [coverage.rank, coverage.first_step, coverage.last_step, coverage.replicas]
        return bool(self._call(self._record_log, keys=keys, args=args))

    def log_coverage(self) -> tuple[LogCoverage, ...]:
        """The recorded coverage of every rank that logs, by rank, with the steps of its log whose
        originals and whose replicas died (``originals_lost_to`` / ``replicas_lost_to``, -1: none)."""
        p = self._r.pipeline(transaction=True)
        p.hgetall(self.keys.logs)
        p.hgetall(self.keys.logs_gone)
        raw, gone = self._call(p.execute)
        out = []
        for s, v in sorted(raw.items(), key=lambda kv: int(kv[0])):
            c = self._call(LogCoverage.from_json, int(s), v)
            out.append(replace(c, originals_lost_to=int(gone.get(f"o:{s}", -1)),
                               replicas_lost_to=int(gone.get(f"r:{s}", -1))))
        return tuple(out)

    # --- sparse windows in L2 -------------------------------------------------------------------
    def record_windows(self, windows: PersistedWindows) -> None:
        """Record which sparse windows of ``windows.rank`` are committed to L2."""
        self._call(self._r.hset, self.keys.windows, str(windows.rank), windows.to_json())

    def persisted_windows(self) -> tuple[PersistedWindows, ...]:
        """The recorded L2 windows of every rank that has some, by rank."""
        raw = self._call(self._r.hgetall, self.keys.windows)
        return tuple(self._call(PersistedWindows.from_json, int(s), v)
                     for s, v in sorted(raw.items(), key=lambda kv: int(kv[0])))

    # --- ownership -----------------------------------------------------------------------------
    def own(self, uid: str) -> bool:
        """Make the job name's keys belong to the TrainingJob ``uid``: a new job of an old name must
        not inherit the old job's progress or plans. Returns True when another owner's keys were wiped."""
        if self._call(self._r.get, self.keys.owner) == uid:
            return False
        self.wipe()
        self._call(self._r.set, self.keys.owner, uid)
        return True

    def forget(self, uid: str) -> bool:
        """Wipe the job's keys if ``uid`` owns them (the TrainingJob was deleted); True when wiped."""
        if self._call(self._r.get, self.keys.owner) != uid:
            return False
        self.wipe()
        return True

    def grant_job_user(self, password: str) -> str:
        """Create (or reset) the job's Redis ACL user (:mod:`lifeline.catalog._acl`): ``password``,
        the job's keys only. Idempotent; call it again after a Redis restart (ACLs are not persisted).
        Needs an admin connection. Returns the user name."""
        user = job_user(self.job)
        self._call(self._r.execute_command, "ACL", "SETUSER", user, *job_acl_rules(self.job, password))
        return user

    def revoke_job_user(self) -> None:
        """Delete the job's Redis ACL user (absent is fine). Needs an admin connection."""
        self._call(self._r.execute_command, "ACL", "DELUSER", job_user(self.job))

    def wipe(self) -> None:
        """Delete every key of the job."""
        keys = list(self._call(lambda: list(self._r.scan_iter(match=self.keys.pattern, count=500))))
        for i in range(0, len(keys), 500):
            self._call(self._r.delete, *keys[i:i + 500])

    # --- one read per round --------------------------------------------------------------------
    def view(self, *, recent_steps: int, persist_every: int = 0) -> CatalogView:
        """Generation, progress, registrations, the latest complete step, upstream-log coverage,
        and the holdings of the ``recent_steps`` newest steps plus the two newest multiples of
        ``persist_every`` (so the latest L2 checkpoint is seen however many memory steps follow it).
        """
        every = self.steps()
        steps = set(every[-recent_steps:]) if recent_steps > 0 else set()
        if persist_every > 0:
            steps |= set([s for s in every if s % persist_every == 0][-2:])
        return CatalogView(
            generation=self.generation(),
            reports=self.progress(),
            beats=self.beats(),
            registrations=self.sidecars(),
            holdings=self.holdings_at(sorted(steps)),
            complete_step=self.latest_complete_step(),
            log_coverage=self.log_coverage(),
            windows=self.persisted_windows(),
        )
