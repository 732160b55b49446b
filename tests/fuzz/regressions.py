"""Every seed the differential fuzzer (``lifeline bench fuzz``) ever failed on, kept as a named regression case.

Each entry replays exactly the trial that failed: ``lifeline bench fuzz --seed SEED --trials 1
--max-world MAX_WORLD`` (tests/fuzz/test_fuzz.py runs each as its own test id). Add a seed when a
trial fails (in CI or by hand), with what it found; never remove one — a fixed bug stays fixed.
"""

from __future__ import annotations

from typing import NamedTuple


class Regression(NamedTuple):
    seed: int
    max_world: int
    found: str
    """What the trial found when it was added (the bug, or the finding's first reason)."""


REGRESSIONS: list[Regression] = [
    Regression(143203680, 4, "a hang during the recovery of a hang (tensor 2, 1F1B, sparse window 2, Redis restart "
               "and MinIO outage before): both restarted trainers are declared silent only after "
               "startupGraceSeconds (121 s) and their pods replaced, so the L0 copies go with the sidecars and the "
               "job rolls back to L2's step 6 (time lost 129.6 s > bound 115 s); the engine should restart a "
               "silent trainer whose sidecar still heartbeats in place (found 2026-11-27, open)"),
]
