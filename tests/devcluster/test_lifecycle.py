"""`up`/`down` of a separate one-node cluster: taken ports are refused with the fix, and `down`
leaves no process and no file outside the state directory."""

from __future__ import annotations

import os
import socket
from dataclasses import replace

import pytest

from _dc_helpers import apply, await_, phase, pod
from lifeline.devcluster import DevCluster, Ports
from lifeline.errors import ClusterError, ConfigError

pytestmark = pytest.mark.cluster


def test_taken_port_is_named_with_the_fix(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        ports = replace(Ports.auto(), apiserver=taken)
        with pytest.raises(ClusterError, match=rf"port {taken} for apiserver .* taken.*--apiserver-port"):
            DevCluster.up(tmp_path / "c", ports=ports)
    assert not (tmp_path / "c").exists()  # refused before anything was written


def test_bad_node_count_and_missing_state(tmp_path):
    with pytest.raises(ConfigError, match="nodes must be between 1 and 32"):
        DevCluster.up(tmp_path / "c", nodes=0)
    with pytest.raises(ClusterError, match="no dev cluster state.*lifeline devcluster up"):
        DevCluster(tmp_path / "nothing")


def test_down_leaves_no_process_and_no_file_outside_state_dir(tmp_path):
    cluster = DevCluster.up(tmp_path / "c", nodes=1, ports="auto")
    try:
        ns = "lifecycle"
        cluster.create_namespace(ns)
        script = "import os, time; open(os.environ['LIFELINE_MOUNT_SHM'] + '/f', 'w').write('x'); time.sleep(3600)"
        apply(cluster, ns, pod("holder", script, volumes=[{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                               container={"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}))
        await_(lambda: phase(cluster, ns, "holder") == "Running", timeout=60, what="pod holder running")
        await_(lambda: list(cluster.shm_root.glob("*/*/shm/f")), timeout=30, what="file in the Memory emptyDir")
        procs = [cluster._store.process(n) for n in cluster._state["pids"]]
        pod_groups = cluster._pod_process_groups("node-1")
        assert pod_groups and all(p.alive() for p in [*procs, *pod_groups])
    finally:
        cluster.down()
    assert not [p for p in [*procs, *pod_groups] if p.alive()]
    assert not cluster.shm_root.exists()
    assert not os.path.exists(f"/dev/shm/lifeline-net-{cluster._state['net']}")  # pod-IP block released
    assert not [f for f in os.listdir("/dev/shm") if cluster._state["id"] in f]
    assert cluster.running_components() == []
