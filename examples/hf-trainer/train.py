"""A Hugging Face ``transformers.Trainer`` script under Lifeline (docs/sdk.md, "Hugging Face Trainer").

A small GPT-2 (2 layers, 32-dim embeddings, a byte vocabulary; built from a config, no download)
learns the next byte of the standard library's ``json`` package source, 32 bytes of context per
sample. The Trainer is ``lifeline.runtime.hf.LifelineTrainer``, a ``transformers.Trainer`` that
checkpoints through the sidecar every ``checkpoint.every`` steps and recovers in its process when a
peer is lost (the Trainer resumes at the restored step with the same batches); everything else is
the Trainer's own (data loading, DDP through ``accelerate``, AdamW, the linear LR schedule).
Seeded by the TrainingJob's ``spec.seed``: a run with failures ends bit-identical to one without.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import lifeline.runtime as lifeline
from lifeline.runtime.hf import LifelineTrainer, training_arguments

CONTEXT = 32  # bytes per sample


class JsonBytes(torch.utils.data.Dataset):
    """Non-overlapping ``CONTEXT``-byte windows of ``json/__init__.py`` as GPT-2 inputs and labels."""

    def __init__(self) -> None:
        data = torch.tensor(list(pathlib.Path(json.__file__).read_bytes()), dtype=torch.long)
        self.windows = data[: len(data) // CONTEXT * CONTEXT].view(-1, CONTEXT)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def build_model(seed: int) -> GPT2LMHeadModel:
    """The GPT-2 of this example, initialized from ``seed`` (the same on every rank)."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def main() -> None:
    torch.set_num_threads(1)
    ctx = lifeline.init()  # joins the job before accelerate looks for a process group
    try:
        args = training_arguments(ctx, output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
                                  per_device_train_batch_size=8, learning_rate=3e-3,
                                  dataloader_num_workers=0)
        trainer = LifelineTrainer(ctx, model=build_model(args.seed), args=args, train_dataset=JsonBytes())
        trainer.train()
    finally:
        ctx.close()


if __name__ == "__main__":
    main()
