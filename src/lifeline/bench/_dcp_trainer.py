"""The baseline trainer of ``lifeline bench recovery``: the reference GPT-MoE trainer under the
Lifeline runtime, checkpointing with ``torch.distributed.checkpoint`` (DCP) to MinIO instead of
the sidecar — what a job without Lifeline does. Run as ``python -m lifeline.bench._dcp_trainer``
with the runtime's ``LIFELINE_*`` variables plus ``LIFELINE_BENCH_DCP_URI``
(``lminio://bucket/prefix``), ``LIFELINE_S3_ENDPOINT``, ``LIFELINE_S3_ACCESS_KEY`` and
``LIFELINE_S3_SECRET_KEY``.

Every rank calls DCP collectively; byte entries (RNG state, data position) differ per rank and
are saved under ``rank<r>/<key>`` so DCP's de-duplication of equal keys keeps each rank's own.
A checkpoint is complete once DCP wrote its ``.metadata`` (DCP's commit marker).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DcpCheckpointer", "main"]


class DcpCheckpointer:
    """A :class:`lifeline.runtime.Checkpointer` over DCP with fsspec (``lminio://``) storage."""

    def __init__(self, uri: str, rank: int) -> None:
        self.uri, self.rank = uri.rstrip("/"), rank

    def _path(self, step: int) -> str:
        return f"{self.uri}/step-{step:012d}"

    def _flat(self, state: Any) -> dict[str, Any]:
        import torch

        return {k if isinstance(v, torch.Tensor) else f"rank{self.rank}/{k}": v for k, v in state.items()}

    def save(self, step: int, state: Any, *, generation: int = 0) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FsspecWriter

        dcp.save(self._flat(state), storage_writer=FsspecWriter(self._path(step), sync_files=False))

    def latest_step(self) -> int | None:
        import fsspec

        fs, _, (root,) = fsspec.get_fs_token_paths(self.uri)
        steps = []
        for name in fs.ls(root, detail=False):
            tail = name.rstrip("/").rsplit("/", 1)[-1]
            if tail.startswith("step-") and fs.exists(f"{name}/.metadata"):
                steps.append(int(tail[5:]))
        return max(steps) if steps else None

    def restore(self, step: int | None = None, *, into: Any) -> Any:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FsspecReader

        step = self.latest_step() if step is None else step
        flat = self._flat(into)
        dcp.load(flat, storage_reader=FsspecReader(self._path(step)))
        out = dict(into)
        for key, value in into.items():
            out[key] = value if isinstance(value, torch.Tensor) else bytes(flat[f"rank{self.rank}/{key}"])
        return out


def main() -> None:
    """Run the GPT-MoE trainer with DCP checkpoints (settings from the environment)."""
    from lifeline.bench._dcp_s3 import register
    from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec
    from lifeline.runtime import init, run_training

    register(os.environ["LIFELINE_S3_ENDPOINT"], os.environ["LIFELINE_S3_ACCESS_KEY"],
             os.environ["LIFELINE_S3_SECRET_KEY"])
    ctx = init()
    try:
        config = GPTMoEConfig.from_mapping(ctx.settings.model).validate(ctx.layout)
        checkpointer = DcpCheckpointer(os.environ["LIFELINE_BENCH_DCP_URI"], ctx.rank)
        run_training(ctx, GPTMoESpec(config), checkpointer, ctx.settings.steps, ctx.settings.checkpoint_every)
    finally:
        ctx.close()


if __name__ == "__main__":
    main()
