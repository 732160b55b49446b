"""``python -m lifeline trainer``: the reference GPT-MoE trainer under the runtime, configured from the environment.

``lifeline --help`` imports this module, so torch (the runtime, the model) is imported only when
the command runs.
"""

from __future__ import annotations

__all__ = ["trainer_command"]


def trainer_command() -> None:
    """Run the reference GPT-MoE trainer under the Lifeline runtime (settings from ``LIFELINE_*``)."""
    from lifeline.models.gpt_moe._main import main

    main()
