"""``lifeline devcluster up | down | status | kill-node | freeze-node | logs`` and the ``node`` role."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from lifeline.devcluster import build as build_cache
from lifeline.devcluster.cluster import DevCluster, Ports
from lifeline.errors import ConfigError

app = typer.Typer(no_args_is_help=True)
node_app = typer.Typer(no_args_is_help=True)

_STATE = typer.Option(Path(".state/devcluster"), "--state-dir", help="The cluster's state directory.")


def _cluster(state_dir: Path) -> DevCluster:
    return DevCluster(state_dir)


@app.command()
def build(component: Optional[list[str]] = typer.Argument(None, help="etcd, kubernetes, helm, minio (default: all)")):
    """Build the cluster's binaries from source into the cache (once; reused afterwards)."""
    names = component or ["etcd", "helm", "minio", "kubernetes"]
    for n in names:
        d = build_cache.ensure(n)
        marker = json.loads((d / ".complete").read_text())
        print(f"{n} {build_cache.COMPONENTS[n].version}: {d} (built in {marker['build_seconds']}s)")


@app.command()
def up(
    state_dir: Path = _STATE,
    nodes: int = typer.Option(3, "--nodes", help="Number of process nodes."),
    apiserver_port: int = typer.Option(6443, "--apiserver-port", help="kube-apiserver's HTTPS port on 127.0.0.1."),
    etcd_port: int = typer.Option(2379, "--etcd-port", help="etcd's client port."),
    etcd_peer_port: int = typer.Option(2380, "--etcd-peer-port", help="etcd's peer port."),
    controller_manager_port: int = typer.Option(10257, "--controller-manager-port",
                                                help="kube-controller-manager's secure port."),
    scheduler_port: int = typer.Option(10259, "--scheduler-port", help="kube-scheduler's secure port."),
    redis_port: int = typer.Option(6379, "--redis-port", help="The catalog's Redis port."),
    minio_port: int = typer.Option(9000, "--minio-port", help="MinIO's S3 port (the L2 store)."),
    node_cpu: str = typer.Option("4", "--node-cpu", help="Allocatable CPU per node."),
    node_memory: str = typer.Option("8Gi", "--node-memory", help="Allocatable memory per node."),
):
    """Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Redis, MinIO and N nodes."""
    ports = Ports(apiserver=apiserver_port, etcd=etcd_port, etcd_peer=etcd_peer_port,
                  controller_manager=controller_manager_port, scheduler=scheduler_port,
                  redis=redis_port, minio=minio_port)
    c = DevCluster.up(state_dir, nodes=nodes, ports=ports, node_cpu=node_cpu, node_memory=node_memory)
    print(f"export KUBECONFIG={c.kubeconfig}")
    print(f"alias helm={c.helm_binary}  # built from source by `lifeline devcluster build`")
    print(f"# redis: {c.redis_url}   minio: http://{c.minio_endpoint} "
          f"(access key {c.minio_access_key}, secret key {c.minio_secret_key})")


@app.command()
def down(state_dir: Path = _STATE):
    """Stop every process of the cluster; nothing is left outside the state directory."""
    _cluster(state_dir).down()


@app.command()
def status(state_dir: Path = _STATE, as_json: bool = typer.Option(False, "--json", help="One JSON object.")):
    """Show components (running/frozen/stopped) and nodes (agent state, Ready condition)."""
    s = _cluster(state_dir).status()
    if as_json:
        print(json.dumps(s, indent=1))
        return
    print(f"server      {s['server']}\nkubeconfig  {s['kubeconfig']}")
    for name, c in s["components"].items():
        print(f"{name:<24} {c['state']:<8} pid={c['pid']}")
    for name, n in s["nodes"].items():
        print(f"node {name:<19} {n['agent']:<8} pid={n['pid']} Ready={n['ready']}")


@app.command("kill-node")
def kill_node(name: str, state_dir: Path = _STATE):
    """SIGKILL a node's agent and every process of its pods (its Lease stops)."""
    _cluster(state_dir).kill_node(name)
    print(f"killed node {name}")


