"""One rank of a GPT-MoE test run: ``python _worker.py RANK OUT_DIR CONFIG_JSON``.

CONFIG_JSON: {"pipeline", "data", "tensor" (1), "expert" (1), "steps", "store", "model": {...}}. Ranks
meet through a ``FileStore`` (no ports to pick); gloo connects over loopback. Writes
``OUT_DIR/rank-<r>.pt`` (final state: parameters, AdamW state, data position and RNG bytes) and
``OUT_DIR/rank-<r>.json`` (per-step losses and wall seconds).
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lifeline.checkpoint import Layout
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec


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
    losses, seconds = [], []
    for _ in range(cfg["steps"]):
        result = trainer.train_step()
        losses.append(result.loss)
        seconds.append(result.seconds)
    state = {k: v.clone() if isinstance(v, torch.Tensor) else bytes(v) for k, v in trainer.state().items()}
    torch.save(state, f"{out}/rank-{rank}.pt")
    with open(f"{out}/rank-{rank}.json", "w") as f:
        json.dump({"losses": losses, "seconds": seconds, "step": trainer.step}, f)
    if layout.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
