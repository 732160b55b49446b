"""``lifeline bench checkpoint``: our format vs torch.distributed.checkpoint vs torch.save, same bytes, same storage.

Rows (each peer measured in the same run, median of ``repeats``; peers take turns, the order
rotated every repeat):

- filesystem and MinIO: save and load throughput of ours (``save``: ``persist_state``, a gather
  write from the tensors; ``ours_staged``: the sidecar's part of its path, ``persist_shard`` of a
  blob already in a page-aligned arena-like buffer, with the trainer's ``write_shard`` memcpy timed
  apart as ``stage_s``), DCP (``save``, ``async_save`` blocking time and total, ``load``) and
  ``torch.save``/``torch.load``; and the storage's raw throughput (one object of the same bytes,
  no framing). On the filesystem every headline peer fsyncs what it wrote (DCP's default
  ``sync_files=True``; see ``FS_DURABILITY``), each save is measured again without any fsync
  (``*_nofsync`` rows), every timed operation starts with the page cache of the bench's files
  dropped (loads read from the device; ``load_hot_s`` reads the peer's files first), and each
  peer's CPU seconds are reported beside its wall time (``FS_CONDITIONS``).
- reshard N -> M: N gloo ranks save (ours and DCP, DTensor ``Shard(0)``), then each of the M
  target ranks loads its new shard (see :func:`bench_reshard`), ours vs DCP.
- ``--model fsdp2`` (:func:`run_fsdp2`, instead of the rows above): a ``fully_shard`` model + AdamW at world
  size 2 (gloo, CPU): the trainer's stall ÷ one memcpy of the state and ÷ DCP ``async_save``'s blocking
  time (``_ckpt_fsdp2``), and the bytes read ÷ bytes needed of resharding that state 4 -> 2, 4 -> 3, 3 -> 2
  at ``examples/fsdp2``'s sizes and 4 -> 2 at 1 MiB+ chunks (``_fsdp2_model.reshard_reads``).

Prints one JSON object (with every sample and the load average, since the machine may be shared).
DCP on MinIO goes through :mod:`lifeline.bench._dcp_s3` (an fsspec filesystem over the same minio
client), since s3fs conflicts with the kubernetes client's python-dateutil pin.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from lifeline.bench._ckpt_common import CPU, SAMPLES, GiB, make_state, nbytes
from lifeline.bench._ckpt_fsdp2 import DEFAULT_SHAPES, bench_fsdp2
from lifeline.bench._fsdp2_model import reshard_reads
from lifeline.bench._ckpt_reshard import bench_reshard, worker
from lifeline.bench._ckpt_storage import FS_CONDITIONS, FS_DURABILITY, bench_filesystem, bench_minio

__all__ = ["run", "run_fsdp2", "make_state", "bench_filesystem", "bench_minio", "bench_reshard", "FS_CONDITIONS", "FS_DURABILITY",
           "SAMPLES", "CPU", "GiB"]


def run(size_mib: int = 256, tensors: int = 128, repeats: int = 5, minio: bool = True, reshard_from: int = 4,
        reshard_to: int = 2, workdir: str | None = None) -> dict[str, Any]:
    """Run every row; returns the JSON-ready result.

    Args:
        size_mib: state size in MiB (float32); ``tensors``: how many tensors it is split into.
        repeats: repeats per row (medians reported, every sample under ``samples``).
        minio: also run the MinIO rows (a MinIO server started here).
        reshard_from, reshard_to: ranks saving and ranks loading in the reshard row.
        workdir: parent of the bench's temporary directory (default: the system temp dir); removed after.

    Raises:
        AssertionError: a round trip changed a tensor.
        RuntimeError: a reshard worker process failed.
        ClusterError: the MinIO server did not start.
    """
    warnings.filterwarnings("ignore")
    state = make_state(size_mib << 20, tensors)
    n = nbytes(state)
    root = Path(tempfile.mkdtemp(prefix="lifeline-bench-ckpt-", dir=workdir))
    SAMPLES.clear()
    CPU.clear()
    try:
        result: dict[str, Any] = {
            "benchmark": "checkpoint", "bytes": n, "tensors": len(state), "dtype": "float32", "repeats": repeats,
            "torch": torch.__version__, "cpus": os.cpu_count(), "load_average_start": os.getloadavg(),
        }
        result["filesystem"] = bench_filesystem(state, root / "fs", repeats)
        shutil.rmtree(root / "fs", ignore_errors=True)
        if minio:
            result["minio"] = bench_minio(state, root, repeats)
            shutil.rmtree(root / "minio", ignore_errors=True)
        del state
        result["reshard"] = bench_reshard(root / "reshard", n, tensors, reshard_from, reshard_to, repeats)
        rows = [result["filesystem"]] + ([result["minio"]] if minio else [])
        result["targets"] = {
            "save_and_load_at_least_dcp": all(r["ratios"]["save_vs_dcp"] >= 1 and r["ratios"]["load_vs_dcp"] >= 1
                                              for r in rows),
            "reshard_1_5x_dcp": result["reshard"]["speedup_vs_dcp"] >= 1.5,
            "within_80pct_of_raw": all(r["ratios"]["save_vs_raw"] >= 0.8 and r["ratios"]["load_vs_raw"] >= 0.8
                                       for r in rows),
            "every_save_row_at_least_dcp": all(v >= 1 for r in rows for k, v in r["ratios"].items()
                                               if k.endswith("save_vs_dcp")),
            "every_save_row_within_80pct_of_raw": all(v >= 0.8 for r in rows for k, v in r["ratios"].items()
                                                      if k.endswith("save_vs_raw")),
            # not a target: hot-cache loads, where raw is a memcpy from the page cache and ours adds
            # crc32c of every byte (docs/checkpoint.md, "Load")
            "info_hot_load_within_80pct_of_raw": result["filesystem"]["ratios"]["load_hot_vs_raw"] >= 0.8,
        }
        result["load_average_end"] = os.getloadavg()
        result["samples"] = dict(SAMPLES)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


LARGE_SHAPES = {"dim": 512, "hidden": 2048, "layers": 2, "vocab": 256}
"""The reshard-reads row at 1 MiB+ chunks: ``gate``/``up``/``down`` of 1 MiB per rank at world size 4."""


def run_fsdp2(world: int = 2, repeats: int = 5, workdir: str | None = None) -> dict[str, Any]:
    """The ``--model fsdp2`` rows (module docstring); returns the JSON-ready result.

    Raises:
        AssertionError: a reshard changed a tensor.
        torch.multiprocessing.ProcessRaisedException: a rank of the stall row failed.
    """
    warnings.filterwarnings("ignore")
    result: dict[str, Any] = {"benchmark": "checkpoint", "model": "fsdp2",
                              "save": bench_fsdp2(world, repeats, workdir, DEFAULT_SHAPES)}
    reads = []
    for (a, b), shapes, label in [((4, 2), {}, "example"), ((4, 3), {}, "example"), ((3, 2), {}, "example"),
                                  ((4, 2), LARGE_SHAPES, "1MiB+"), ((4, 3), LARGE_SHAPES, "1MiB+")]:
        row = reshard_reads(a, b, storage="memory", **shapes)
        row["sizes"] = label
        reads.append(row)
    result["reshard_reads"] = reads
    result["targets"] = {"reshard_reads_at_most_1_05": all(r["read_over_needed"] <= 1.05 for r in reads)}
    return result


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "worker":
        worker(sys.argv[2:])
    else:
        print(json.dumps(run(), indent=1))
