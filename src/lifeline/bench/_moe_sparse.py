"""``bench moe``'s checkpoint rows: bytes and copy stall per step, dense vs sparse, at one budget.

For each expert count the reference GPT-MoE model (one stage holding every layer) trains a few
steps on CPU; the router's top-k choices are counted per expert (the activation counts MoEvement
orders operators by). The per-step budget is MoEvement's: measured step time × measured copy
bandwidth into a preallocated buffer (the sidecar arena's one memcpy). ``plan_window``
(:mod:`lifeline.checkpoint`) then chooses the operators per slot and the window W.

Measured per step: dense — the whole state (fp32 weights + both AdamW moments) copied into the
buffer, before the next step (``dense_stall_seconds``) and overlapped with it as the runtime saves
by default (``dense_overlapped_stall_seconds``, the wait before the next optimizer update); sparse — each slot's ACTIVE operators (weights + moments) and FROZEN operators (weights)
copied into the buffer, averaged over the window's slots, and its worst slot. Operators, their
members and activation counts are the trainer's own (``sparse_operators``, ``expert_activations``:
what the runtime's sparse checkpoints capture). On CPU the measured budget (a slow step, a fast
memcpy) fits the whole state in one slot (W = 1); ``by_window`` shows the bytes at larger W.
The trainer computes with ``compute_dtype`` (default bfloat16: fp32 masters, each parameter used
rounded to bfloat16, :mod:`lifeline.models.gpt_moe._precision`), so a FROZEN operator costs its
compute weights, 2 of an ACTIVE one's 12 B/param (MoEvement §4's pricing), cast as they are copied
(the runtime's capture); ``frozen_fp32`` is the same schedule with fp32 FROZEN copies (4 B/param),
measured in the same run. A slot's FROZEN operators are the later slots' (half the parameters on
average over a window), so the mean slot tends to ``frozen / 2 + 12 / W`` B/param x params for
large W: the reduction is bounded by 12x (bfloat16) and 6x (fp32). Dense copies
beside the slots (``checkpoint.every: D``) add ``dense / D`` per step (:func:`with_dense`): each row
says from which D dense + sparse copies fewer bytes than dense alone at every step.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

__all__ = ["checkpoint_rows", "with_dense"]

def _copy_seconds(tensors: list[torch.Tensor], buf: torch.Tensor, repeats: int = 3,
                  frozen: list[torch.Tensor] = (), dtype: torch.dtype = torch.float32) -> float:
    """Median seconds to copy ``tensors`` back to back into ``buf`` (uint8), then ``frozen`` cast
    to ``dtype`` on the way (one pass, as the capture of FROZEN compute weights does)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        off = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            buf[off:off + n].copy_(t.reshape(-1).view(torch.uint8))
            off += n
        for t in frozen:
            n = t.numel() * dtype.itemsize
            buf[off:off + n].view(dtype).copy_(t.reshape(-1))
            off += n
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _overlapped_stall(trainer: Any, tensors: list[torch.Tensor], buf: torch.Tensor, steps: int) -> float:
    """Mean seconds per step the trainer waits for a dense copy that overlaps its next step (the
    runtime's default save, ``LIFELINE_OVERLAP_SAVE``): after each step the state is copied into
    ``buf`` on a background thread, joined by the trainer's ``before_update`` hook of the next step
    (before its optimizer writes the state). The wait is the part of the copy the step's forward
    and backward passes did not hide; it is ~0 when the copy runs on a core the step does not use."""
    from concurrent.futures import ThreadPoolExecutor

    waits: list[float] = []
    pending: list[Any] = []

    def join() -> None:
        if pending:
            t0 = time.perf_counter()
            pending.pop().result()
            waits.append(time.perf_counter() - t0)

    with ThreadPoolExecutor(1) as pool:
        trainer.before_update = join
        try:
            for _ in range(steps):
                trainer.train_step()
                pending.append(pool.submit(_copy_seconds, tensors, buf, 1))
            join()
        finally:
            trainer.before_update = None
    return statistics.mean(waits[:-1] or waits)


