"""``lifeline bench crash``: SIGKILL savers at random moments; count torn checkpoints a reader can see.

Three targets, each a number of kill trials (see ``docs/checkpoint.md``, "Crash during save"):

* ``fs`` — a process saving with :class:`~lifeline.checkpoint.FilesystemStorage` (fsync on), killed at
  a uniformly random time within its measured save duration;
* ``s3`` — the same against a real MinIO started on 127.0.0.1 (blobs larger than the 5 MiB part size:
  kills land mid-multipart too);
* ``sidecar`` — a real sidecar persisting to that MinIO, killed while a trainer hands it a step or
  while it uploads and commits it (:mod:`._crash_sidecar`).

After every kill the bench reads like a restorer would: every committed step (listed, or L2-held in
the catalog) must verify and consolidate bit-identical to the state saved; ``torn_visible`` counts
the ones that did not (must be 0). Forks come from a zygote (:mod:`._crash_zygote`) so a trial costs
milliseconds of startup. Seeded: the kill times and states follow ``seed``.
"""

from __future__ import annotations

import platform
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

TARGETS = ("fs", "s3", "sidecar")
PART_SIZE = 5 << 20
"""S3 part size of the MinIO target, bytes (S3's minimum): its 6 MiB blobs upload in two parts."""


def _versions() -> dict[str, str]:
    import torch

    import lifeline

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "lifeline": getattr(lifeline, "__version__", "dev")}
    try:
        import minio

        out["minio_py"] = minio.__version__
    except ImportError:
        pass
    return out


def run(*, trials: dict[str, int], seed: int = 0, workdir: str | None = None) -> dict[str, Any]:
    """Run the kill trials of each target in ``trials`` (``{"fs": n, "s3": n, "sidecar": n}``; 0 skips one).

    Returns the JSON object: per-target counts (``trials``, ``killed_before_commit``,
    ``killed_after_commit``, ``committed_and_valid``, ``torn_visible``, ``committed_lost``,
    ``seconds``, ``problems``), ``totals``, ``seed``, ``versions`` and ``seconds`` (wall, whole run).
    Raises :class:`~lifeline.errors.LifelineError` when a saver or sidecar fails on its own (not killed).
    """
    from lifeline.bench._crash_library import run_library
    from lifeline.checkpoint import FilesystemStorage

    t0 = time.perf_counter()
    own = workdir is None
    root = Path(workdir or tempfile.mkdtemp(prefix="lifeline-bench-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    out: dict[str, Any] = {"seed": seed, "targets": {}}
    minio = None
    try:
        if trials.get("fs"):
            fs_root = root / "fs"
            cfg = {"target": "fs", "root": str(fs_root), "rows": 256, "tensor": 2, "data": 2, "prefix": "ck", "job": "crash"}
            out["targets"]["fs"] = run_library(cfg, FilesystemStorage(fs_root, fsync=False), trials["fs"],
                                               random.Random(rng.getrandbits(64)), root)
        if trials.get("s3") or trials.get("sidecar"):
            from lifeline.devcluster.services import MinioServer

            minio = MinioServer(state_dir=root / "minio").start()
        if trials.get("s3"):
            out["targets"]["s3"] = _run_s3(minio, trials["s3"], random.Random(rng.getrandbits(64)), root)
        if trials.get("sidecar"):
            from lifeline.bench._crash_sidecar import run_sidecar

            out["targets"]["sidecar"] = run_sidecar(minio, trials["sidecar"], random.Random(rng.getrandbits(64)),
                                                    root)
    finally:
        if minio is not None:
            minio.stop()
        if own:
            shutil.rmtree(root, ignore_errors=True)
    keys = ("trials", "killed_before_commit", "killed_after_commit", "committed_and_valid", "torn_visible",
            "committed_lost")
    out["totals"] = {k: sum(t[k] for t in out["targets"].values()) for k in keys}
    out["versions"] = _versions()
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _run_s3(minio, trials: int, rng: random.Random, root: Path) -> dict:
    from lifeline.bench._crash_library import run_library
    from lifeline.checkpoint import S3Storage, blob_key

    bucket = f"crash-{uuid.uuid4().hex[:8]}"
    s3 = {"endpoint": minio.endpoint, "access_key": minio.access_key, "secret_key": minio.secret_key, "bucket": bucket,
              "part_size": PART_SIZE, "concurrency": 2}
    storage = S3Storage(minio.endpoint, minio.access_key, minio.secret_key, bucket, part_size=PART_SIZE)
    if not storage.client.bucket_exists(bucket):
        storage.client.make_bucket(bucket)
    # 3072 x 1024 fp32 sharded on tensor=2: two ~6 MiB blobs per step, each a two-part multipart upload
    cfg = {"target": "s3", "s3": s3, "rows": 3072, "tensor": 2, "data": 1, "prefix": "ck", "job": "crash"}
    world = cfg["tensor"] * cfg["data"]

    def unfinished_uploads(step: int) -> bool:
        """Abort the multipart uploads the killed saver left (S3 keeps them invisible); True if any."""
        found = False
        for r in range(world):
            key = blob_key(cfg["prefix"], cfg["job"], step, r)
            for up in storage.client._list_multipart_uploads(bucket, prefix=key).uploads:  # noqa: SLF001
                storage.client._abort_multipart_upload(bucket, up.object_name, up.upload_id)  # noqa: SLF001
                found = True
        return found

    row = run_library(cfg, storage, trials, rng, root, after_kill=unfinished_uploads)
    row["part_size_bytes"] = PART_SIZE
    return row
