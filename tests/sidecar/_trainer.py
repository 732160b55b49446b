"""A minimal trainer process for the sidecar tests (run as a script; settings from LIFELINE_*).

    _trainer.py save FIRST LAST [--hold]   save steps FIRST..LAST, print one JSON line per save, then
                                           (with --hold) block until killed
    _trainer.py restore                    restore the latest complete step, print JSON with the step,
                                           tier and whether every entry is bit-identical
    _trainer.py preempt FIRST LAST STEP    save FIRST..LAST, then on SIGTERM (as a preempted runtime does)
                                           save STEP, wait (at most 20 s) until a peer holds its L1 copy,
                                           print JSON {"step", "l1", "seconds"} and exit 143
"""

from __future__ import annotations

import json
import signal
import sys
import time

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
    if argv[0] == "preempt":
        return _preempt(settings, client, int(argv[1]), int(argv[2]), int(argv[3]))
    raise SystemExit(f"unknown mode {argv[0]}")


def _preempt(settings: TrainerSettings, client: SidecarClient, first: int, last: int, step: int) -> int:
    from lifeline.catalog import Catalog

    got: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: got.append(time.monotonic()))
    for s in range(first, last + 1):
        client.save(s, state_at(s, settings.rank))
    print(json.dumps({"holding": True}), flush=True)
    while not got:
        signal.pause()
    client.save(step, state_at(step, settings.rank))
    catalog = Catalog(settings.redis_url, settings.job, settings.world_size)
    from lifeline._poll import wait_for

    try:
        l1 = wait_for(lambda: any(h.tier == "L1" and h.holder != settings.rank
                                  for h in catalog.holders(step, settings.rank)),
                      timeout=max(0.0, got[0] + 20 - time.monotonic()), what="an L1 copy", interval=0.02)
    except TimeoutError:
        l1 = False
    print(json.dumps({"step": step, "l1": l1, "seconds": round(time.monotonic() - got[0], 3)}), flush=True)
    return 143


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