def _one(experts: int, steps: int, windows: tuple[int, ...], compute_dtype: str) -> dict[str, Any]:
    from lifeline.checkpoint import Layout, budget_bytes, plan_window, with_window
    from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoETrainer, deterministic_cpu

    deterministic_cpu()
    cfg = GPTMoEConfig(n_experts=experts, top_k=2, d_model=64, d_expert=128, n_layers=2, seq_len=64, micro_batch=4,
                       micro_batches=2, corpus_bytes=1 << 18, compute_dtype=compute_dtype)
    trainer = GPTMoETrainer(cfg, Layout(), 0)
    trainer.connect()
    counts: dict[str, int] = {}
    step_times = []
    for _ in range(steps):
        step_times.append(trainer.train_step().seconds)
        for name, n in trainer.expert_activations().items():  # MoEvement's activation counts
            counts[name] = counts.get(name, 0) + n
    step_seconds = statistics.median(step_times[1:])
    operators, members = trainer.sparse_operators(counts)
    state = trainer.state()
    full = {op: [state[n] for n in (*m.weights, *m.optimizer) if not n.startswith("optim.step.")]
            for op, m in members.items()}
    weights = {op: [state[n] for n in m.weights] for op, m in members.items()}
    dense = [t for ts in full.values() for t in ts]
    dense_bytes = sum(t.numel() * t.element_size() for t in dense)
    buf = torch.empty(dense_bytes, dtype=torch.uint8)
    _copy_seconds(dense, buf, 1)  # fault the buffer's pages in
    dense_seconds = _copy_seconds(dense, buf)
    bandwidth = dense_bytes / dense_seconds
    budget = budget_bytes(step_seconds, bandwidth)
    frozen_dtype = trainer.compute_dtype
    per_param = frozen_dtype.itemsize
    measured = plan_window(operators, budget_bytes=budget, compute_bytes_per_param=per_param)

    def sparse(schedule, dtype: torch.dtype = frozen_dtype) -> dict[str, Any]:
        slot_bytes, slot_seconds = [], []
        for i in range(schedule.window):
            tensors = [t for name in schedule.slots[i] for t in full[name]]
            frozen = [t for name in schedule.frozen(i) for t in weights[name]]
            slot_bytes.append(sum(t.numel() * t.element_size() for t in tensors)
                              + sum(t.numel() * dtype.itemsize for t in frozen))
            slot_seconds.append(_copy_seconds(tensors, buf, frozen=frozen, dtype=dtype))
        mean_bytes = statistics.mean(slot_bytes)
        return {"window": schedule.window, "sparse_bytes_per_step": round(mean_bytes),
                "sparse_max_slot_bytes": max(slot_bytes), "sparse_stall_seconds": round(statistics.mean(slot_seconds), 6),
                "bytes_reduction": round(dense_bytes / mean_bytes, 2),
                **with_dense(dense_bytes, round(mean_bytes), schedule.window)}

    overlapped = _overlapped_stall(trainer, dense, buf, steps)
    unbounded = plan_window(operators, budget_bytes=1 << 62, compute_bytes_per_param=per_param)
    return {
        "experts_per_layer": experts, "operators": len(operators), "compute_dtype": compute_dtype,
        "frozen_bytes_per_param": per_param,
        "step_seconds": round(step_seconds, 6), "copy_bytes_per_second": round(bandwidth),
        "budget_bytes": budget, "over_budget": measured.over_budget,
        "dense_bytes_per_step": dense_bytes, "dense_stall_seconds": round(dense_seconds, 6),
        "dense_overlapped_stall_seconds": round(overlapped, 6),
        **sparse(measured),
        "by_window": [sparse(with_window(unbounded, w)) for w in windows if w <= len(operators)],
        "frozen_fp32": {"by_window": [sparse(with_window(unbounded, w), torch.float32) for w in windows
                                      if w <= len(operators)]} if per_param < 4 else None,
    }


def with_dense(dense_bytes: int, sparse_bytes: float, window: int) -> dict[str, Any]:
    """Bytes per step when dense copies (``checkpoint.every: D``) run beside the sparse slots, as the
    runtime does: ``dense_bytes / D + sparse_bytes`` (bytes), against dense alone at every step.

    Returns ``dense_every_break_even`` (the smallest D at which dense + sparse copies fewer bytes
    per step than dense alone at every step; ``None`` when a slot copies as much as the dense state)
    and ``with_dense_every``: per D in (W, 4W, 16W), ``total_bytes_per_step`` and
    ``reduction_vs_dense_every_step`` (dense alone at every step / dense + sparse)."""
    rows = [{"dense_every": d, "total_bytes_per_step": round(dense_bytes / d + sparse_bytes),
             "reduction_vs_dense_every_step": round(dense_bytes / (dense_bytes / d + sparse_bytes), 2)}
            for d in (window, 4 * window, 16 * window)]
    even = int(dense_bytes // (dense_bytes - sparse_bytes)) + 1 if sparse_bytes < dense_bytes else None
    return {"dense_every_break_even": even, "with_dense_every": rows}


def checkpoint_rows(experts: tuple[int, ...] = (8, 32, 64), steps: int = 4,
                    windows: tuple[int, ...] = (4, 8, 16, 32), compute_dtype: str = "bfloat16"
                    ) -> list[dict[str, Any]]:
    """One row per expert count (see the module docstring): the window the measured budget gives
    (``window``, ``bytes_reduction`` ...) and, in ``by_window``, the same at each W of ``windows``
    (the budget a faster accelerator step would give: W = operators / operators per slot), with
    FROZEN copies in ``compute_dtype`` (``"bfloat16"`` or ``"float32"``; with bfloat16,
    ``frozen_fp32`` repeats ``by_window`` with fp32 FROZEN copies)."""
    return [_one(e, steps, windows, compute_dtype) for e in experts]
