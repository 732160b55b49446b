"""Running the command-line tools (``kubectl``, the cluster's ``helm``) against a dev cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lifeline.errors import ClusterError

__all__ = ["tool_env", "run_tool"]


def tool_env(state_dir: Path, kubeconfig: Path) -> dict[str, str]:
    """This process's environment plus ``KUBECONFIG`` and helm's cache/config/data homes under ``state_dir/helm``."""
    return {**os.environ, "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(state_dir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(state_dir / "helm" / "config"),
            "HELM_DATA_HOME": str(state_dir / "helm" / "data")}


def run_tool(cmd: list[str], *, env: dict[str, str], check: bool, input: str | None, timeout: float) -> str:
    """Run ``cmd`` with ``input`` on stdin (text); returns its stdout.

    Raises:
        ClusterError: it exited non-zero and ``check`` (the message holds the end of its stderr).
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
    """
    p = subprocess.run(cmd, env=env, input=input, text=True, capture_output=True, timeout=timeout)
    if check and p.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd[:1] + list(cmd[3 if cmd[0] == 'kubectl' else 1:]))}` "
                           f"failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout
