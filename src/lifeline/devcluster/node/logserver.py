"""The node's slice of the kubelet API: ``GET /containerLogs/<ns>/<pod>/<container>``, so ``kubectl logs`` works.

The API server proxies ``pods/log`` to ``https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>``
presenting its kubelet-client certificate; this server requires a client certificate
signed by the cluster CA and serves the log files the pod workers write. Query
parameters: ``previous``, ``tailLines``, ``follow`` (streams until the container run
ends or the client goes away). Other kubelet endpoints (exec, attach, port-forward,
metrics) answer 404.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["start_log_server", "find_log"]


def find_log(pods_dir: Path, namespace: str, pod: str, container: str, *, previous: bool) -> Path | None:
    """Log file of ``container``'s current (or previous) run in pod ``namespace/pod`` under ``pods_dir``."""
    best: tuple[float, Path] | None = None
    for meta in pods_dir.glob("*/pod.json"):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if info.get("namespace") == namespace and info.get("name") == pod:
            mtime = meta.stat().st_mtime
            if best is None or mtime > best[0]:
                best = (mtime, meta.parent)
    if best is None:
        return None
    runs = sorted((best[1] / "logs" / container).glob("*.log"), key=lambda p: int(p.stem))
    if previous:
        return runs[-2] if len(runs) >= 2 else None
    return runs[-1] if runs else None


def _handler(pods_dir: Path, node: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the agent log quiet
            pass

        def _fail(self, code: int, msg: str) -> None:
            body = msg.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._fail(404, f"{url.path}: not served by lifeline process nodes (only /containerLogs)")
                return
            _, ns, pod, container = parts
            q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            previous = q.get("previous") == "true"
            path = find_log(pods_dir, ns, pod, container, previous=previous)
            if path is None:
                self._fail(404, f"no {'previous ' if previous else ''}log for container {container!r} of pod "
                                f"{ns}/{pod} on node {node}")
                return
            data = path.read_bytes()
            if "tailLines" in q:
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-int(q["tailLines"]):]) if int(q["tailLines"]) > 0 else b""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if q.get("follow") != "true" or previous:
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            self.wfile.write(data)
            self.wfile.flush()
            offset = path.stat().st_size
            with open(path, "rb") as f:
                f.seek(offset)
                while True:
                    chunk = f.read(65536)
                    if chunk:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        continue
                    current = find_log(pods_dir, ns, pod, container, previous=False)
                    if current != path or not _running(path):
                        return
                    time.sleep(0.2)

    return Handler


def _running(log: Path) -> bool:
    """Whether the run writing ``log`` is still alive (its container's pid file exists)."""
    pod_dir = log.parents[2]
    return (pod_dir / "containers" / f"{log.parent.name}.pid").exists()


def start_log_server(pods_dir: Path, node: str, *, cert: Path, key: Path, ca: Path) -> int:
    """Serve the container logs under ``pods_dir`` (the node's ``pods/``; see :func:`find_log`) over TLS
    on 127.0.0.1 (a free port) in a daemon thread; returns the port.

    Args:
        pods_dir: the node's pod directories (``<uid>/pod.json``, ``<uid>/logs/<container>/<run>.log``).
        node: the node's name (in error messages).
        cert, key: the node's serving certificate and key (PEM files).
        ca: the cluster CA: clients must present a certificate it signed.

    Raises:
        OSError, ssl.SSLError: the certificate files cannot be read or the socket cannot be bound.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    ctx.load_verify_locations(str(ca))
    ctx.verify_mode = ssl.CERT_REQUIRED  # only the API server (kubelet-client cert) may read logs
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(pods_dir, node))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="log-server", daemon=True).start()
    return server.server_address[1]
