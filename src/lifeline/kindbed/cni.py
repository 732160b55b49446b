"""Pod networking of the kind bed: Debian's CNI plugins, configured per node from the host.

kind's default CNI (kindnetd) cannot be built here: the module proxy answers "Go module path
not permitted" for ``sigs.k8s.io/kind/images/kindnetd``. The cluster is therefore created with
``disableDefaultCNI: true`` and ``lifeline kind up`` does what kindnetd does for a static set of
nodes on one Docker network, once every node has its pod CIDR:

- each node gets ``/etc/cni/net.d/10-lifeline.conflist``: the ``ptp`` plugin (one veth per pod,
  routed, no bridge, so kube-proxy's iptables rules see every packet) with ``host-local`` IP
  addresses from the node's ``spec.podCIDR``, then ``portmap``;
- each node routes every other node's pod CIDR via that node's InternalIP (all nodes share
  one L2 network), so pods reach each other by pod IP without NAT.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from lifeline.kindbed.engine import docker

__all__ = ["conflist", "configure"]


def conflist(pod_cidr: str) -> str:
    """The CNI configuration list (JSON text) of a node whose pods take addresses from ``pod_cidr``."""
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": "lifeline",
        "plugins": [
            {"type": "ptp", "ipMasq": False, "mtu": 1500,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=1)


def configure(nodes: list[dict], *, log: Callable[[str], None] = lambda _: None) -> None:
    """Write each node's CNI config and the routes to every other node's pods.

    Args:
        nodes: ``kubectl get nodes -o json`` items; every one must have ``spec.podCIDR``. The node
            name is its container's name (as kind names them).

    Raises:
        ValueError: a node without a pod CIDR or an InternalIP.
        ClusterError: a ``docker exec`` failed.
    """
    table = []
    for n in nodes:
        name = n["metadata"]["name"]
        cidr = n["spec"].get("podCIDR")
        ip = next((a["address"] for a in n["status"].get("addresses", []) if a["type"] == "InternalIP"), None)
        if not cidr or not ip:
            raise ValueError(f"node {name} has no pod CIDR or InternalIP yet (podCIDR={cidr!r}, ip={ip!r})")
        table.append((name, cidr, ip))
    for name, cidr, _ in table:
        routes = "".join(f"ip route replace {c} via {i}\n" for n, c, i in table if n != name)
        script = f"set -e\ncat > /etc/cni/net.d/10-lifeline.conflist <<'EOF'\n{conflist(cidr)}\nEOF\n{routes}"
        docker("exec", "-i", name, "sh", "-s", input=script.encode())
        log(f"[kind] {name}: pods in {cidr}, routes to {len(table) - 1} other nodes")
