"""Trim torch's CUDA runtime to what a CPU process maps (runs inside the Lifeline image build).

PyPI's Linux torch wheel is built for CUDA: libtorch_cpu, libtorch_cuda and libtorch_python
list CUDA libraries (cudart, cublas/cublasLt, cudnn, cufft, cusparse, nccl, ...) as ELF
dependencies, so ``import torch`` fails without the ``nvidia-*`` wheels (measured: torch
installed with ``--no-deps`` raises ``ValueError: libcublasLt.so.*[0-9] not found``). Most of
those wheels' bytes are libraries CUDA itself opens on demand (cuDNN engines, cuBLAS kernels,
cuSOLVER, ...), never on a machine without a GPU. This script:

1. runs a probe in a fresh interpreter: ``import torch``, a gloo process group of one rank with
   an ``all_reduce``, a forward and backward pass, and reads ``/proc/self/maps``;
2. deletes every file under ``site-packages/nvidia`` the probe did not map (the packages'
   metadata stays);
3. runs the probe again and fails the build if it no longer works.

Usage: ``python slim_torch.py VENV``. Prints bytes before/after.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_PROBE = r"""
import json, os, socket
import torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.arange(4, dtype=torch.float32); dist.all_reduce(t)
m = torch.nn.Linear(8, 8); m(torch.randn(2, 8)).sum().backward()
dist.destroy_process_group()
maps = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(), "maps": sorted(maps)}))
"""


def _probe(python: str) -> dict:
    proc = subprocess.run([python, "-c", _PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"slim_torch: the torch probe failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def main(venv: str) -> None:
    python = str(Path(venv) / "bin" / "python")
    site = next(Path(venv).glob("lib/python3*/site-packages"))
    nvidia = site / "nvidia"
    before = _size(nvidia)
    mapped = {str(Path(p).resolve()) for p in _probe(python)["maps"]}
    for f in sorted(nvidia.rglob("*")):
        if (f.is_file() or f.is_symlink()) and str(f.resolve()) not in mapped:
            f.unlink()
    for d in sorted((d for d in nvidia.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    after = _probe(python)
    print(f"slim_torch: torch {after['torch']} (cuda available: {after['cuda']}); site-packages/nvidia "
          f"{before} -> {_size(nvidia)} bytes")


if __name__ == "__main__":
    main(sys.argv[1])
