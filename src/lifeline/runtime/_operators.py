"""MoEvement operators of a user's stage: which state entries each expert, router and the rest own.

:class:`Operators` is the registry a sparse checkpoint (``checkpoint.sparse``) schedules: every
tensor entry of the flat state (:class:`~lifeline.runtime.StatefulState`: ``<name>.<fqn>`` of a
module, ``<name>.state.<i>.<key>`` of an optimizer) belongs to exactly one operator, so a window's
slots restore the whole state. By default each module that holds parameters directly is one
``dense`` operator (right for a model without experts); :meth:`Operators.moe` names the experts and
routers of a MoE layer by two patterns over parameter names, and the remaining parameters form one
``dense`` operator, as in MoEvement (§4).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from lifeline.checkpoint import Operator, OperatorMembers
from lifeline.errors import ConfigError

__all__ = ["Operators", "expert_name", "router_name"]


def expert_name(layer: int, expert: int) -> str:
    """The operator name of expert ``expert`` of MoE layer ``layer``: ``layers.<l>.experts.<e>``."""
    return f"layers.{layer}.experts.{expert}"


def router_name(layer: int) -> str:
    """The operator name of the router (gate) of MoE layer ``layer``: ``layers.<l>.router``."""
    return f"layers.{layer}.router"


class Operators:
    """The sparse-checkpoint operators of a rank's ``states`` (``{"model": module, "optim": optimizer, ...}``).

    Args:
        states: the objects the rank checkpoints (as given to :func:`~lifeline.runtime.train`).

    Raises:
        ConfigError: an optimizer holds a parameter of no module in ``states``.
    """

    def __init__(self, states: Mapping[str, Any]) -> None:
        self._params: dict[int, str] = {}  # id(parameter) -> its state entry (``model.fc.weight``)
        self._modules: list[tuple[str, torch.nn.Module]] = []
        self._optims: list[tuple[str, torch.optim.Optimizer]] = []
        for name, obj in states.items():
            if isinstance(obj, torch.nn.Module):
                self._modules.append((name, obj))
                for fqn, p in obj.named_parameters():
                    self._params.setdefault(id(p), f"{name}.{fqn}")
            elif isinstance(obj, torch.optim.Optimizer):
                self._optims.append((name, obj))
        for name, optim in self._optims:
            for group in optim.param_groups:
                for p in group["params"]:
                    if id(p) not in self._params:
                        raise ConfigError(f"optimizer {name!r} updates a parameter of no module in the states "
                                          f"({tuple(p.shape)})", field="states", key=name)
        self._experts: re.Pattern[str] | None = None
        self._routers: re.Pattern[str] | None = None
        self._counts: Callable[[], Mapping[tuple[int, int], int]] | None = None
        self._layer = 0

    def moe(self, *, experts: str, routers: str | None = None,
            counts: Callable[[], Mapping[tuple[int, int], int]] | None = None, layer: int = 0) -> Operators:
        """Name the experts and routers of the stage's MoE layers (one call; returns ``self``).

        Args:
            experts: a regular expression matched (``re.match``) against parameter names of a module
                (``blocks.1.moe.experts.3.w1``) with the named group ``expert`` and, when the stage has
                several MoE layers, ``layer`` (integers):
                ``r"blocks\\.(?P<layer>\\d+)\\.moe\\.experts\\.(?P<expert>\\d+)\\."``.
            routers: likewise (group ``layer`` optional), for each layer's router; ``None``: none named.
            counts: the popularity hook: tokens routed to each ``(layer, expert)`` since its previous
                call (ints), read once per step after the step; MoEvement's schedule checkpoints the
                least popular experts first. ``None``: every expert counts 0.
            layer: the MoE layer of a match without a ``layer`` group (a stage's one MoE layer).

        Raises:
            ConfigError: a pattern that does not compile or lacks its named groups.
        """
        for pattern, groups in ((experts, {"expert"}), (routers, set())):
            if pattern is None:
                continue
            try:
                compiled = re.compile(pattern)
            except re.error as err:
                raise ConfigError(f"operator pattern {pattern!r}: {err}", field="operators") from err
            if not groups <= set(compiled.groupindex):
                raise ConfigError(f"operator pattern {pattern!r} needs the named groups {sorted(groups)}",
                                  field="operators")
        self._experts = re.compile(experts)
        self._routers = re.compile(routers) if routers is not None else None
        self._counts, self._layer = counts, layer
        return self

    def operator_of(self, entry: str, fqn: str) -> tuple[str, str, int | None]:
        """``(operator, kind, layer)`` of parameter ``fqn`` (state entry ``entry``)."""
        if self._experts is not None:
            if (m := self._experts.match(fqn)) is not None:
                layer = self._layer_of(m)
                return expert_name(layer, int(m.group("expert"))), "expert", layer
            if self._routers is not None and (m := self._routers.match(fqn)) is not None:
                layer = self._layer_of(m)
                return router_name(layer), "router", layer
            return "dense", "dense", None
        module = entry.rsplit(".", 1)[0]
        return module, "dense", None

    def _layer_of(self, m: re.Match[str]) -> int:
        return int(m.group("layer")) if "layer" in m.re.groupindex else self._layer

    def activations(self) -> dict[str, int]:
        """Tokens routed to each expert operator since the previous call (the ``counts`` hook)."""
        if self._counts is None:
            return {}
        return {expert_name(layer, e): int(n) for (layer, e), n in self._counts().items()}

    def operators(self, state: Mapping[str, Tensor | bytes], activations: Mapping[str, int] | None = None
                  ) -> tuple[list[Operator], dict[str, OperatorMembers]]:
        """The operators of ``state`` (the rank's flat state: every tensor entry in exactly one) and
        each one's members: weights (module tensors) and optimizer entries. Tensors of no parameter
        (buffers, other objects' tensors) join the ``dense`` operator's weights."""
        by_fqn: dict[str, tuple[str, str, int | None]] = {}
        for name, module in self._modules:
            for fqn, _ in module.named_parameters():
                entry = f"{name}.{fqn}"
                by_fqn[entry] = self.operator_of(entry, fqn)
        optim_of: dict[str, str] = {}  # ``optim.state.<i>`` -> the parameter's entry
        for name, optim in self._optims:
            params = [p for g in optim.param_groups for p in g["params"]]
            for i, p in enumerate(params):
                optim_of[f"{name}.state.{i}"] = self._params[id(p)]
        weights: dict[str, list[str]] = {}
        optimizer: dict[str, list[str]] = {}
        sizes: dict[str, int] = {}
        kinds: dict[str, tuple[str, int | None]] = {}
        for entry, value in state.items():
            if not isinstance(value, Tensor):
                continue
            prefix = entry.rsplit(".", 1)[0]
            if entry in by_fqn:
                op, kind, layer = by_fqn[entry]
                weights.setdefault(op, []).append(entry)
                sizes[op] = sizes.get(op, 0) + value.numel()
                kinds[op] = (kind, layer)
            elif prefix in optim_of:
                op = by_fqn[optim_of[prefix]][0]
                optimizer.setdefault(op, []).append(entry)
            else:
                weights.setdefault("dense", []).append(entry)
                kinds.setdefault("dense", ("dense", None))
                sizes.setdefault("dense", 0)
        acts = activations or {}
        ops = [Operator(n, sizes.get(n, 0), kinds[n][0], kinds[n][1],
                        int(acts.get(n, 0)) if kinds[n][0] == "expert" else 0) for n in weights]
        members = {n: OperatorMembers(tuple(weights[n]), tuple(optimizer.get(n, ()))) for n in weights}
        return ops, members
