"""The kind bed's small parts, without a cluster: the docker wrapper's rewriting of --privileged, the
CNI configuration, the node-lifecycle settings read from kind-config.yaml, the image pins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lifeline.bench._kind import node_lifecycle
from lifeline.kindbed import cni

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "src" / "lifeline" / "kindbed" / "node" / "docker"


def _through_wrapper(tmp_path: Path, *args: str) -> list[str]:
    """The argv the wrapper hands to the real docker (a script printing its argv as JSON)."""
    real = tmp_path / "real-docker"
    real.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    real.chmod(0o755)
    out = subprocess.run([str(WRAPPER), *args], env={**os.environ, "LIFELINE_REAL_DOCKER": str(real)},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_wrapper_replaces_privileged_on_run(tmp_path):
    got = _through_wrapper(tmp_path, "run", "--name", "n 1", "--privileged", "--security-opt",
                           "seccomp=unconfined", "img")
    assert "--privileged" not in got
    assert got[:3] == ["run", "--name", "n 1"] and got[-3:] == ["--security-opt", "seccomp=unconfined", "img"]
    assert {"--cap-add=ALL", "--cap-drop=SYS_RESOURCE", "--security-opt=systempaths=unconfined",
            "--device=/dev/kmsg", "--device-cgroup-rule=a *:* rwm"} <= set(got)


def test_wrapper_drops_privileged_on_exec_and_passes_the_rest(tmp_path):
    assert _through_wrapper(tmp_path, "exec", "--privileged", "-i", "node", "ctr", "a b") == \
        ["exec", "-i", "node", "ctr", "a b"]
    assert _through_wrapper(tmp_path, "inspect", "--format", "{{.Id}}", "x") == ["inspect", "--format", "{{.Id}}", "x"]
    assert _through_wrapper(tmp_path, "info") == ["info"]


def test_wrapper_needs_the_real_docker():
    proc = subprocess.run([str(WRAPPER), "ps"], env={k: v for k, v in os.environ.items()
                                                      if k != "LIFELINE_REAL_DOCKER"}, capture_output=True, text=True)
    assert proc.returncode != 0 and "LIFELINE_REAL_DOCKER" in proc.stderr


def test_cni_config_routes_pods_of_the_node_cidr():
    conf = json.loads(cni.conflist("10.244.3.0/24"))
    ptp, portmap = conf["plugins"]
    assert (ptp["type"], ptp["ipMasq"]) == ("ptp", False)
    assert ptp["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.244.3.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    assert portmap["type"] == "portmap"


def test_cni_refuses_a_node_without_pod_cidr():
    node = {"metadata": {"name": "w"}, "spec": {}, "status": {"addresses": [{"type": "InternalIP", "address": "1.2.3.4"}]}}
    with pytest.raises(ValueError, match="w has no pod CIDR"):
        cni.configure([node])


def test_node_lifecycle_is_read_from_kind_config(tmp_path):
    got = node_lifecycle(ROOT / "kind-config.yaml")
    cfg = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert got["node_monitor_grace_period"] in "".join(cfg["kubeadmConfigPatches"])
    assert got["kubelet_lease_renew_interval_seconds"] == got["kubelet_node_lease_duration_seconds"] / 4
    bare = tmp_path / "kind.yaml"
    bare.write_text("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n")
    assert node_lifecycle(bare)["default_not_ready_toleration_seconds"] == 300  # Kubernetes' default


def test_kind_config_names_the_node_image_built_here():
    from lifeline.kindbed.nodeimage import NODE_IMAGE

    cfg = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert {n["image"] for n in cfg["nodes"]} == {NODE_IMAGE}
    assert [n["role"] for n in cfg["nodes"]] == ["control-plane", "worker", "worker", "worker"]


def test_a_component_with_its_own_builder_uses_the_dev_cluster_cache(tmp_path, monkeypatch):
    """pause (gcc of the Kubernetes module's pause.c) goes through lifeline.devcluster.build: a
    versioned entry with its .complete marker, reused on the second call."""
    from lifeline.devcluster import build
    from lifeline.kindbed import gobuild

    monkeypatch.setenv("LIFELINE_CACHE", str(tmp_path))
    d = build.ensure(gobuild.PAUSE, log=lambda _: None)
    assert d == tmp_path / "bin" / "pause-3.10" and build.is_complete(gobuild.PAUSE)
    out = subprocess.run([str(d / "pause"), "-v"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "pause.c v3.10"
    lines: list[str] = []
    assert build.ensure(gobuild.PAUSE, log=lines.append) == d and lines == []  # cached: nothing rebuilt
