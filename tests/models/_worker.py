"""One rank of a GPT-MoE test run: ``python _worker.py RANK OUT_DIR CONFIG_JSON``.

CONFIG_JSON: {"pipeline", "data", "tensor" (1), "expert" (1), "steps", "store", "model": {...},
"capture" (optional step), "probe" (optional: measure saved activations)}. Ranks meet through a ``FileStore`` (no ports to pick); gloo connects
over loopback. Writes ``OUT_DIR/rank-<r>.pt`` (final state: parameters, AdamW state, data position
and RNG bytes) and ``OUT_DIR/rank-<r>.json`` (per-step losses, wall seconds, micro-batches in flight,
with ``probe`` peak saved-activation bytes per step, and the last step's routed tokens per expert). With ``capture`` = s, also ``OUT_DIR/before-<r>.pt`` (the state
after s steps, before step s + 1 runs) and ``OUT_DIR/log-<r>.pt`` (every upstream-log entry,
``{(iteration, micro_batch, direction): tensor}``).
"""

import contextlib
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lifeline.checkpoint import Layout
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec
from lifeline.models.gpt_moe._memory import SavedActivations


class DictLog:
    """A ``StageLog`` in a dict (what the runtime's upstream log would hold)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int, str], torch.Tensor] = {}

    def record(self, iteration: int, micro_batch: int, direction: str, tensor: torch.Tensor) -> None:
        self.entries[(iteration, micro_batch, direction)] = tensor.clone()


def snapshot(trainer) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else bytes(v) for k, v in trainer.state().items()}


def main() -> None:
    rank, out, cfg = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    layout = Layout(tensor=cfg.get("tensor", 1), pipeline=cfg["pipeline"], data=cfg["data"],
                    expert=cfg.get("expert", 1))
    if layout.world_size > 1:
        store = dist.FileStore(cfg["store"], layout.world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=layout.world_size,
                                timeout=timedelta(seconds=120))
    trainer = GPTMoESpec(GPTMoEConfig.from_mapping(cfg.get("model", {}))).build(layout, rank)
    trainer.connect()
    capture = cfg.get("capture")
    log = DictLog()
    if capture is not None:
        trainer.log = log
    losses, seconds, in_flight, saved_bytes = [], [], [], []
    probe = SavedActivations(trainer.params) if cfg.get("probe") else None
    for step in range(cfg["steps"]):
        if step == capture:
            torch.save(snapshot(trainer), f"{out}/before-{rank}.pt")
        if probe is not None:
            probe.reset_peak()
        with probe if probe is not None else contextlib.nullcontext():
            result = trainer.train_step()
        losses.append(result.loss)
        seconds.append(result.seconds)
        in_flight.append(trainer.activations_in_flight)
        saved_bytes.append(probe.peak_bytes if probe is not None else None)
    torch.save(snapshot(trainer), f"{out}/rank-{rank}.pt")
    if capture is not None:
        torch.save(log.entries, f"{out}/log-{rank}.pt")
    with open(f"{out}/rank-{rank}.json", "w") as f:
        json.dump({"losses": losses, "seconds": seconds, "step": trainer.step, "in_flight": in_flight,
                   "saved_bytes": saved_bytes, "experts": trainer.expert_activations()}, f)
    if layout.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
