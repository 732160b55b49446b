"""The GPT-MoE stage cut into MoEvement operators (§4): each expert, each router, the rest.

Operator names: ``layers.<l>.moe.experts.<e>`` (kind ``expert``, one expert of MoE layer ``l``),
``layers.<l>.moe.router`` (kind ``router``) and ``dense`` (every other parameter of the stage:
embeddings, attention, norms, the shared expert, the output layer). An operator's members are its
parameters (compute weights) and their AdamW entries (``optim.<key>.<fqn>``, see
:func:`~lifeline.models.gpt_moe.state`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor

from lifeline.checkpoint import Operator, OperatorMembers
from lifeline.models.gpt_moe._patterns import OPTIM_KEYS

__all__ = ["expert_operator", "operator_of", "stage_operators"]

_EXPERT = re.compile(r"layers\.(\d+)\.moe\.experts\.(\d+)\.")
_ROUTER = re.compile(r"layers\.(\d+)\.moe\.router\.")


def expert_operator(layer: int, expert: int) -> str:
    """The operator name of expert ``expert`` (global index) of MoE layer ``layer``."""
    return f"layers.{layer}.moe.experts.{expert}"


def operator_of(fqn: str) -> tuple[str, str, int | None]:
    """``(operator name, kind, layer)`` of parameter ``fqn``."""
    if m := _EXPERT.match(fqn):
        return expert_operator(int(m.group(1)), int(m.group(2))), "expert", int(m.group(1))
    if m := _ROUTER.match(fqn):
        return f"layers.{m.group(1)}.moe.router", "router", int(m.group(1))
    return "dense", "dense", None


def stage_operators(params: Mapping[str, Tensor], activations: Mapping[str, int] | None = None
                    ) -> tuple[list[Operator], dict[str, OperatorMembers]]:
    """The stage's operators (parameter counts, kinds, layers and ``activations``: tokens routed to
    each expert over the rolling window, 0 when not given) and the state entries of each.

    Args:
        params: parameter fqn -> tensor of this rank's stage (``model.named_parameters()``).
        activations: expert operator name -> routed tokens.
    """
    counts: dict[str, int] = {}
    kinds: dict[str, tuple[str, int | None]] = {}
    weights: dict[str, list[str]] = {}
    for fqn, p in params.items():
        name, kind, layer = operator_of(fqn)
        counts[name] = counts.get(name, 0) + p.numel()
        kinds[name] = (kind, layer)
        weights.setdefault(name, []).append(fqn)
    acts = activations or {}
    ops = [Operator(n, counts[n], kinds[n][0], kinds[n][1], int(acts.get(n, 0)) if kinds[n][0] == "expert" else 0)
           for n in weights]
    members = {n: OperatorMembers(tuple(ws), tuple(f"optim.{k}.{w}" for w in ws for k in (*OPTIM_KEYS, "step")))
               for n, ws in weights.items()}
    return ops, members
