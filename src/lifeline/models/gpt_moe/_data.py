"""A real text corpus available offline — the standard library's own ``.py`` sources — as byte tokens.

The corpus is the concatenation, in sorted path order, of every ``.py`` file under
``sysconfig.get_paths()["stdlib"]`` (``site-packages``/``dist-packages`` and ``__pycache__``
excluded), each followed by the end-of-document token, truncated to ``corpus_bytes``. The
loader is deterministic and seekable: its position is the step index, and the samples of a
step are a pure function of (seed, step, replica group).
"""

from __future__ import annotations

import functools
import json
import os
import sysconfig
import zlib
from pathlib import Path

import torch
from torch import Tensor

from lifeline.errors import ConfigError
from lifeline.models.gpt_moe._config import EOD_TOKEN

__all__ = ["stdlib_corpus", "StdlibLoader"]

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int, root: str | None = None) -> Tensor:
    """Token ids of the standard-library corpus, int16 ``(n,)`` with ``n <= max_bytes``.

    Bytes map to tokens ``0..255``; :data:`EOD_TOKEN` (256) ends each file. ``root`` defaults to
    the running interpreter's stdlib directory. Cached per process.

    Raises:
        ConfigError: the directory holds fewer than two sequences' worth of sources.
    """
    base = Path(root or sysconfig.get_paths()["stdlib"])
    chunks: list[Tensor] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if total >= max_bytes or not name.endswith(".py"):
                continue
            data = (Path(dirpath) / name).read_bytes()
            tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int16) if data else \
                torch.empty(0, dtype=torch.int16)
            chunks.append(tokens)
            chunks.append(torch.tensor([EOD_TOKEN], dtype=torch.int16))
            total += len(data) + 1
        if total >= max_bytes:
            break
    if total < 2:
        raise ConfigError(f"no Python sources found under {base}", field="corpus")
    return torch.cat(chunks)[:max_bytes]


class StdlibLoader:
    """Deterministic, seekable batches of ``(batch, seq_len + 1)`` int64 token windows.

    The corpus is cut into ``n = (len - 1) // seq_len`` non-overlapping windows of
    ``seq_len + 1`` tokens (inputs and shifted targets). Epoch ``e`` visits them in the order
    ``randperm(n)`` seeded with ``seed + e``. Step ``s`` of replica group ``replica`` (of
    ``replicas``) takes global samples ``s*G + replica*batch + j`` for ``j < batch`` with
    ``G = replicas*batch`` — every replica group reads its own disjoint slice of each step.

    ``position`` is the next step to read; :meth:`state`/:meth:`load_state` make it part of
    the checkpoint (JSON bytes, with a corpus digest so a different corpus is detected).
    """

    def __init__(self, corpus: Tensor, seq_len: int, batch: int, replica: int = 0, replicas: int = 1,
                 seed: int = 0) -> None:
        if not 0 <= replica < replicas:
            raise ConfigError(f"replica {replica} outside [0, {replicas})", field="replica")
        self.corpus = corpus
        self.seq_len, self.batch = seq_len, batch
        self.replica, self.replicas = replica, replicas
        self.seed = seed
        self.samples = (corpus.numel() - 1) // seq_len
        if self.samples < 1:
            raise ConfigError(f"corpus of {corpus.numel()} tokens has no window of {seq_len + 1}", field="seq_len")
        self.digest = zlib.crc32(corpus.numpy().tobytes())
        self.position = 0
        self._perm: tuple[int, Tensor] | None = None

    def _order(self, epoch: int) -> Tensor:
        if self._perm is None or self._perm[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = (epoch, torch.randperm(self.samples, generator=gen))
        return self._perm[1]

    def batch_at(self, step: int) -> Tensor:
        """The batch of ``step`` for this replica group, int64 ``(batch, seq_len + 1)``; pure."""
        rows = []
        first = step * self.replicas * self.batch + self.replica * self.batch
        for g in range(first, first + self.batch):
            index = int(self._order(g // self.samples)[g % self.samples])
            start = index * self.seq_len
            rows.append(self.corpus[start: start + self.seq_len + 1])
        return torch.stack(rows).long()

    def next(self) -> Tensor:
        """The batch at :attr:`position`, then advance the position by one step."""
        out = self.batch_at(self.position)
        self.position += 1
        return out

    def state(self) -> bytes:
        """JSON bytes ``{"position", "digest", "replica", "replicas"}`` for the checkpoint."""
        return json.dumps({"position": self.position, "digest": self.digest, "replica": self.replica,
                           "replicas": self.replicas}, sort_keys=True).encode()

    def load_state(self, data: bytes) -> None:
        """Seek to the checkpointed position. Raises :class:`ConfigError` on a different corpus."""
        state = json.loads(bytes(data))
        if state["digest"] != self.digest:
            raise ConfigError("checkpointed data-loader position is for a different corpus "
                              f"(digest {state['digest']} != {self.digest}); keep corpus_bytes and Python equal",
                              field="corpus_bytes")
        self.position = int(state["position"])
