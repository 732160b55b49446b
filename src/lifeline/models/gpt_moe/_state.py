"""Checkpoint state of a GPT-MoE rank: parameters, AdamW state, data position, RNG."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from lifeline.errors import CheckpointError
from lifeline.models.gpt_moe._data import StdlibLoader
from lifeline.models.gpt_moe._patterns import OPTIM_KEYS

__all__ = ["state", "load_state", "DATA_KEY", "RNG_KEY"]

DATA_KEY = "data.position"
"""Byte entry: the data loader's JSON state (its position is the next step to read)."""
RNG_KEY = "rng.torch"
"""Byte entry: the CPU generator state (``torch.get_rng_state()``)."""


def state(model: nn.Module, optimizer: torch.optim.Optimizer, data: StdlibLoader,
          rng: torch.Generator | None = None, opt_params: Mapping[str, Tensor] | None = None
          ) -> dict[str, Tensor | bytes]:
    """This rank's checkpoint state, fqn-keyed, in a stable order.

    * ``<param fqn>`` — the parameter (float32, CPU, contiguous; a detached view, no copy);
    * ``optim.exp_avg.<fqn>``, ``optim.exp_avg_sq.<fqn>`` — AdamW moments (zeros before the first
      step), ``optim.step.<fqn>`` — the parameter's step count (float32 scalar);
    * :data:`DATA_KEY` — data-loader position (bytes); :data:`RNG_KEY` — RNG state (bytes) of
      ``rng`` (default: the global CPU generator).

    Tensors are the live buffers: copy (``write_shard``) before training on.
    """
    out: dict[str, Tensor | bytes] = {}
    params = dict(model.named_parameters())
    for fqn, p in params.items():
        out[fqn] = p.detach()
    for fqn, p in params.items():
        q = opt_params[fqn] if opt_params is not None else p
        st = optimizer.state.get(q, {})
        for key in OPTIM_KEYS:
            t = st.get(key)
            out[f"optim.{key}.{fqn}"] = t if t is not None else torch.zeros_like(q, memory_format=torch.contiguous_format)
        step = st.get("step")
        out[f"optim.step.{fqn}"] = step if step is not None else torch.zeros((), dtype=torch.float32)
    out[DATA_KEY] = data.state()
    rng_state = rng.get_state() if rng is not None else torch.get_rng_state()
    out[RNG_KEY] = rng_state.numpy().tobytes()
    return out


@torch.no_grad()
def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, data: StdlibLoader,
               values: Mapping[str, Tensor | bytes], rng: torch.Generator | None = None,
               opt_params: Mapping[str, Tensor] | None = None) -> None:
    """Inverse of :func:`state` (the same ``opt_params``): copy parameters, AdamW state, data
    position and RNG state in.

    Raises:
        CheckpointError: an entry is missing (``key`` names it) or has the wrong shape.
    """
    def get(key: str):
        if key not in values:
            raise CheckpointError(f"checkpoint state lacks {key!r}", key=key)
        return values[key]

    for fqn, p in model.named_parameters():
        src = get(fqn)
        if tuple(src.shape) != tuple(p.shape):
            raise CheckpointError(f"shape {list(src.shape)} != parameter shape {list(p.shape)}", key=fqn)
        p.copy_(src)
        q = opt_params[fqn] if opt_params is not None else p
        st = {key: get(f"optim.{key}.{fqn}").clone().contiguous() for key in OPTIM_KEYS}
        for key, t in st.items():
            if tuple(t.shape) != tuple(q.shape):
                raise CheckpointError(f"shape {list(t.shape)} != optimizer tensor shape {list(q.shape)}",
                                      key=f"optim.{key}.{fqn}")
        st["step"] = get(f"optim.step.{fqn}").clone().to(torch.float32)
        optimizer.state[q] = st
    data.load_state(get(DATA_KEY))
    rng_bytes = bytes(get(RNG_KEY))
    rng_state = torch.frombuffer(bytearray(rng_bytes), dtype=torch.uint8).clone()
    if rng is not None:
        rng.set_state(rng_state)
    else:
        torch.set_rng_state(rng_state)
