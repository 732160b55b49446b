"""DNS-free rendezvous of one process-group generation through the Redis catalog.

Rank 0 of generation ``g`` starts a ``TCPStore`` on its pod IP (an ephemeral port) and
publishes ``host:port`` in the catalog (:meth:`lifeline.catalog.Catalog.publish_rendezvous`);
every other rank polls it
until its deadline and connects, reading the key again when an address refuses (a rank 0 that
died after publishing is replaced by one that publishes anew). Peers never resolve names: the
dev cluster has no DNS.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

from lifeline.catalog import Catalog
from lifeline.errors import RecoveryError

__all__ = ["rendezvous", "Superseded"]

RDZV_TTL_SECONDS = 7 * 24 * 3600
CONNECT_ATTEMPT_SECONDS = 3.0
"""How long one connection attempt to a published store address may take before the key is read again."""


class Superseded(Exception):
    """The job moved to a newer generation while this rank was joining an older one."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"superseded by generation {generation}")
        self.generation = generation


def rendezvous(catalog: Catalog, *, rank: int, world_size: int, generation: int, pod_ip: str,
               timeout: float, poll: float = 0.02) -> dist.TCPStore:
    """The ``TCPStore`` of ``generation`` (hosted by rank 0, found by the others through Redis).

    Args:
        catalog: the job's :class:`lifeline.catalog.Catalog`.
        timeout: seconds to wait for rank 0's address and for the store connection.
        poll: seconds between looks at the catalog.

    Raises:
        Superseded: the catalog's generation passed ``generation`` while waiting.
        RecoveryError: no address appeared before the deadline (names the key).
    """
    if rank == 0:
        store = dist.TCPStore(pod_ip, 0, world_size, is_master=True, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)
        catalog.publish_rendezvous(generation, f"{pod_ip}:{store.port}", RDZV_TTL_SECONDS)
        return store
    deadline = time.monotonic() + timeout
    while True:
        address = catalog.rendezvous_address(generation)
        if address:
            # A stale address (a previous incarnation of rank 0 that joined this generation and
            # died, e.g. a pod an elastic reshard replaced) refuses connections: try it briefly,
            # then read the key again, where the live rank 0 publishes its own.
            host, port = address.rsplit(":", 1)
            attempt = min(CONNECT_ATTEMPT_SECONDS, max(0.1, deadline - time.monotonic()))
            try:
                return dist.TCPStore(host, int(port), world_size, is_master=False,
                                     timeout=timedelta(seconds=attempt))
            except (dist.DistError, RuntimeError, TimeoutError):
                pass
        current = catalog.generation()
        if current > generation:
            raise Superseded(current)
        if time.monotonic() > deadline:
            raise RecoveryError(f"no reachable rendezvous store for generation {generation} within {timeout:.0f} s "
                                f"(last address: {address or 'none'}; is rank 0 of this generation running?)",
                                job=catalog.job, rank=rank, key=catalog.rendezvous_key(generation))
        time.sleep(poll)
