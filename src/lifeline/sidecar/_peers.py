"""Peer sidecars of this one: where their L1 copies of this rank go (Gemini placement) and how to reach them."""

from __future__ import annotations

from collections.abc import Callable

from lifeline.api.pod import SidecarSettings
from lifeline.catalog import Catalog
from lifeline.control import place_replicas
from lifeline.errors import AuthError, PeerError
from lifeline.sidecar.peer import PeerClient

__all__ = ["Peers"]


class Peers:
    """Addresses from the catalog's registrations; placement recomputed when nodes change.

    Args:
        settings: the sidecar's settings (job, rank, replicas, chunk size, pod IP).
        catalog: the job's catalog; its ``world_size`` is the current generation's.
        secret: the job's HMAC key (every connection and every frame is authenticated with keys from it).
        on_refuse: called with every :class:`AuthError` of these connections (a failed handshake
            or a refused frame), before it is raised; the sidecar counts ``errors_total{kind="auth"}``.
    """

    def __init__(self, settings: SidecarSettings, catalog: Catalog, secret: bytes,
                 on_refuse: Callable[[AuthError], None] | None = None) -> None:
        self.s, self.catalog, self.secret, self.on_refuse = settings, catalog, secret, on_refuse
        self._placement: dict[int, tuple[int, ...]] = {}
        self._nodes: tuple[str, ...] | None = None

    def targets(self) -> tuple[int, ...]:
        """Ranks whose sidecars hold this rank's L1 copies (Gemini placement over the live nodes).

        Raises:
            PeerError: not every rank's sidecar is registered yet (placement needs every node).
            CatalogError: Redis is unreachable.
        """
        world = self.catalog.world_size  # the current generation's (the heartbeat follows elastic reshards)
        regs = self.catalog.sidecars()
        if any(r not in regs for r in range(world)):
            missing = sorted(set(range(world)) - set(regs))
            raise PeerError(f"placement waits for sidecars of ranks {missing} to register", job=self.s.job)
        if self.s.rank >= world:
            raise PeerError(f"rank {self.s.rank} has no place in the current world size {world} (an elastic reshard "
                            "retired it): it keeps serving what it holds and replicates nothing", job=self.s.job)
        nodes = tuple(regs[r].node for r in range(world))
        if nodes != self._nodes:
            self._placement = place_replicas(list(nodes), self.s.peer_replicas)
            self._nodes = nodes
        return self._placement[self.s.rank]

    def connect(self, rank: int, timeout: float = 30.0) -> PeerClient:
        """An authenticated connection to rank's sidecar.

        Raises:
            PeerError: its sidecar is not registered, or the connection or handshake failed.
            CatalogError: Redis is unreachable.
        """
        reg = self.catalog.sidecar(rank)
        if reg is None:
            raise PeerError(f"sidecar of rank {rank} is not registered", job=self.s.job, rank=rank)
        return PeerClient(reg.host, reg.port, secret=self.secret, job=self.s.job, chunk_bytes=self.s.chunk_bytes,
                          timeout=timeout, source=self.s.pod_ip, on_refuse=self.on_refuse)
