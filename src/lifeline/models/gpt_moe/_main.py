"""The reference trainer's process: ``init()``, the GPT-MoE spec from ``LIFELINE_MODEL``, ``run_training``."""

from __future__ import annotations

import sys

from lifeline.api.pod import TrainerSettings
from lifeline.checkpoint import Layout, PatternRules, storage_from_uri
from lifeline.errors import LifelineError
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules
from lifeline.runtime import Checkpointer, SidecarCheckpointer, StorageCheckpointer, init, run_training

__all__ = ["main", "make_checkpointer"]


def make_checkpointer(settings: TrainerSettings, layout: Layout, rules: PatternRules) -> Checkpointer:
    """The rank's checkpointer: storage at ``LIFELINE_CHECKPOINT_URI`` when set, else the sidecar."""
    if settings.checkpoint_uri:
        storage, prefix = storage_from_uri(settings.checkpoint_uri)
        return StorageCheckpointer(storage, prefix, settings.job, layout, settings.rank, rules)
    return SidecarCheckpointer(settings, layout, rules)


def main() -> None:
    """Run the trainer: ``init()``, build the GPT-MoE spec from ``LIFELINE_MODEL``, ``run_training``."""
    try:
        ctx = init()
        try:
            config = GPTMoEConfig.from_mapping(ctx.settings.model).validate(ctx.layout)
            checkpointer = make_checkpointer(ctx.settings, ctx.layout, pattern_rules(config))
            run_training(ctx, GPTMoESpec(config), checkpointer, ctx.settings.steps, ctx.settings.checkpoint_every)
        finally:
            ctx.close()
    except LifelineError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
