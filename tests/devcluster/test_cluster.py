"""Acceptance tests of the dev cluster against the real control plane (one cluster per session)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

from lifeline.errors import ClusterError
from _dc_helpers import apply, await_, get, http_get, node_ready, phase, pod, ready_pods

pytestmark = pytest.mark.cluster

SERVER = textwrap.dedent('''
    import http.server, os
    name = os.environ["POD_NAME"].encode()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(name)))
            self.end_headers()
            self.wfile.write(name)
        def log_message(self, *args):
            pass
    http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
''')


def _web(replicas: int = 3) -> dict:
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                     "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "http", "image": "python:3.11", "command": ["python", "-c", SERVER],
                                     "env": env, "ports": [{"name": "http", "containerPort": 8080}],
                                     "startupProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1,
                                                      "failureThreshold": 30},
                                     "readinessProbe": {"httpGet": {"path": "/", "port": "http"},
                                                        "periodSeconds": 1, "timeoutSeconds": 5}}]}}}}


def _available(cluster, ns: str, name: str) -> bool:
    d = get(cluster, "deployment", name, "-n", ns)
    conds = {c["type"]: c["status"] for c in d["status"].get("conditions", [])}
    return conds.get("Available") == "True" and d["status"].get("readyReplicas") == d["spec"]["replicas"]


def _answers_on_pod_ips(pods: list[dict]) -> None:
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == len(ips), f"pod IPs not distinct: {ips}"
    for p in pods:
        assert http_get(f"http://{p['status']['podIP']}:8080/") == p["metadata"]["name"]


def test_server_version_and_ready_nodes(devcluster):
    version = json.loads(devcluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == "v1.32.13"
    nodes = get(devcluster, "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["node-1", "node-2", "node-3"]
    assert all(node_ready(devcluster, n["metadata"]["name"]) == "True" for n in nodes)
    status = devcluster.status()
    assert {c["state"] for c in status["components"].values()} == {"running"}
    assert all(n["ready"] == "True" for n in status["nodes"].values())


def test_deployment_becomes_available_and_pods_answer_on_pod_ips(devcluster, namespace):
    apply(devcluster, namespace, _web())
    await_(lambda: _available(devcluster, namespace, "web"), timeout=60, what="deployment web Available")
    pods = await_(lambda: len(ready_pods(devcluster, namespace, "app=web")) == 3
                  and ready_pods(devcluster, namespace, "app=web"), timeout=30, what="3 ready pods")
    _answers_on_pod_ips(pods)
    p = pods[0]["status"]
    assert p["phase"] == "Running" and p["podIP"].startswith("127.") and p["podIPs"] == [{"ip": p["podIP"]}]
    assert {c["type"] for c in p["conditions"]} >= {"PodScheduled", "Initialized", "ContainersReady", "Ready"}
    cs = p["containerStatuses"][0]
    assert cs["ready"] and cs["started"] and cs["restartCount"] == 0 and "running" in cs["state"]
    assert p["startTime"] and p["hostIP"] == "127.0.0.1"


def test_env_volumes_and_mount_rewriting(devcluster, namespace):
    apply(devcluster, namespace,
          {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"greeting": "hello"}},
          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec"}, "stringData": {"token": "s3cr3t"}})
    script = textwrap.dedent('''
        import json, os
        out = {k: os.environ.get(k) for k in ("POD_IP", "POD_UID", "NODE", "NS", "CM", "SECRET", "EXPANDED",
                                                "LIFELINE_MOUNT_CONFIG", "LIFELINE_MOUNT_SCRATCH", "KUBECONFIG")}
        out["cfg_file"] = open(os.path.join(os.environ["LIFELINE_MOUNT_CONFIG"], "greeting")).read()
        out["sec_file"] = open(os.path.join(os.environ["LIFELINE_MOUNT_CREDS"], "token")).read()
        out["relative"] = open("../etc/config/greeting").read()   # mountPath under the working root
        out["cwd"] = os.getcwd()
        with open(os.path.join(os.environ["LIFELINE_MOUNT_SCRATCH"], "x"), "w") as f:
            f.write("shm")
        print(json.dumps(out))
    ''')
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
           {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
           {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
           {"name": "EXPANDED", "value": "$(CM)-world"}]
    mounts = [{"name": "config", "mountPath": "/etc/config"}, {"name": "creds", "mountPath": "/etc/creds"},
              {"name": "scratch", "mountPath": "/scratch"}]
    volumes = [{"name": "config", "configMap": {"name": "cfg"}}, {"name": "creds", "secret": {"secretName": "sec"}},
               {"name": "scratch", "emptyDir": {"medium": "Memory"}}]
    apply(devcluster, namespace, pod("env", script, volumes=volumes,
                                     container={"env": env, "volumeMounts": mounts, "workingDir": "/work"}))
    await_(lambda: phase(devcluster, namespace, "env") in ("Succeeded", "Failed"), timeout=60,
           what="pod env finished")
    log = devcluster.log_path("env", "main", namespace=namespace).read_text()
    assert phase(devcluster, namespace, "env") == "Succeeded", log
    obj = get(devcluster, "pod", "env", "-n", namespace)
    out = json.loads(log)
    assert out["POD_IP"] == obj["status"]["podIP"] and out["POD_UID"] == obj["metadata"]["uid"]
    assert out["NODE"] == obj["spec"]["nodeName"] and out["NS"] == namespace
    assert (out["CM"], out["SECRET"], out["EXPANDED"]) == ("hello", "s3cr3t", "hello-world")
    assert out["cfg_file"] == out["relative"] == "hello" and out["sec_file"] == "s3cr3t"
    assert out["LIFELINE_MOUNT_SCRATCH"].startswith("/dev/shm/") and out["cwd"].endswith("/rootfs/work")
    assert out["KUBECONFIG"]
    cs = obj["status"]["containerStatuses"][0]
    assert cs["state"]["terminated"]["exitCode"] == 0 and cs["state"]["terminated"]["reason"] == "Completed"


def test_rbac_is_enforced_for_pod_service_accounts(devcluster, namespace):
    apply(devcluster, namespace,
          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "limited"}},
          {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "allowed"}, "data": {"k": "v"}},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-allowed"},
           "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["allowed"],
                      "verbs": ["get"]}]},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "limited"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-allowed"},
           "subjects": [{"kind": "ServiceAccount", "name": "limited", "namespace": namespace}]})
    script = textwrap.dedent(f'''
        from kubernetes import client, config
        config.load_kube_config()
        v1 = client.CoreV1Api()
        try:
            v1.list_namespaced_pod("{namespace}")
            print("list-pods allowed")
        except client.exceptions.ApiException as e:
            print("list-pods", e.status)
        print("configmap", v1.read_namespaced_config_map("allowed", "{namespace}").data["k"])
    ''')
    apply(devcluster, namespace, pod("rbac", script, serviceAccountName="limited"))
    await_(lambda: phase(devcluster, namespace, "rbac") in ("Succeeded", "Failed"), timeout=60,
           what="pod rbac finished")
    log = devcluster.log_path("rbac", namespace=namespace).read_text()
    assert "list-pods 403" in log and "configmap v" in log, log
    assert phase(devcluster, namespace, "rbac") == "Succeeded"


def test_container_restart_and_logs_cli(devcluster, namespace):
    spec = pod("sleeper", "import time; print('started', flush=True); time.sleep(3600)")
    spec["spec"]["restartPolicy"] = "Always"
    apply(devcluster, namespace, spec)
    await_(lambda: ready_pods(devcluster, namespace, "") and
           get(devcluster, "pod", "sleeper", "-n", namespace)["status"]["containerStatuses"][0]["ready"],
           timeout=60, what="sleeper ready")
    devcluster.kill_container("sleeper", "main", namespace=namespace)

    def restarted():
        cs = get(devcluster, "pod", "sleeper", "-n", namespace)["status"]["containerStatuses"][0]
        return cs["restartCount"] == 1 and cs["ready"] and cs

    cs = await_(restarted, timeout=60, what="container restarted once and ready again")
    assert cs["lastState"]["terminated"]["exitCode"] == 137  # SIGKILL
    cli = [sys.executable, "-m", "lifeline", "devcluster", "logs", "sleeper", "-n", namespace,
           "--state-dir", str(devcluster.state_dir)]
    assert subprocess.run(cli + ["--previous"], capture_output=True, text=True, check=True).stdout == "started\n"
    assert subprocess.run(cli, capture_output=True, text=True, check=True).stdout == "started\n"
    # kubectl logs goes API server -> the node's log endpoint (kubelet API subset)
    assert devcluster.kubectl("logs", "sleeper", "-n", namespace) == "started\n"
    assert devcluster.kubectl("logs", "sleeper", "-n", namespace, "--previous") == "started\n"


def test_init_container_then_liveness_restart(devcluster, namespace):
    # the init container leaves a "dead" marker; the liveness probe fails while it exists, so the
    # first run of the main container is killed and restarted; the second run removes the marker.
    init = {"name": "init", "image": "busybox", "command": ["python", "-c",
            "import os; open(os.environ['LIFELINE_MOUNT_DATA'] + '/dead', 'w').close()"],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    main = textwrap.dedent('''
        import os, time
        d = os.environ["LIFELINE_MOUNT_DATA"]
        if os.path.exists(d + "/first-run-done"):
            os.remove(d + "/dead")
        open(d + "/first-run-done", "w").close()
        print("run", flush=True)
        time.sleep(3600)
    ''')
    probe = {"exec": {"command": ["python", "-c",
             "import os, sys; sys.exit(os.path.exists(os.environ['LIFELINE_MOUNT_DATA'] + '/dead'))"]},
             "periodSeconds": 1, "failureThreshold": 2}
    spec = pod("liveness", main, initContainers=[init], volumes=[{"name": "data", "emptyDir": {}}],
               container={"volumeMounts": [{"name": "data", "mountPath": "/data"}], "livenessProbe": probe})
    spec["spec"]["restartPolicy"] = "Always"
    spec["spec"]["terminationGracePeriodSeconds"] = 1
    apply(devcluster, namespace, spec)

    def healed():
        st = get(devcluster, "pod", "liveness", "-n", namespace)["status"]
        cs = st["containerStatuses"][0]
        return cs["restartCount"] == 1 and cs["ready"] and st

    st = await_(healed, timeout=60, what="one liveness restart, then ready")
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert st["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM
    assert {c["type"]: c["status"] for c in st["conditions"]}["Initialized"] == "True"


def test_graceful_deletion_sigterm_then_sigkill(devcluster, namespace):
    script = textwrap.dedent('''
        import signal, time
        def on_term(*_):
            print("got SIGTERM, ignoring it", flush=True)
        signal.signal(signal.SIGTERM, on_term)
        print("running", flush=True)
        while True:
            time.sleep(0.1)
    ''')
    spec = pod("stubborn", script)
    spec["spec"]["terminationGracePeriodSeconds"] = 2
    apply(devcluster, namespace, spec)
    await_(lambda: phase(devcluster, namespace, "stubborn") == "Running", timeout=60, what="stubborn running")
    log = devcluster.log_path("stubborn", namespace=namespace)
    await_(lambda: "running" in log.read_text(), timeout=30, what="container output")
    devcluster.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false")
    await_(lambda: not devcluster.kubectl("get", "pod", "stubborn", "-n", namespace, "--ignore-not-found").strip(),
           timeout=30, what="pod object removed after the grace period")
    assert "got SIGTERM" in log.read_text()
    assert not list((log.parents[2] / "containers").glob("*.pid"))  # the process group is gone


def test_helm_install_and_uninstall(devcluster, namespace, tmp_path):
    chart = tmp_path / "mini"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "mini", "version": "0.1.0"}))
    (chart / "values.yaml").write_text("greeting: hi\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n")
    devcluster.helm("install", "rel", str(chart), "-n", namespace, "--set", "greeting=hello", "--wait")
    assert get(devcluster, "configmap", "rel-cm", "-n", namespace)["data"] == {"greeting": "hello"}
    assert "rel" in devcluster.helm("list", "-n", namespace, "-q")
    devcluster.helm("uninstall", "rel", "-n", namespace, "--wait")
    assert not devcluster.kubectl("get", "configmap", "rel-cm", "-n", namespace, "--ignore-not-found").strip()
    assert devcluster.helm("version", "--short").startswith("v3.")


def test_cluster_redis_and_minio_round_trip(devcluster):
    import io

    import redis
    from minio import Minio

    r = redis.Redis.from_url(devcluster.redis_url)
    r.set("k", b"v")
    assert r.get("k") == b"v"
    mc = devcluster.minio
    m = Minio(mc.endpoint, access_key=mc.access_key, secret_key=mc.secret_key, secure=False)
    m.make_bucket("devcluster")
    m.put_object("devcluster", "o", io.BytesIO(b"payload"), 7)
    assert m.get_object("devcluster", "o").read() == b"payload"


def test_bad_input_unknown_node_and_running_cluster(devcluster):
    with pytest.raises(ClusterError, match="unknown node 'node-9'.*node-1, node-2, node-3"):
        devcluster.kill_node("node-9")
    cli = subprocess.run([sys.executable, "-m", "lifeline", "devcluster", "freeze-node", "nope",
                          "--state-dir", str(devcluster.state_dir)], capture_output=True, text=True)
    assert cli.returncode == 2 and "unknown node 'nope'" in cli.stderr
    from lifeline.devcluster import DevCluster

    with pytest.raises(ClusterError, match="already running"):
        DevCluster.up(devcluster.state_dir)


def test_freeze_node_stops_heartbeats_but_not_pods(devcluster, namespace):
    script = SERVER
    spec = pod("frozen", script, nodeName="node-2", container={"env": [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}})
    apply(devcluster, namespace, spec)
    ip = await_(lambda: ready_pods(devcluster, namespace, "") and
                get(devcluster, "pod", "frozen", "-n", namespace)["status"]["podIP"], timeout=60,
                what="pod frozen ready")
    devcluster.freeze_node("node-2")
    try:
        assert devcluster.status()["nodes"]["node-2"]["agent"] == "frozen"
        await_(lambda: node_ready(devcluster, "node-2") != "True", timeout=40, what="node-2 NotReady")
        assert http_get(f"http://{ip}:8080/") == "frozen"  # the pod's process keeps running
    finally:
        devcluster.freeze_node("node-2", thaw=True)
    await_(lambda: node_ready(devcluster, "node-2") == "True", timeout=40, what="node-2 Ready after thaw")


def test_kill_node_evicts_and_reschedules(devcluster, namespace):
    apply(devcluster, namespace, _web())
    await_(lambda: _available(devcluster, namespace, "web"), timeout=60, what="deployment web Available")
    victim = ready_pods(devcluster, namespace, "app=web")[0]["spec"]["nodeName"]
    devcluster.kill_node(victim)
    try:
        assert devcluster.status()["nodes"][victim]["agent"] == "stopped"
        await_(lambda: node_ready(devcluster, victim) != "True", timeout=40, what=f"{victim} NotReady")

        def moved():
            pods = ready_pods(devcluster, namespace, "app=web")
            return len(pods) == 3 and all(p["spec"]["nodeName"] != victim for p in pods) and pods

        pods = await_(moved, timeout=90, what="3 ready replicas on the surviving nodes")
        _answers_on_pod_ips(pods)
        evicted = [p for p in get(devcluster, "pods", "-n", namespace, "-l", "app=web")["items"]
                   if p["spec"]["nodeName"] == victim]
        assert evicted and all(p["metadata"].get("deletionTimestamp") for p in evicted)
    finally:
        devcluster.start_node(victim)
    devcluster.wait_nodes_ready(timeout=60)
    # the restarted node finishes the deletion of its evicted pods
    await_(lambda: not [p for p in get(devcluster, "pods", "-n", namespace, "-l", "app=web")["items"]
                        if p["spec"]["nodeName"] == victim], timeout=60, what="evicted pods deleted")
