"""Units of the process node: $(VAR) expansion, mount env names, downward API, probes."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from lifeline.devcluster.node.probes import Prober, resolve_argv, run_probe
from lifeline.devcluster.node.volumes import expand, field_ref, mount_env_name
from lifeline.errors import ClusterError

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "web"}},
       "spec": {"nodeName": "node-2", "serviceAccountName": "sa"},
       "status": {"podIP": "127.2.0.5", "podIPs": [{"ip": "127.2.0.5"}], "hostIP": "127.0.0.1"}}


def test_expand_follows_kubernetes_rules():
    env = {"A": "x", "B": "y"}
    assert expand("$(A)-$(B)", env) == "x-y"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$$(A)", env) == "$(A)"


def test_mount_env_name():
    assert mount_env_name("shm-arena") == "LIFELINE_MOUNT_SHM_ARENA"
    assert mount_env_name("kube-api-access-x7k2q") == "LIFELINE_MOUNT_KUBE_API_ACCESS_X7K2Q"


def test_field_refs():
    assert field_ref(POD, "metadata.name") == "p"
    assert field_ref(POD, "metadata.uid") == "u-1"
    assert field_ref(POD, "spec.nodeName") == "node-2"
    assert field_ref(POD, "status.podIP") == "127.2.0.5"
    assert field_ref(POD, "metadata.labels['app']") == "web"
    with pytest.raises(ClusterError, match="unsupported downward-API fieldPath 'spec.hostname'"):
        field_ref(POD, "spec.hostname")


def test_python_maps_to_this_interpreter():
    import sys

    assert resolve_argv(["python3", "-c", "1"]) == [sys.executable, "-c", "1"]
    assert resolve_argv(["/bin/true"]) == ["/bin/true"]


def test_prober_thresholds():
    p = Prober({"periodSeconds": 1, "failureThreshold": 2, "successThreshold": 2}, started=0.0)
    assert p.due(0.0) and p.result is None
    p.record(True, 0.0)
    assert p.result is None and not p.due(0.5) and p.due(1.0)
    p.record(True, 1.0)
    assert p.result is True
    p.record(False, 2.0)
    assert p.result is True  # one failure is below the threshold
    p.record(False, 3.0)
    assert p.result is False


def test_probes_against_real_sockets():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/ok" else 500)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    port = srv.server_address[1]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    container = {"name": "c", "ports": [{"name": "web", "containerPort": port}]}
    kw = {"pod_ip": "127.0.0.1", "container": container, "env": {}, "cwd": "/"}
    try:
        assert run_probe({"httpGet": {"path": "/ok", "port": "web"}}, **kw)
        assert not run_probe({"httpGet": {"path": "/bad", "port": port}}, **kw)
        assert run_probe({"tcpSocket": {"port": port}}, **kw)
        assert not run_probe({"httpGet": {"path": "/ok", "port": "nope"}}, **kw)
    finally:
        srv.shutdown()
        srv.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert not run_probe({"tcpSocket": {"port": closed}}, **kw)
    assert run_probe({"exec": {"command": ["python", "-c", "raise SystemExit(0)"]}}, **kw)
    assert not run_probe({"exec": {"command": ["python", "-c", "raise SystemExit(3)"]}}, **kw)
