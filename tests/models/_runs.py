"""Run GPT-MoE ranks as real processes (``_worker.py``, gloo on loopback, a ``FileStore``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("_worker.py")


def run_ranks(tmp: Path, name: str, pipeline: int, data: int, steps: int = 24, *, tensor: int = 1,
              expert: int = 1, model: dict | None = None, capture: int | None = None,
              probe: bool = False) -> list[dict]:
    """Run every rank as a subprocess; returns per rank {"losses", "step", "in_flight", "saved_bytes",
    "state" (its tensors), "bytes" (its byte entries: data position, RNG)}; with ``capture`` = s also
    "before" (the full state after s steps) and "log" (every upstream-log entry the rank recorded)."""
    out = tmp / name
    out.mkdir()
    world = tensor * pipeline * data * expert
    cfg = json.dumps({"tensor": tensor, "pipeline": pipeline, "data": data, "expert": expert, "steps": steps,
                      "store": str(out / "store"), "model": model or {}, "capture": capture, "probe": probe})
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(out), cfg], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world)]
    try:
        outputs = [p.communicate(timeout=300)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{outputs[r][-3000:]}"
    results = []
    for r in range(world):
        info = json.loads((out / f"rank-{r}.json").read_text())
        saved = torch.load(out / f"rank-{r}.pt")
        info["state"] = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
        info["bytes"] = {k: v for k, v in saved.items() if not isinstance(v, torch.Tensor)}
        if capture is not None:
            info["before"] = torch.load(out / f"before-{r}.pt")
            info["log"] = torch.load(out / f"log-{r}.pt")
        results.append(info)
    return results


def merged(results: list[dict]) -> dict[str, torch.Tensor]:
    """Every stage's state of data-parallel replica 0, merged (names are global)."""
    out: dict[str, torch.Tensor] = {}
    for info in results:
        for k, v in info["state"].items():
            out.setdefault(k, v)
    return out
