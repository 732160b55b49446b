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
    Regression(3, 4, "tensor 2 x expert 2, keep 1: a hang of rank 0 during the ReplacePods answering a sidecar "
               "kill is not found by the hang timeout; after startupGraceSeconds the engine blames the "
               "replacement ('trainer silent 121s since the recovery began'), replaces it again and rolls back "
               "to the initial state: time lost 158.5 s > bound 125 s (found 2026-11-27)"),
    Regression(9, 4, "pipeline 3, sparse window 3, localized replay: an L2 flip's Rollback to step 4 fails for "
               "rank 0 (the flipped copy), the LocalizedReplay planned next for its stage replays to the old "
               "step 6 while the survivors had restored step 4 ('localized replay to step 6, but this surviving "
               "rank is at step 4'): a third recovery without a new fault (found 2026-11-27)"),
    Regression(12, 4, "pipeline 3: a hang during the Rollback answering an L2 flip is found after 121 s, the "
                "replacements blamed ('trainer silent 121s since the recovery began'): time lost 141.8 s > "
                "bound 120 s (found 2026-11-27)"),
]
