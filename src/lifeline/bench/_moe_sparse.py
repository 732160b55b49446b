"""``bench moe``'s checkpoint rows: bytes and copy stall per step, dense vs sparse, at one budget.

For each expert count the reference GPT-MoE model (one stage holding every layer) trains a few
steps on CPU; the router's top-k choices are counted per expert (the activation counts MoEvement
orders operators by). The per-step budget is MoEvement's: measured step time × measured copy
bandwidth into a preallocated buffer (the sidecar arena's one memcpy). ``plan_window``
(:mod:`lifeline.checkpoint`) then chooses the operators per slot and the window W.

Measured per step: dense — the whole state (fp32 weights + both AdamW moments + step counts) copied
into the buffer; sparse — each slot's ACTIVE operators (weights + moments) and FROZEN operators
(weights) copied into the buffer, averaged over the window's slots, and its worst slot.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

import torch

__all__ = ["checkpoint_rows"]

_EXPERT = re.compile(r"^layers\.(\d+)\.moe\.experts\.(\d+)\.")
_ROUTER = re.compile(r"^layers\.(\d+)\.moe\.router\.")


def _operator_of(fqn: str) -> tuple[str, str, int | None]:
    m = _EXPERT.match(fqn)
    if m:
        return f"layers.{m[1]}.experts.{m[2]}", "expert", int(m[1])
    m = _ROUTER.match(fqn)
    if m:
        return f"layers.{m[1]}.router", "router", int(m[1])
    return "dense", "dense", None


def _copy_seconds(tensors: list[torch.Tensor], buf: torch.Tensor, repeats: int = 3) -> float:
    """Median seconds to copy ``tensors`` back to back into ``buf`` (uint8)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        off = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            buf[off:off + n].copy_(t.reshape(-1).view(torch.uint8))
            off += n
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _one(experts: int, steps: int) -> dict[str, Any]:
    from lifeline.checkpoint import Layout
    from lifeline.checkpoint import Operator, budget_bytes, plan_window
    from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoETrainer, deterministic_cpu

    deterministic_cpu()
    cfg = GPTMoEConfig(n_experts=experts, top_k=2, d_model=64, d_expert=128, n_layers=2, seq_len=64, micro_batch=4,
                       micro_batches=2, corpus_bytes=1 << 18)
    trainer = GPTMoETrainer(cfg, Layout(), 0)
    trainer.connect()
    counts: dict[str, int] = {}

    def hook(name: str):
        def count(_module, _inp, logits):
            top = torch.softmax(logits, -1).topk(cfg.top_k, dim=-1).indices.reshape(-1)
            for e, n in enumerate(torch.bincount(top, minlength=experts).tolist()):
                key = f"{name}.experts.{e}"
                counts[key] = counts.get(key, 0) + n
        return count

    for fqn, module in trainer.model.named_modules():
        if fqn.endswith("moe.router"):
            module.register_forward_hook(hook(fqn.removesuffix(".moe.router")))
    step_times = [trainer.train_step().seconds for _ in range(steps)][1:]
    step_seconds = statistics.median(step_times)

    params = dict(trainer.model.named_parameters())
    opt = trainer.optimizer.state
    full: dict[str, list[torch.Tensor]] = {}
    weights: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}
    kinds: dict[str, tuple[str, int | None]] = {}
    for fqn, p in params.items():
        op, kind, layer = _operator_of(fqn)
        kinds[op] = (kind, layer)
        sizes[op] = sizes.get(op, 0) + p.numel()
        weights.setdefault(op, []).append(p.detach())
        full.setdefault(op, []).extend([p.detach(), opt[p]["exp_avg"], opt[p]["exp_avg_sq"]])
    dense = [t for ts in full.values() for t in ts]
    dense_bytes = sum(t.numel() * t.element_size() for t in dense)
    buf = torch.empty(dense_bytes, dtype=torch.uint8)
    _copy_seconds(dense, buf, 1)  # fault the buffer's pages in
    dense_seconds = _copy_seconds(dense, buf)
    bandwidth = dense_bytes / dense_seconds
    operators = [Operator(name, sizes[name], kinds[name][0], kinds[name][1], counts.get(name, 0))
                 for name in sorted(sizes)]
    budget = budget_bytes(step_seconds, bandwidth)
    schedule = plan_window(operators, budget_bytes=budget)
    slot_bytes, slot_seconds = [], []
    for i in range(schedule.window):
        tensors = [t for name in schedule.slots[i] for t in full[name]]
        tensors += [t for name in schedule.frozen(i) for t in weights[name]]
        slot_bytes.append(sum(t.numel() * t.element_size() for t in tensors))
        slot_seconds.append(_copy_seconds(tensors, buf))
    mean_bytes = statistics.mean(slot_bytes)
    return {
        "experts_per_layer": experts, "operators": len(operators), "window": schedule.window,
        "step_seconds": round(step_seconds, 6), "copy_bytes_per_second": round(bandwidth),
        "budget_bytes": budget, "over_budget": getattr(schedule, "over_budget", None),
        "dense_bytes_per_step": dense_bytes, "dense_stall_seconds": round(dense_seconds, 6),
        "sparse_bytes_per_step": round(mean_bytes), "sparse_max_slot_bytes": max(slot_bytes),
        "sparse_stall_seconds": round(statistics.mean(slot_seconds), 6),
        "bytes_reduction": round(dense_bytes / mean_bytes, 2),
    }


def checkpoint_rows(experts: tuple[int, ...] = (8, 32, 64), steps: int = 4) -> list[dict[str, Any]]:
    """One row per expert count (see the module docstring)."""
    return [_one(e, steps) for e in experts]
