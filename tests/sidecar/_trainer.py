"""A minimal trainer process for the sidecar tests (run as a script; settings from LIFELINE_*).

    _trainer.py save FIRST LAST [--hold]   save steps FIRST..LAST, print one JSON line per save, then
                                           (with --hold) block until killed
    _trainer.py restore                    restore the latest complete step, print JSON with the step,
                                           tier and whether every entry is bit-identical
"""

from __future__ import annotations

import json
import signal
import sys

import torch

from lifeline.api.pod import TrainerSettings
from lifeline.sidecar import SidecarClient


def state_at(step: int, rank: int) -> dict:
    """The deterministic state of ``rank`` after ``step`` steps (fp32, bf16, int64 and bytes entries)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {
        "layers.0.weight": torch.randn(128, 256, generator=g),
        "layers.0.bias": torch.randn(256, generator=g).to(torch.bfloat16),
        "optimizer.step": torch.tensor([step], dtype=torch.int64),
        "rng": torch.randint(0, 256, (100,), generator=g, dtype=torch.uint8).numpy().tobytes(),
    }


def empty_like(rank: int) -> dict:
    s = state_at(0, rank)
    return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else bytes(len(v))) for k, v in s.items()}


def identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else bytes(a[k]) == bytes(b[k])) for k in a
    )


def main(argv: list[str]) -> int:
    settings = TrainerSettings()
    client = SidecarClient(settings)
    if argv[0] == "save":
        for step in range(int(argv[1]), int(argv[2]) + 1):
            r = client.save(step, state_at(step, settings.rank))
            print(json.dumps({"step": step, "stall": r.stall_seconds, "skipped": r.skipped}), flush=True)
        if "--hold" in argv:
            print(json.dumps({"holding": True}), flush=True)
            signal.pause()  # until the test kills this process
        return 0
    if argv[0] == "restore":
        into = empty_like(settings.rank)
        res = client.restore(into=into)
        same = identical(into, state_at(res.step, settings.rank))
        print(json.dumps({"step": res.step, "tier": res.tier, "identical": same}), flush=True)
        return 0
    raise SystemExit(f"unknown mode {argv[0]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
