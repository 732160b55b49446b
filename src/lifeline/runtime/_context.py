"""``RuntimeContext``: a rank's settings, catalog and process group, joined generation by generation
(``init()`` that builds it is in :mod:`lifeline.runtime._init`)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch.distributed as dist

from lifeline.api.pod import TrainerSettings
from lifeline.api.recovery import RecoveryPlan
from lifeline.catalog import Catalog, ProgressReport
from lifeline.checkpoint import Layout
from lifeline.errors import CatalogError, RecoveryError
from lifeline.runtime._beat import RecoveryBeat
from lifeline.runtime._rendezvous import Superseded, rendezvous
from lifeline.runtime._watchdog import Watchdog

__all__ = ["RuntimeContext"]


@dataclass
class RuntimeContext:
    """One trainer rank's view of the job: settings, layout, catalog and process-group generation.

    Attributes:
        settings: the rank's :class:`~lifeline.api.pod.TrainerSettings`.
        layout: the parallel layout (``world_size`` ranks).
        rank, world_size: this rank and the number of ranks.
        generation: the generation of the current process group (+1 at every recovery).
        backend: ``"gloo"``, or ``"cpu:gloo,cuda:nccl"`` when a GPU exists.
        catalog: the job's Redis catalog (``None`` for single-rank runs without Redis).
        restarts: recoveries this process went through.
        join_seconds: where the latest :meth:`join` spent its time (``rendezvous``: the store found
            or hosted; ``barrier``: every rank connected; ``process_group``: ``init_process_group``).
        retired: an elastic reshard left this rank out of the current layout (:meth:`adopt`); the
            trainer has nothing to do and exits 0.
        watchdog: breaks this generation's gloo connections once the catalog publishes a newer
            generation, so that a collective blocked on a dead or re-planned peer raises at once
            (:mod:`lifeline.runtime._watchdog`); ``None`` without a catalog.
        last_step: the step of the latest report that named one (``None`` before any).
        beat: records this rank's recovery beat while it starts or recovers
            (:mod:`lifeline.runtime._beat`; switched by :meth:`recovering`); ``None`` without a catalog.
    """

    settings: TrainerSettings
    layout: Layout
    rank: int
    world_size: int
    generation: int
    backend: str
    catalog: Catalog | None = None
    restarts: int = 0
    join_seconds: dict[str, float] = field(default_factory=dict)
    retired: bool = False
    watchdog: Watchdog | None = field(default=None, repr=False)
    last_step: int | None = None
    beat: RecoveryBeat | None = field(default=None, repr=False)
    _store: Any = field(default=None, repr=False)
    _gen_store: Any = field(default=None, repr=False)

    @property
    def job(self) -> str:
        """The TrainingJob name."""
        return self.settings.job

    @property
    def collective_timeout(self) -> timedelta:
        """Bound of one collective (``LIFELINE_COLLECTIVE_TIMEOUT_SECONDS``): a peer silent for longer
        is a failure. Pass it to every ``dist.new_group``."""
        return timedelta(seconds=self.settings.collective_timeout_seconds)

    # --- process group generations ------------------------------------------------------------
    def join(self, generation: int) -> None:
        """Rendezvous and initialise the default process group of ``generation``.

        Raises:
            Superseded: a newer generation was published while joining (join that one instead).
            RecoveryError: the rendezvous did not complete before the deadline.
        """
        s = self.settings
        self.generation = generation
        t0 = time.perf_counter()
        if self.catalog is None:
            store = dist.HashStore()
        else:
            store = rendezvous(self.catalog, rank=self.rank, world_size=self.world_size, generation=generation,
                               pod_ip=s.pod_ip, timeout=s.rendezvous_timeout_seconds)
        self._store = store
        prefixed = dist.PrefixStore(f"lifeline/{self.job}/gen/{generation}", store)
        self._gen_store = prefixed
        t1 = time.perf_counter()
        self._await_members(prefixed, generation)
        t2 = time.perf_counter()
        watchdog = self._watchdog()
        if watchdog is not None:  # the connections init_process_group opens are this generation's
            watchdog.reset(exclude_ports=(getattr(store, "port", None), urlparse(s.redis_url or "").port or 6379))
            watchdog.mark()
        self._init_group(prefixed, generation)
        if watchdog is not None:
            watchdog.arm(generation)
        self.join_seconds = {"rendezvous": round(t1 - t0, 4), "barrier": round(t2 - t1, 4),
                             "process_group": round(time.perf_counter() - t2, 4)}

    def _init_group(self, store, generation: int) -> None:
        """``init_process_group`` of ``generation`` on ``store`` (its prefixed store).

        Raises:
            Superseded: the mesh could not connect (a peer died meanwhile: fuzz seed 606, a rank
                refused by a peer killed during the recovery) and a newer generation came.
            RecoveryError: it could not connect and no newer plan came in time.
        """
        try:
            dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world_size,
                                    timeout=self.collective_timeout)
        except (dist.DistError, RuntimeError) as err:
            self._left_behind(generation, err, "its process group could not connect")

    def _watchdog(self) -> Watchdog | None:
        """The context's watchdog, created on first use (``None`` without a catalog)."""
        if self.watchdog is None and self.catalog is not None:
            self.watchdog = Watchdog(self.catalog.generation, self._report_broken)
        return self.watchdog

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Wrap the building of sub-groups (``trainer.connect``): the connections opened inside are
        broken with the default group's when a newer generation is published (else a collective
        on them waits out its timeout). No-op without a catalog or a process group."""
        watchdog = self.watchdog if dist.is_initialized() else None
        if watchdog is not None:
            watchdog.mark()
        try:
            yield
        finally:
            if watchdog is not None:
                watchdog.arm(self.generation)

    def _report_broken(self, generation: int, seconds: float, sockets: int) -> None:
        """The watchdog broke ``generation``'s connections: one ``broke_group`` line (stdout only),
        ``seconds`` from seeing the newer generation to the end of the break, ``sockets`` shut down."""
        report = ProgressReport("broke_group", self.job, self.rank, generation, round(time.time(), 4), None,
                                {"seconds": round(seconds, 6), "sockets": sockets})
        sys.stdout.write(report.to_json() + "\n")
        sys.stdout.flush()

    def _await_members(self, store, generation: int, poll: float = 0.02) -> None:
        """Store-based join barrier: wait (up to the rendezvous timeout) until every rank of
        ``generation`` is connected, so that a rank still finishing a failed collective of the old
        generation delays the new group by its remaining wait, never times the others out.

        Raises:
            Superseded: the catalog moved past ``generation`` meanwhile.
            RecoveryError: not every rank joined in time (names how many did).
        """
        deadline = time.monotonic() + self.settings.rendezvous_timeout_seconds
        joined = 0
        try:
            store.add("joined", 1)
            while True:
                joined = store.add("joined", 0)
                if joined >= self.world_size:
                    return
                if self.current_generation() > generation:
                    raise Superseded(self.current_generation())
                if time.monotonic() > deadline:
                    raise RecoveryError(f"only {joined} of {self.world_size} ranks joined generation {generation} "
                                        f"within {self.settings.rendezvous_timeout_seconds:.0f} s",
                                        job=self.job, rank=self.rank)
                time.sleep(poll)
        except (dist.DistError, RuntimeError) as err:  # the generation's store went away: its host died
            # (rank 0 of the generation hosts it). That is a failure the controller answers with a newer
            # plan, so wait for it like any rank whose peer died (fuzz seed 606: exiting here made this
            # rank's exit a second failure, answered by a third plan although nothing else failed)
            self._left_behind(generation, err, "its rendezvous store failed")

    def _left_behind(self, generation: int, err: BaseException, what: str) -> None:
        """A peer of ``generation`` died while this rank joined it: wait for the newer plan the
        controller publishes for that failure.

        Raises:
            Superseded: the newer generation (join it instead).
            RecoveryError: none came within ``LIFELINE_RECOVERY_TIMEOUT_SECONDS``.
        """
        # recorded: when no peer died (nothing the controller sees but this report), a failure every
        # rank of the generation reports is answered after the collective grace, never waited out
        self.report("failure", error=f"generation {generation}: {what}: {type(err).__name__}: {err}"[:500])
        current = self._newer_than(generation, poll=0.1)
        if current is not None:
            raise Superseded(current) from err
        raise RecoveryError(f"generation {generation}: {what} ({err}) and no newer plan came within "
                            f"{self.settings.recovery_timeout_seconds:.0f} s", job=self.job, rank=self.rank) from err

    def _newer_than(self, generation: int, poll: float) -> int | None:
        """The catalog's generation once it passes ``generation``, waiting up to
        ``LIFELINE_RECOVERY_TIMEOUT_SECONDS`` (an unreachable catalog counts as no newer one yet);
        ``None`` when none came."""
        deadline = time.monotonic() + self.settings.recovery_timeout_seconds
        while True:
            try:
                current = self.current_generation()
            except CatalogError:
                current = generation
            if current > generation:
                return current
            if time.monotonic() > deadline:
                return None
            time.sleep(poll)

    def teardown(self) -> None:
        """Destroy the current process group (closing its connections, which fails peers' pending
        collectives promptly) and drop the generation's store. The watchdog is disarmed first, so
        that it never shuts down a descriptor the teardown closes. Never raises."""
        if self.watchdog is not None:
            self.watchdog.disarm()
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group may fail to shut down cleanly
            pass
        self._store = None
        self._gen_store = None

    def arrive(self, name: str) -> None:
        """Count this rank in at the generation's named waypoint ``name`` (see :meth:`await_count`)."""
        self._gen_store.add(name, 1)

    def await_count(self, name: str, count: int, poll: float = 0.02) -> None:
        """Wait until ``count`` ranks arrived (:meth:`arrive`) at ``name`` in this generation, up to
        ``LIFELINE_RECOVERY_TIMEOUT_SECONDS`` (a store wait, not a collective: a replay may take
        longer than one collective's timeout).

        Raises:
            Superseded: a newer generation was published meanwhile (its plan replaces this one).
            RecoveryError: the ranks did not arrive in time.
            RuntimeError: the generation's store went away (a collective error: a peer died).
        """
        deadline = time.monotonic() + self.settings.recovery_timeout_seconds
        while self._gen_store.add(name, 0) < count:
            current = self.current_generation()
            if current > self.generation:
                raise Superseded(current)
            if time.monotonic() > deadline:
                raise RecoveryError(f"{name}: fewer than {count} ranks arrived within "
                                    f"{self.settings.recovery_timeout_seconds:.0f} s", job=self.job, rank=self.rank)
            time.sleep(poll)

    def current_generation(self) -> int:
        """The job's generation in the catalog (this context's own without a catalog)."""
        return self.generation if self.catalog is None else self.catalog.generation()

    def plan(self, generation: int) -> RecoveryPlan | None:
        """The recovery plan of ``generation`` from the catalog, or ``None``.

        Raises:
            CatalogError: Redis is unreachable or the stored plan is malformed.
        """
        return None if self.catalog is None else self.catalog.plan(generation)

    def newer_generation(self) -> int | None:
        """The catalog's generation when it is newer than ours (one Redis GET), else ``None``.

        ``None`` as well while Redis is unreachable: a healthy rank keeps training, and a real
        failure still surfaces as a collective error."""
        try:
            current = self.current_generation()
        except CatalogError:
            return None
        return current if current > self.generation else None

    def wait_for_plan(self, timeout: float | None = None, poll: float = 0.02) -> RecoveryPlan:
        """Block until a plan for a generation newer than ours is published; return it.

        Raises:
            RecoveryError: none appeared within ``timeout`` seconds (default: the settings').
        """
        if self.catalog is None:
            raise RecoveryError("a collective failed and no catalog (LIFELINE_REDIS_URL) can bring a recovery "
                                "plan", job=self.job, rank=self.rank)
        timeout = self.settings.recovery_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            newer = self.newer_generation()
            try:
                plan = self.plan(newer) if newer is not None else None
            except CatalogError:
                plan = None
            if plan is not None:
                return plan
            if time.monotonic() > deadline:
                raise RecoveryError(f"no recovery plan after generation {self.generation} within {timeout:.0f} s",
                                    job=self.job, rank=self.rank)
            time.sleep(poll)

    def rejoin(self, generation: int) -> int:
        """Tear down, then join ``generation`` — or a newer one published meanwhile. Returns the joined one.

        Raises:
            Superseded: the newer generation has another layout (an elastic reshard): the caller must
                adopt it (:meth:`adopt`) before joining, since the world size changes.
        """
        while True:
            self.teardown()
            try:
                self.join(generation)
                return generation
            except Superseded as sup:
                newer = self.plan(sup.generation)
                # recorded: this rank left ``generation`` for the newer one. Unsaid, a join that waits on
                # its peers (a restarted rank 0 hosting the store) looks like a survivor stuck in the old
                # generation, which the runner kills mid-join; its half-registered entries then fail
                # everyone's mesh in the new generation (fuzz seed 606 once restarts took milliseconds)
                self.report("plan", step=self.last_step, plan_generation=sup.generation,
                            restore_step=None if newer is None else newer.restore_step)
                if newer is not None and Layout.from_dict(newer.layout.to_wire()) != self.layout:
                    raise
                generation = sup.generation

    # --- progress ------------------------------------------------------------------------------
    def report(self, event: str, *, record: bool = True, **fields: Any) -> None:
        """Print one JSON line ``{"event", "job", "rank", "generation", ...fields}`` to stdout and, with
        ``record``, store it as this rank's latest :class:`~lifeline.catalog.ProgressReport` in the
        catalog (timing-only events such as ``join`` are printed only)."""
        step = fields.pop("step", None)
        if step is not None:
            self.last_step = int(step)
        report = ProgressReport(event, self.job, self.rank, self.generation, round(time.time(), 4),
                                None if step is None else int(step), fields)
        sys.stdout.write(report.to_json() + "\n")  # one write with its newline: a kill cannot cut the two
        sys.stdout.flush()                            # apart (print writes them separately when unbuffered)
        if record and self.catalog is not None:
            try:
                self.catalog.report(report)
            except CatalogError as err:  # progress is best-effort: training goes on while Redis is away
                print(json.dumps({"event": "catalog_error", "rank": self.rank, "error": str(err)}), file=sys.stderr)

    def adopt(self, plan: RecoveryPlan | None) -> bool:
        """Take the layout of ``plan``'s generation when it differs from this context's (an elastic
        reshard that kept this pod: its rank stays, its world size and coordinates change).

        Returns:
            ``False`` when this rank has no place in the plan's layout (the reshard retired it: the
            trainer should stop, exit 0, and leave its sidecar serving what it holds), else ``True``.
        """
        if plan is None:
            return True
        layout = Layout.from_dict(plan.layout.to_wire())
        if layout == self.layout:
            return True
        if self.rank >= layout.world_size:
            return False
        self.layout, self.world_size = layout, layout.world_size
        self.settings = self.settings.model_copy(update={"world_size": layout.world_size, "layout": layout.to_dict()})
        if self.catalog is not None:
            self.catalog.world_size = layout.world_size
        return True

    def recovering(self, on: bool) -> None:
        """Switch the recovery beat: on while this rank starts or recovers, off once it trained a
        step (step reports are its liveness then). Created on first use; a no-op without a catalog."""
        if self.beat is None:
            if self.catalog is None or not on:
                return
            catalog, rank = self.catalog, self.rank
            self.beat = RecoveryBeat(lambda: catalog.beat(rank))
        self.beat.on = on

    def close(self) -> None:
        """Tear down the process group, end the watchdog and the beat, close the catalog connection."""
        if self.beat is not None:
            self.beat.close()
        self.teardown()
        if self.watchdog is not None:
            self.watchdog.close()
        if self.catalog is not None:
            self.catalog.close()
