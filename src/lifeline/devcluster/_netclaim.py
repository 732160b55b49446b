"""Host-wide claims of pod-IP blocks: each running dev cluster owns one second octet of 127/8."""

from __future__ import annotations

import secrets
import shutil
import time
from pathlib import Path
from typing import Callable

from lifeline.errors import ClusterError

_NET_CLAIM = "/dev/shm/lifeline-net-{}"


def claim_net(state_dir: Path, is_running: Callable[[Path], bool]) -> int:
    """Claim a second octet for this cluster's pod IPs, host-wide (an atomic mkdir under /dev/shm).

    ``is_running(owner_state_dir)`` tells whether the cluster holding a claim still runs; a
    claim whose cluster is not running (killed without ``down``) is taken over.
    ``down`` releases it. Raises ClusterError when all 245 are held by running clusters.
    """
    start = secrets.randbelow(245)
    for i in range(245):
        net = 10 + (start + i) % 245
        claim = Path(_NET_CLAIM.format(net))
        try:
            claim.mkdir()
        except FileExistsError:
            if not (claim / "owner").exists():  # being claimed right now, or a crash mid-claim
                if time.time() - claim.stat().st_mtime < 60:
                    continue
            try:
                owner = Path((claim / "owner").read_text())
                alive = owner != state_dir and is_running(owner)
            except (OSError, ValueError):
                alive = False
            if alive:
                continue
        (claim / "owner").write_text(str(state_dir))
        return net
    raise ClusterError("every pod-IP block (127.10-254.x.x) is claimed by a running dev cluster; "
                       "fix: `lifeline devcluster down` an unused one")


def release_net(net: int, state_dir: Path) -> None:
    """Release the claim of ``net`` if ``state_dir``'s cluster holds it."""
    claim = Path(_NET_CLAIM.format(net))
    try:
        if Path((claim / "owner").read_text()) == state_dir:
            shutil.rmtree(claim, ignore_errors=True)
    except OSError:
        pass


def sweep_stale_arenas(is_running: Callable[[Path], bool], root: Path = Path("/dev/shm")) -> list[Path]:
    """Remove the node arena roots (``lifeline-<id>/`` under ``root``, memory-backed) of dev clusters
    that no longer run (killed without ``down``: their arenas would hold the host's memory until a
    reboot). A root is known by its ``owner`` file (the cluster's state dir, written by ``up``);
    one without it is left alone. Returns the roots removed."""
    removed = []
    for shm in root.glob("lifeline-*"):
        owner = shm / "owner"
        if shm.name.startswith("lifeline-net-") or not owner.is_file():
            continue
        try:
            alive = is_running(Path(owner.read_text()))
        except (OSError, ValueError):
            alive = False
        if not alive:
            shutil.rmtree(shm, ignore_errors=True)
            removed.append(shm)
    return removed
