"""The reference trainer's process: ``init()``, the GPT-MoE spec from ``LIFELINE_MODEL``, ``run_training``."""

from __future__ import annotations

import sys

from lifeline.errors import LifelineError
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules
from lifeline.runtime import init, make_checkpointer, run_training

__all__ = ["main", "make_checkpointer"]  # make_checkpointer: re-exported from lifeline.runtime (its home)


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
