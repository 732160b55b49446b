"""``lifeline.models.gpt_moe`` — the reference GPT with Mixture-of-Experts layers.

A decoder-only transformer (pre-norm RMSNorm, causal attention with fused QKV and RoPE or
learned positions) whose feed-forward layers are dropless top-k MoE layers of SwiGLU
experts with the Switch Transformer load-balancing loss. It trains on the Python standard
library's own sources as byte tokens, deterministically on CPU: tensor-parallel (Megatron-LM),
pipeline-parallel across stages (GPipe or 1F1B over gloo point-to-point), data-parallel across replica
groups and expert-parallel (tokens to their experts' ranks with ``all_to_all_single``).

Public API:

* :class:`GPTMoEConfig` — sizes and hyper-parameters (defaults train fast on 2 CPU cores).
* :class:`GPTMoETrainer` — one rank's model stage, AdamW, data loader and step.
* :class:`GPTMoESpec` — the model spec :func:`lifeline.runtime.run_training` builds trainers from.
* :func:`pattern_rules` — the universal-checkpoint ``PatternRules`` table.
* :func:`check` — what ``lifeline run`` checks before starting (the ``lifeline.models`` entry point).
* :func:`state` / :func:`load_state` — a rank's checkpoint state and its inverse.
* :class:`StdlibLoader`, :func:`stdlib_corpus` — the deterministic, seekable data.

``python -m lifeline.models.gpt_moe`` runs the trainer under the Lifeline runtime (the same as
``python -m lifeline trainer``), configured from ``LIFELINE_*`` variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lifeline.checkpoint import Layout
from lifeline.models.gpt_moe._check import check
from lifeline.models.gpt_moe._config import BYTE_VOCAB, EOD_TOKEN, GPTMoEConfig
from lifeline.models.gpt_moe._data import StdlibLoader, stdlib_corpus
from lifeline.models.gpt_moe._layers import MoE, SwiGLU
from lifeline.models.gpt_moe._patterns import pattern_rules
from lifeline.models.gpt_moe._stage import GPTMoEStage, stage_layers
from lifeline.models.gpt_moe._state import DATA_KEY, RNG_KEY, load_state, state
from lifeline.models.gpt_moe._trainer import GPTMoETrainer, StepResult, deterministic_cpu

__all__ = [
    "BYTE_VOCAB",
    "EOD_TOKEN",
    "DATA_KEY",
    "RNG_KEY",
    "GPTMoEConfig",
    "GPTMoEStage",
    "GPTMoETrainer",
    "GPTMoESpec",
    "MoE",
    "SwiGLU",
    "check",
    "StdlibLoader",
    "StepResult",
    "deterministic_cpu",
    "load_state",
    "pattern_rules",
    "stage_layers",
    "state",
    "stdlib_corpus",
]


@dataclass(frozen=True)
class GPTMoESpec:
    """A model spec for :func:`lifeline.runtime.run_training`: builds one rank's :class:`GPTMoETrainer`."""

    config: GPTMoEConfig = field(default_factory=GPTMoEConfig)

    def build(self, layout: Layout, rank: int) -> GPTMoETrainer:
        """The trainer of global ``rank`` in ``layout`` (deterministic CPU mode switched on)."""
        deterministic_cpu()
        return GPTMoETrainer(self.config, layout, rank)
