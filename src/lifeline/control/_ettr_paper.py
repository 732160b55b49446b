"""The MoEvement paper's own setting, fed to the ETTR model (the model's validation; pure).

Gandhi and Kozyrakis, "Sparse Checkpointing for Fast and Reliable MoE Training" (MoEvement,
NSDI '26, arXiv 2412.15411), evaluation: DeepSeek-16.4B with 64 experts per MoE layer on A100
GPUs, every system checkpointing every iteration, a job MTBF of 10 minutes; reported ETTRs:
MoEvement 0.956-0.981, Gemini about 0.81, CheckFreq about 0.77 (:data:`PAPER_ETTR`).

Which input comes from where (:data:`PAPER_INPUTS` says the same per field):

- **paper**: the model, 64 experts, A100s, a checkpoint every iteration, MTBF 10 min, the ETTRs.
- **DeepSeekMoE** (Dai et al. 2024, arXiv 2401.06066, Table 1): 16.4 B parameters.
- **MoEvement §4**: a sparse slot holds its ACTIVE operators whole (fp32 weights + both Adam
  moments, 12 B/param) and the FROZEN ones' 2 B/param compute weights (``frozen_fraction``
  2/12); the window is the smallest whose slot fits an iteration (:func:`moevement_window`).
- **assumed** (the testbed's numbers are not in the text this model was built from): 32 GPUs
  (4 nodes of 8), the state sharded evenly (12 B/param / 32 = 6.15 GB per GPU), PCIe 4.0 x16 at
  24 GB/s to host memory, one 100 Gb/s NIC per node carrying both the peer and the storage
  traffic (1.5625 GB/s per GPU each), 4 pipeline stages of 8 micro-batches (replay pace 8/11),
  detection 2 s, restart 6 s, rendezvous 2 s, iteration 3.3 s.

What the assumptions are worth: MoEvement's reported ETTR >= 0.956 at a 600 s MTBF bounds a
failure's whole cost to <= 26.4 s, so the testbed's fixed recovery costs (detection, restart,
rendezvous) are ~10 s, not minutes. CheckFreq's and Gemini's ETTRs are dominated by their stall
``u = T / busy``, so they fix the ratio of the iteration time to one GPU's dense transfer time
(``T / (d / n)`` ~ 0.84): the iteration time was chosen on that ratio, once, for all three
systems together. The test therefore checks that one set of shared inputs reproduces all three
reported values and their order with the formulas of :mod:`lifeline.control._ettr_systems`, not
that the model predicts them blind; it pins the computed values so a changed formula fails.
"""

from __future__ import annotations

from lifeline.control._ettr_model import SharedCosts, SystemCosts, pipeline_replay_pace
from lifeline.control._ettr_systems import checkfreq, gemini, moevement, moevement_window

PAPER_ETTR = {"MoEvement": (0.956, 0.981), "Gemini": (0.81, 0.81), "CheckFreq": (0.77, 0.77)}
"""Reported ETTR at a 10-minute job MTBF, (low, high) (arXiv 2412.15411, evaluation, as quoted by issue 22)."""

PARAMETERS = 16.4e9
"""DeepSeek-16.4B's parameters (DeepSeekMoE, arXiv 2401.06066)."""
BYTES_PER_PARAMETER = 12
"""fp32 weights + both Adam moments (assumed: the mixed-precision training state)."""
FROZEN_FRACTION = 2 / 12
"""A FROZEN operator's bf16 compute weights over its whole state (MoEvement §4)."""
GPUS = 32
STAGES, MICROBATCHES = 4, 8
MTBF_MINUTES = 10.0

PAPER_INPUTS = {
    "model": ("paper", "DeepSeek-16.4B, 64 experts per MoE layer"),
    "gpus": ("assumed", f"{GPUS} A100 (4 nodes x 8)"),
    "dense_bytes": ("DeepSeekMoE + assumed", f"{PARAMETERS:g} params x {BYTES_PER_PARAMETER} B / {GPUS} GPUs"),
    "interval_iterations": ("paper", "1: every system checkpoints every iteration"),
    "gpu_mtbf_seconds": ("paper", f"job MTBF {MTBF_MINUTES:g} min x {GPUS} GPUs"),
    "host_bytes_per_second": ("assumed", "24 GB/s: PCIe 4.0 x16"),
    "network_bytes_per_second": ("assumed", "1.5625 GB/s: a 100 Gb/s NIC per 8-GPU node"),
    "storage_bytes_per_second": ("assumed", "1.5625 GB/s: storage reached through the same NIC"),
    "iteration_seconds": ("assumed", "3.3 s"),
    "detection_seconds": ("assumed", "2 s"),
    "restart_seconds": ("assumed", "6 s"),
    "rendezvous_seconds": ("assumed", "2 s"),
    "replay_pace": ("assumed", f"{STAGES} stages x {MICROBATCHES} micro-batches: m / (m + p - 1)"),
    "frozen_fraction": ("MoEvement §4", "bf16 compute weights of FROZEN operators: 2 of 12 B/param"),
}
"""Each input's source and value, for the docs and the report."""


def paper_shared() -> SharedCosts:
    """The shared inputs of the paper's setting (sources in :data:`PAPER_INPUTS`)."""
    nic = 100e9 / 8 / 8  # 100 Gb/s per node, in B/s, over its 8 GPUs
    return SharedCosts(
        iteration_seconds=3.3, gpus=GPUS, gpu_mtbf_seconds=MTBF_MINUTES * 60.0 * GPUS,
        detection_seconds=2.0, restart_seconds=6.0, rendezvous_seconds=2.0,
        dense_bytes=PARAMETERS * BYTES_PER_PARAMETER / GPUS,
        host_bytes_per_second=24e9, network_bytes_per_second=nic, storage_bytes_per_second=nic,
        replay_pace=pipeline_replay_pace(STAGES, MICROBATCHES),
    )


def moevement_paper_setting() -> tuple[SharedCosts, tuple[SystemCosts, SystemCosts, SystemCosts]]:
    """``(shared, (CheckFreq, Gemini, MoEvement))`` in the paper's setting: every system
    checkpoints every iteration; MoEvement's window from its own rule (:func:`moevement_window`)."""
    shared = paper_shared()
    window, slot = moevement_window(shared, frozen_fraction=FROZEN_FRACTION)
    return shared, (checkfreq(shared, interval_iterations=1), gemini(shared, interval_iterations=1),
                    moevement(shared, window=window, sparse_bytes=slot))
