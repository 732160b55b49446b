"""The FSDP2 bench state: a Llama-shaped model ``fully_shard``-ed per block and whole, with AdamW, and the
read amplification of resharding its checkpoint (bytes read ÷ bytes needed) from N ranks to M.

:class:`LlamaShapes` has the parameters of ``examples/fsdp2``'s ``TinyLlama`` (embedding, per block two
RMSNorm weights, ``qkv``, ``out``, ``gate``, ``up``, ``down``, final norm, head; no biases); its
defaults are the example's sizes. :func:`reshard_reads` saves the state at world size N and loads it at
M, counting every byte the loader reads (tensor chunks widened to their checksum blocks, coalescing
gaps, byte entries) against the bytes the M ranks need.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lifeline.checkpoint import (
    FilesystemStorage,
    Layout,
    MemoryStorage,
    load,
    plan_load,
    read_manifest,
    save_states,
)
from lifeline.runtime import StatefulState

__all__ = ["LlamaShapes", "build", "reshard_reads"]


class LlamaShapes(nn.Module):
    """The parameters of ``examples/fsdp2``'s ``TinyLlama`` (float32), without its forward.

    Args:
        dim: model width; ``hidden``: MLP width; ``layers``: blocks; ``vocab``: embedding rows.
        Shapes: ``embed.weight`` and ``head.weight`` [vocab, dim]; per block ``attn_norm``/``mlp_norm``
        [dim], ``qkv`` [3 dim, dim], ``out`` [dim, dim], ``gate``/``up`` [hidden, dim], ``down``
        [dim, hidden]; ``norm`` [dim].
    """

    def __init__(self, dim: int = 32, hidden: int = 64, layers: int = 2, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            block = nn.Module()
            block.attn_norm, block.mlp_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
            block.qkv, block.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
            block.gate, block.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
            block.down = nn.Linear(hidden, dim, bias=False)
            self.blocks.append(block)
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)


def build(seed: int = 0, **shapes: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """:class:`LlamaShapes` (``shapes`` its arguments), each block and the whole ``fully_shard``-ed over the
    default process group, and AdamW with its moments in place (``get_state_dict`` creates them, as the
    example's ``build`` does). Needs an initialized process group."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = LlamaShapes(**shapes)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    get_state_dict(model, optim)
    with torch.no_grad():  # moments that are not all zero (the crc32c of zeros is no different, but be real)
        for state in optim.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                state[key].to_local().uniform_(0, 1)
    return model, optim


class _App:
    def __init__(self, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.optim)
        return {"model": model, "optim": optim}

    def load_state_dict(self, sd: dict) -> None:  # pragma: no cover - the bench only saves
        raise NotImplementedError


def _local(values: dict[str, Any], placed: dict[str, Any], layout: Layout, rank: int) -> dict[str, Any]:
    """The state rank ``rank`` of ``layout`` holds: each DTensor entry cut to its ``placed`` box
    (``torch.chunk`` along the shard dim, as ``fully_shard`` at that world size), the rest as is."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in placed:
            offsets, lengths = placed[key].box(layout, layout.coords(rank))
            value = value[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))].contiguous().clone()
        out[key] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def reshard_reads(src: int = 4, dst: int = 2, *, storage: str = "memory", **shapes: int) -> dict[str, Any]:
    """Save the FSDP2 state (:func:`build` with ``shapes``) at world size ``src``, load it at ``dst``.

    Runs in this process: a one-rank gloo group is created when none is (and destroyed after), the
    model is ``fully_shard``-ed on it, and each rank's state at ``src`` / ``dst`` is its DTensor entries'
    ``placed`` boxes (the boxes ``fully_shard`` gives at that world size; tests/runtime/
    test_dtensor_state.py checks them against DTensor's own) with the byte entries of a
    ``StatefulState`` (``__step__``, ``app.__rest__``, the rng states).

    Args:
        src, dst: world sizes (data-parallel degrees) saving and loading.
        storage: ``"memory"`` (:class:`MemoryStorage`) or ``"fs"`` (:class:`FilesystemStorage` in a
            temporary directory, removed after).
        shapes: :class:`LlamaShapes` arguments (default: the example's sizes).

    Returns:
        ``{"from", "to", "storage", "state_bytes", "needed_bytes", "read_bytes", "read_over_needed",
        "tensor_needed_bytes", "tensor_read_bytes", "tensor_read_over_needed", "per_rank"}``: bytes the
        ``dst`` ranks need (tensors + byte entries) and read, summed over ranks, the same for tensors
        only (the planner's reads), and per rank ``[needed, read]``.
    """
    own = not dist.is_initialized()
    tmp = tempfile.TemporaryDirectory(prefix="lifeline-fsdp2-reads-")
    try:
        if own:
            dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp.name, 'store')}", rank=0,
                                    world_size=1)
        model, optim = build(0, **shapes)
        state = StatefulState({"app": _App(model, optim)})
        values = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in state.values(3).items()}
        rules, placed = state.rules, dict(state.rules.placed)
        a, b = Layout(data=src), Layout(data=dst)
        store = MemoryStorage() if storage == "memory" else FilesystemStorage(os.path.join(tmp.name, "fs"), fsync=False)
        states = [_local(values, placed, a, r) for r in range(src)]
        save_states(store, "", "fsdp2", 3, a, rules, states)
        out: dict[str, Any] = {"from": src, "to": dst, "storage": storage, "per_rank": [],
                               "state_bytes": sum(v.numel() * v.element_size() for s in states for v in s.values()
                                                  if isinstance(v, torch.Tensor))}
        needed = read = t_needed = t_read = 0
        manifest = read_manifest(store, "", "fsdp2", 3)
        for r in range(dst):
            want = _local(values, placed, b, r)
            into = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else None) for k, v in want.items()}
            plan = plan_load(manifest, b, r, rules, into)
            report = load(store, "", "fsdp2", 3, b, r, rules, into)
            for k, v in want.items():
                if isinstance(v, torch.Tensor) and not torch.equal(into[k], v):
                    raise AssertionError(f"rank {r} of {dst}: {k} differs after the reshard")
            needed, read = needed + report.needed_bytes, read + report.read_bytes
            t_needed, t_read = t_needed + plan.needed_bytes, t_read + plan.read_bytes
            out["per_rank"].append([report.needed_bytes, report.read_bytes])
        out.update(needed_bytes=needed, read_bytes=read, read_over_needed=round(read / needed, 4),
                   tensor_needed_bytes=t_needed, tensor_read_bytes=t_read,
                   tensor_read_over_needed=round(t_read / t_needed, 4))
        return out
    finally:
        if own and dist.is_initialized():
            dist.destroy_process_group()
        tmp.cleanup()
