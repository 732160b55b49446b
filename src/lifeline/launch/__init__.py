"""lifeline.launch: run a TrainingJob spec as local processes (the embedded default).

``lifeline run JOB.yaml`` starts Redis and the L2 store, then per rank one sidecar and one
trainer process on a local "node" (a loopback address), with the same ``LIFELINE_*`` settings
the operator gives a pod (:func:`lifeline.launch.env.rank_processes` renders the operator's pod
and resolves it), and supervises them with :mod:`lifeline.control` (see docs/launch.md).

Imports are lazy so ``lifeline --help`` stays fast.
"""

from __future__ import annotations

from lifeline._lazy import exports

_EXPORTS = {
    "LaunchOptions": "supervisor",
    "Supervisor": "supervisor",
    "Snapshot": "supervisor",
    "RecoveryRecord": "supervisor",
    "Injection": "inject",
    "parse_injection": "inject",
    "random_injections": "inject",
    "load_for_launch": "spec",
    "rank_processes": "env",
    "RankProcesses": "env",
    "Secrets": "env",
    "Spare": "spare_pool",
    "SparePool": "spare_pool",
    "Template": "templates",
    "ForkedProcess": "templates",
    "FLIP_MASK": "_flip",
    "flip_offset": "_flip",
    "find_slots": "_flip",
    "flip_file": "_flip",
    "flip_in_process": "_flip",
    "flip_stored": "_flip",
    "summarize": "summary",
    "state_digest": "summary",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = exports(__name__, _EXPORTS)
