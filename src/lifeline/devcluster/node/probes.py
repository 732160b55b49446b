"""Readiness and liveness probes (httpGet, tcpSocket, exec), as a kubelet's prober runs them."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
import time

__all__ = ["Prober", "run_probe", "resolve_argv"]


def resolve_argv(argv: list[str]) -> list[str]:
    """Map a leading ``python``/``python3`` to this interpreter (``sys.executable``)."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


def _port(value, container: dict) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for p in container.get("ports") or []:
        if p.get("name") == value:
            return int(p["containerPort"])
    raise ValueError(f"named port {value!r} not declared by container {container['name']!r}")


def run_probe(probe: dict, *, pod_ip: str, container: dict, env: dict[str, str], cwd: str) -> bool:
    """Run one probe attempt; True on success. Timeout is ``timeoutSeconds`` (default 1 s)."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            host = h.get("host") or pod_ip
            port = _port(h["port"], container)
            cls = http.client.HTTPSConnection if h.get("scheme", "HTTP").upper() == "HTTPS" \
                else http.client.HTTPConnection
            kw = {}
            if cls is http.client.HTTPSConnection:
                kw["context"] = ssl._create_unverified_context()  # kubelet does not verify either
            conn = cls(host, port, timeout=timeout, **kw)
            try:
                headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
                conn.request("GET", h.get("path") or "/", headers=headers)
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, _port(t["port"], container)), timeout=timeout):
                return True
        if "exec" in probe:
            argv = resolve_argv(probe["exec"]["command"])
            return subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, ValueError, subprocess.TimeoutExpired, http.client.HTTPException):
        return False
    return False


class Prober:
    """State of one probe of one container run: schedule and consecutive results.

    ``result`` is the probe's current verdict: None before the first decision, then
    True/False after ``successThreshold`` successes / ``failureThreshold`` failures.
    """

    def __init__(self, probe: dict, started: float) -> None:
        self.probe = probe
        self.period = float(probe.get("periodSeconds") or 10)
        self.next = started + float(probe.get("initialDelaySeconds") or 0)
        self.success_threshold = int(probe.get("successThreshold") or 1)
        self.failure_threshold = int(probe.get("failureThreshold") or 3)
        self.successes = 0
        self.failures = 0
        self.result: bool | None = None

    def due(self, now: float | None = None) -> bool:
        """Whether the next attempt is due."""
        return (time.monotonic() if now is None else now) >= self.next

    def record(self, ok: bool, now: float | None = None) -> None:
        """Record an attempt's outcome and schedule the next one."""
        self.next = (time.monotonic() if now is None else now) + self.period
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.success_threshold:
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.failure_threshold:
                self.result = False