@app.command("freeze-node")
def freeze_node(name: str, thaw: bool = typer.Option(False, "--thaw", help="Resume a frozen node."),
                state_dir: Path = _STATE):
    """Stop a node's heartbeats (its pods keep running); --thaw resumes them."""
    _cluster(state_dir).freeze_node(name, thaw=thaw)
    print(f"{'thawed' if thaw else 'froze'} node {name}")


@app.command("start-node")
def start_node(name: str, state_dir: Path = _STATE):
    """Start a killed node's agent again (it re-registers and cleans up its old pods)."""
    pid = _cluster(state_dir).start_node(name)
    print(f"started node {name} (pid {pid})")


@app.command("kill-container")
def kill_container(pod: str, container: Optional[str] = typer.Option(None, "-c", "--container",
                                                                   help="The container (may be left out when the pod has only one)."),
                   namespace: str = typer.Option("default", "-n", "--namespace", help="The pod's namespace."),
                   state_dir: Path = _STATE):
    """SIGKILL one container's processes; the node restarts it per restartPolicy."""
    _cluster(state_dir).kill_container(pod, container, namespace=namespace)
    print(f"killed container {container or ''} of pod {namespace}/{pod}")


@app.command()
def logs(pod: str, container: Optional[str] = typer.Option(None, "-c", "--container",
                                                         help="The container (may be left out when the pod has only one)."),
         namespace: str = typer.Option("default", "-n", "--namespace", help="The pod's namespace."),
         previous: bool = typer.Option(False, "-p", "--previous", help="The previous run's log."),
         state_dir: Path = _STATE):
    """Print a container's log (its stdout and stderr)."""
    path = _cluster(state_dir).log_path(pod, container, namespace=namespace, previous=previous)
    sys.stdout.write(path.read_text(errors="replace"))


@node_app.command("run")
def node_run(
    name: str = typer.Option(..., "--name", help="The Node object's name."),
    index: int = typer.Option(..., "--index", help="1..32; selects this node's block of pod IPs."),
    net: int = typer.Option(..., "--net", help="1..254; the cluster's second octet of pod IPs."),
    kubeconfig: Path = typer.Option(..., "--kubeconfig", help="The node's kubeconfig (its client certificate)."),
    state_dir: Path = typer.Option(..., "--state-dir", help="The node's directory (pods, volumes, logs)."),
    shm_dir: Path = typer.Option(..., "--shm-dir", help="Where Memory-backed emptyDirs are created."),
    server: str = typer.Option(..., "--server", help="The API server's URL."),
    ca: Path = typer.Option(..., "--ca", help="The cluster CA certificate."),
    serving_cert: Optional[Path] = typer.Option(None, "--serving-cert", help="TLS cert of the log endpoint."),
    serving_key: Optional[Path] = typer.Option(None, "--serving-key", help="TLS key of the log endpoint."),
    cpu: str = typer.Option("4", "--cpu", help="Allocatable CPU the node reports."),
    memory: str = typer.Option("8Gi", "--memory", help="Allocatable memory the node reports."),
    pods: str = typer.Option("110", "--pods", help="Allocatable pods the node reports."),
):
    """Run a process-node agent (started by `lifeline devcluster up`)."""
    # imported here: the node agent loads the kubernetes client, which `lifeline --help` must not
    from lifeline.devcluster.node.agent import main_run

    if not 1 <= index <= 32:
        raise ConfigError(f"--index must be in 1..32, got {index}", field="index")
    if not 1 <= net <= 254:
        raise ConfigError(f"--net must be in 1..254, got {net}", field="net")
    main_run(name=name, index=index, net=net, kubeconfig=kubeconfig, state_dir=state_dir, shm_dir=shm_dir,
             server=server, ca=ca, serving_cert=serving_cert, serving_key=serving_key, cpu=cpu, memory=memory, pods=pods)
