"""``python -m lifeline trainer``: the reference GPT-MoE trainer under the runtime, configured from the environment."""

from __future__ import annotations

import typer

__all__ = ["trainer_command", "main", "make_checkpointer"]


def make_checkpointer(settings, layout, rules):
    """The rank's checkpointer: storage at ``LIFELINE_CHECKPOINT_URI`` when set, else the sidecar.

    Raises:
        ConfigError: neither a checkpoint URI nor a sidecar client is available.
    """
    from lifeline.errors import ConfigError
    from lifeline.runtime._checkpointer import StorageCheckpointer

    if settings.checkpoint_uri:
        from lifeline.checkpoint import storage_from_uri

        storage, prefix = storage_from_uri(settings.checkpoint_uri)
        return StorageCheckpointer(storage, prefix, settings.job, layout, settings.rank, rules)
    try:
        from lifeline.runtime._sidecar import SidecarCheckpointer
    except ImportError as err:
        raise ConfigError(f"no LIFELINE_CHECKPOINT_URI and no sidecar client ({err}); set LIFELINE_CHECKPOINT_URI",
                          field="checkpoint_uri") from None
    return SidecarCheckpointer(settings, layout, rules)


def main() -> None:
    """Run the trainer: ``init()``, build the GPT-MoE spec from ``LIFELINE_MODEL``, ``run_training``."""
    from lifeline.errors import LifelineError
    from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules
    from lifeline.runtime import init, run_training

    try:
        ctx = init()
        try:
            config = GPTMoEConfig.from_mapping(ctx.settings.model).validate(ctx.layout)
            checkpointer = make_checkpointer(ctx.settings, ctx.layout, pattern_rules(config))
            run_training(ctx, GPTMoESpec(config), checkpointer, ctx.settings.steps, ctx.settings.checkpoint_every)
        finally:
            ctx.close()
    except LifelineError as err:
        typer.echo(f"error: {err}", err=True)
        raise SystemExit(2) from None


def trainer_command() -> None:
    """Run the reference GPT-MoE trainer under the Lifeline runtime (settings from ``LIFELINE_*``)."""
    main()
