"""Offline sparse-to-dense conversion: a sparse window in L2 becomes a dense checkpoint (``lifeline ckpt densify``).

A window of W sparse slots (MoEvement, Gandhi et al., arXiv 2412.15411, §4: slot ``i`` holds the
operators captured ACTIVE at step ``start + i`` whole, the later ones FROZEN as weights) reaches a
dense state only by re-running the window's steps: every rank of the job's layout loads slot 0,
trains steps ``start + 1 .. start + W - 1`` and applies each step's slot after it (FROZEN
operators get that step's captured weights, the slot's ACTIVE operators their whole state). After
the last slot every operator is whole, and the state equals, bit for bit, the dense checkpoint a
failure-free run would have taken at step ``start + W - 1`` (tests/checkpoint/test_ckpt_densify.py
compares them). That state is saved as a dense universal-format checkpoint, which loads into any
layout like any other.

The ranks run as local processes on this machine (gloo over loopback, meeting through a file
store), CPU only, with the reference trainer the job's spec names (``spec.model.args`` and
``spec.seed``, as the operator hands them to trainers). The online counterpart, used during a
recovery, is :meth:`lifeline.runtime._sparse.SparseWindows.catch_up`.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lifeline.api import TrainingJobSpec
from lifeline.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from lifeline.checkpoint import StorageOptions

__all__ = ["densify", "latest_window"]


def latest_window(storage: Any, prefix: str, job: str, world_size: int) -> int | None:
    """The start of the latest sparse window every rank ``0 .. world_size - 1`` committed, or ``None``."""
    from lifeline.checkpoint import window_starts

    common: set[int] | None = None
    for rank in range(world_size):
        starts = set(window_starts(storage, prefix, job, rank))
        common = starts if common is None else common & starts
    return max(common) if common else None


def densify(spec: TrainingJobSpec, job: str, source: tuple[str, StorageOptions], out: tuple[str, StorageOptions],
            *, start: int | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Convert job ``job``'s sparse window at ``start`` (default: the latest every rank committed) in
    the storage at ``source`` into a dense checkpoint of step ``start + W - 1`` at ``out``.

    Args:
        spec: the TrainingJob's spec (layout, model arguments, seed) the window was taken under.
        source, out: ``(uri, StorageOptions)`` (what :func:`~lifeline.checkpoint.storage_from_uri` takes) to
            read the window from and to write the dense checkpoint to (may be the same store).
        timeout_s: bound on each collective of the conversion run, seconds.

    Returns:
        ``{"job", "window_start", "window", "step", "world_size", "seconds", "bytes_read"}``;
        ``seconds`` is wall time of the run, ``bytes_read`` the slot bytes read from storage.

    Raises:
        ConfigError: the spec's model cannot take its layout.
        CheckpointError: no such committed window, a slot fails its checksum, or the target step
            already has a committed checkpoint at ``out`` (nothing stored is overwritten).
    """
    import torch.multiprocessing as mp

    from lifeline.checkpoint import list_steps, read_window_manifest, storage_from_uri

    layout = spec.layout.to_wire()
    world = spec.layout.world_size
    model = {"seed": spec.seed, **(spec.model.args if spec.model else {})}
    _config(model, layout)  # bad model arguments fail here, before any process starts
    storage, prefix = storage_from_uri(*source)
    if start is None:
        start = latest_window(storage, prefix, job, world)
        if start is None:
            raise CheckpointError(f"{source[0]}: job {job!r} has no sparse window committed by all {world} ranks",
                                  job=job)
    manifest = read_window_manifest(storage, prefix, job, 0, start)
    step = manifest.last_step
    out_storage, out_prefix = storage_from_uri(*out)
    if step in list_steps(out_storage, out_prefix, job):
        raise CheckpointError(f"{out[0]}: job {job!r} already has a checkpoint of step {step}; remove it "
                              "(lifeline ckpt rm) or write elsewhere (--out)", job=job, step=step)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lifeline-densify-") as tmp:
        args = (world, layout, model, job, source, out, start, str(Path(tmp) / "store"), timeout_s, tmp)
        mp.start_processes(_rank_main, args=args, nprocs=world, join=True, start_method="spawn")
        read = sum(json.loads((Path(tmp) / f"rank-{r}.json").read_text())["bytes_read"] for r in range(world))
    return {"job": job, "window_start": start, "window": manifest.window, "step": step, "world_size": world,
            "seconds": round(time.perf_counter() - t0, 3), "bytes_read": read}


def _config(model: dict[str, Any], layout: dict[str, int]) -> Any:
    from lifeline.checkpoint import Layout
    from lifeline.models.gpt_moe import GPTMoEConfig

    try:
        return GPTMoEConfig.from_mapping(model).validate(Layout.from_dict(layout))
    except TypeError as err:
        raise ConfigError(f"spec.model.args: {err}", field="spec.model.args") from None


class _StoredSlots:
    """``get_log`` of a sidecar client over the windows in storage (what :class:`SparseWindows` reads)."""

    def __init__(self, storage: Any, prefix: str, job: str) -> None:
        self.storage, self.prefix, self.job = storage, prefix, job
        self.bytes_read = 0

    def get_log(self, key: Any, rank: int) -> bytes:
        from lifeline.checkpoint import read_window_slot

        data, _ = read_window_slot(self.storage, self.prefix, self.job, rank, key.iteration)
        self.bytes_read += len(data)
        return data


def _rank_main(rank: int, world: int, layout_d: dict, model: dict, job: str, source: tuple, out: tuple, start: int,
               store_path: str, timeout_s: float, tmp: str) -> None:
    """One rank of the conversion run (a spawned process)."""
    import torch.distributed as dist

    from lifeline.checkpoint import Layout, read_window_manifest, storage_from_uri
    from lifeline.models.gpt_moe import GPTMoESpec, pattern_rules
    from lifeline.runtime import SparseWindows, StorageCheckpointer

    layout = Layout.from_dict(layout_d)
    config = _config(model, layout_d)
    if world > 1:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
    try:
        trainer = GPTMoESpec(config).build(layout, rank)
        trainer.connect(timedelta(seconds=timeout_s))
        storage, prefix = storage_from_uri(*source)
        window = read_window_manifest(storage, prefix, job, rank, start).window
        slots = _StoredSlots(storage, prefix, job)
        sparse = SparseWindows(lambda: slots, job=job, layout=layout, rank=rank, rules=pattern_rules(config),
                               stage=layout.coords(rank).pipeline, window=window)
        sparse.restore(start, trainer)
        while trainer.step < start + window - 1:
            result = trainer.train_step()
            sparse.apply(result.step, start, trainer)
        out_storage, out_prefix = storage_from_uri(*out)
        StorageCheckpointer(out_storage, out_prefix, job, layout, rank, pattern_rules(config)).save(
            trainer.step, trainer.state())
        Path(tmp, f"rank-{rank}.json").write_text(json.dumps({"bytes_read": slots.bytes_read}))
        if world > 1:
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()
