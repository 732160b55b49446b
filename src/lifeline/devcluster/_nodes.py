"""Process-node agents of a dev cluster as the control plane's side sees them: their credentials,
their command line and the process groups of their pods."""

from __future__ import annotations

import sys
from pathlib import Path

from lifeline.devcluster._identity import ProcessRef
from lifeline.devcluster.pki import Pki, write_kubeconfig

__all__ = ["issue_node_credentials", "node_agent_argv", "pod_process_groups"]


def issue_node_credentials(state_dir: Path, name: str, server: str) -> None:
    """Issue node ``name``'s serving certificate (``pki/node-<name>-serving.*``, for its log endpoint) and
    client certificate (``system:node:<name>`` in ``system:nodes``), and write its kubeconfig
    ``kubeconfigs/<name>.kubeconfig`` for API server URL ``server``; all under ``state_dir``."""
    pki = Pki(state_dir / "pki")
    pki.issue(f"node-{name}-serving", f"system:node:{name}", server=True, dns=(name, "localhost"),
              ips=("127.0.0.1",))
    crt, key = pki.issue(f"node-{name}", f"system:node:{name}", orgs=("system:nodes",))
    write_kubeconfig(state_dir / "kubeconfigs" / f"{name}.kubeconfig", server=server,
                     ca=pki.ca_cert, user=f"system:node:{name}", cert=crt, key=key)


def node_agent_argv(state_dir: Path, name: str, *, index: int, node_dir: Path, shm_dir: Path, net: int,
                    resources: dict[str, str], server: str) -> list[str]:
    """The command line of node ``name``'s agent (``lifeline node run``).

    Args:
        state_dir: the cluster's state directory (credentials from :func:`issue_node_credentials`).
        name: node name; ``index``: its 1-based index (selects its block of pod IPs).
        node_dir: the node's own state directory; ``shm_dir``: its ``/dev/shm`` directory.
        net: the cluster's second octet of pod IPs.
        resources: ``{"cpu": quantity, "memory": quantity}`` allocatable on the node.
        server: the API server URL.
    """
    return [
        sys.executable, "-m", "lifeline", "node", "run", "--name", name, "--index", str(index),
        "--kubeconfig", str(state_dir / "kubeconfigs" / f"{name}.kubeconfig"),
        "--state-dir", str(node_dir), "--shm-dir", str(shm_dir),
        "--net", str(net), "--cpu", resources["cpu"], "--memory", resources["memory"],
        "--server", server, "--ca", str(state_dir / "pki" / "ca.crt"),
        "--serving-cert", str(state_dir / "pki" / f"node-{name}-serving.crt"),
        "--serving-key", str(state_dir / "pki" / f"node-{name}-serving.key"),
    ]


def pod_process_groups(node_dir: Path) -> list[ProcessRef]:
    """The containers running on a node (each the leader of its process group), read from the pid
    files its pod workers keep under ``node_dir/pods/<uid>/containers/``; unreadable files are skipped."""
    out = []
    for f in (node_dir / "pods").glob("*/containers/*.pid"):
        try:
            out.append(ProcessRef.parse(f.read_text()))
        except (OSError, ValueError):
            continue
    return out
