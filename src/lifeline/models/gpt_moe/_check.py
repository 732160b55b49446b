"""What the reference model accepts, checked before anything starts (the ``lifeline.models`` entry point)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lifeline.checkpoint import Layout
from lifeline.errors import ConfigError, LifelineError
from lifeline.models.gpt_moe._config import GPTMoEConfig

__all__ = ["check"]


def check(args: Mapping[str, Any], layout: Mapping[str, int]) -> None:
    """Check that the GPT-MoE model takes ``args`` (``{"seed": ..., **spec.model.args}``) and ``layout``.

    Registered as the ``gpt-moe`` entry point of the ``lifeline.models`` group, through which
    ``lifeline run`` checks a job's model before it starts anything (a model of one's own registers
    a checker the same way).

    Args:
        args: the model settings handed to the trainer (``LIFELINE_MODEL``).
        layout: the degrees ``{"tensor", "pipeline", "data", "expert"}``.

    Raises:
        ConfigError: ``field`` is ``seed``, ``args.<name>`` (an unknown or out-of-range argument, or
            ``args`` when the settings as a whole are wrong) or ``layout.<degree>`` (a layout the
            model cannot take); the message says what is wrong.
    """
    try:
        config = GPTMoEConfig.from_mapping(dict(args))
        config.validate()
    except (ConfigError, TypeError, ValueError) as err:
        name = getattr(err, "field", None)
        field = "seed" if name == "seed" else (f"args.{name}" if name else "args")
        raise ConfigError(getattr(err, "message", str(err)), field=field) from None
    degrees = {"tensor": 1, "pipeline": 1, "data": 1, "expert": 1, **layout}
    try:
        config.validate(Layout(**degrees))
    except LifelineError as err:
        if (err.key or "").startswith("layout.") and err.key[len("layout."):] in degrees:
            degree = err.key[len("layout."):]
        else:
            degree = next((d for d in ("tensor", "expert", "data", "pipeline") if degrees[d] != 1), "pipeline")
        raise ConfigError(err.message, field=f"layout.{degree}") from None
