"""lifeline.devcluster: a real Kubernetes control plane built from source, with process nodes.

Public API:

- :class:`DevCluster` (``DevCluster.up(state_dir, nodes=3)``, ``.down()``, ``.kubectl(...)``,
  ``.helm(...)``, ``.kill_node(name)``, ``.freeze_node(name, thaw=False)``, ``.start_node(name)``,
  ``.kill_container(pod, container, namespace=...)``, ``.kubeconfig``, ``.nodes``,
  ``.redis_url``, ``.minio_endpoint``/``.minio_access_key``/``.minio_secret_key``).
- :class:`RedisServer`, :class:`MinioServer`: real servers on loopback (tests, dev cluster).
- :class:`ProcessRef`: a recorded process by pid and start time (a container's pid file holds one);
  its signals spare a stranger that has the pid by now.
- :mod:`lifeline.devcluster.build`: the from-source build cache.
- :mod:`lifeline.devcluster.azurite`: :class:`~lifeline.devcluster.azurite.AzuriteServer`, the Azure
  blob emulator on loopback (installed from npm into the cache on first use; tests).
- :mod:`lifeline.devcluster.fakegcs`: :class:`~lifeline.devcluster.fakegcs.FakeGCSServer`, the Google
  Cloud Storage emulator on loopback (built from source into the cache on first use; tests).

See docs/devcluster.md.
"""

from lifeline.devcluster._identity import ProcessRef
from lifeline.devcluster.cluster import DevCluster, Ports
from lifeline.devcluster.services import MinioServer, RedisServer

__all__ = ["DevCluster", "Ports", "ProcessRef", "RedisServer", "MinioServer"]
