"""The reshard bench's ranks of the new layout: long-lived processes (one gloo group of the new world,
formed once) that load their new shard on command, by one of three peers, then run one all_reduce.

Run as ``python -m lifeline.bench._reshard_target CONFIG_JSON``. Commands arrive on stdin, one JSON
object a line; answers go to stdout as lines starting with :data:`TAG`:

* ``{"op": "prep"}`` — fill the new shard's tensors with NaN (untimed); answers ``{"op": "prepped"}``.
* ``{"op": "go", "peer": P}`` — load by peer ``P`` (``memory``: :meth:`SidecarCheckpointer.restore`,
  which reshards from the sidecars holding the step; ``l2``: :func:`lifeline.checkpoint.load` from
  MinIO, the restore's L2 fallback; ``dcp``: ``torch.distributed.checkpoint.load`` of the DTensors
  saved in the old mesh into the new mesh, from MinIO), then ``all_reduce`` one float over the new
  world; answers ``t_loaded``/``t_resumed`` (``time.monotonic()`` after the load / after the
  all_reduce), ``needed_bytes``, ``read_bytes``, ``bytes_by_tier`` (ours) and ``equal`` (after the
  clock stopped: the crc32c of every tensor of the new shard equals that of the expected values,
  computed once at start, so the rank does not hold a second copy of its shard).
* ``{"op": "quit"}``.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time
from typing import Any

import torch

from lifeline.bench._reshard_source import RULES, StateSpec, join_group, layout_of, shard

__all__ = ["TAG", "target_rank"]

TAG = "@@reshard "


def _say(msg: dict[str, Any]) -> None:
    sys.stdout.write(TAG + json.dumps(msg) + "\n")
    sys.stdout.flush()


class _Peers:
    """The three ways a rank of the new layout loads its shard (same buffers for all)."""

    def __init__(self, cfg: dict, into: dict[str, torch.Tensor]) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        from lifeline.api.pod import TrainerSettings
        from lifeline.runtime import SidecarCheckpointer

        self.cfg, self.into = cfg, into
        self.rank, self.world, self.step = cfg["rank"], cfg["world"], cfg["step"]
        self.layout = layout_of(self.world)
        self.settings = TrainerSettings(**cfg["settings"])
        self.checkpointer = SidecarCheckpointer(self.settings, self.layout, RULES)
        mesh = init_device_mesh("cpu", (self.world,))
        self.targets = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False) for k, v in into.items()}
        self.needed = sum(v.numel() * v.element_size() for v in into.values())

    def memory(self) -> dict[str, Any]:
        self.checkpointer.restore(self.step, into=self.into)
        rep = self.checkpointer.last_reshard
        if rep is None:
            raise RuntimeError("SidecarCheckpointer.restore did not reshard: the catalog lacks the saved layout")
        return {"needed_bytes": rep.needed_bytes, "read_bytes": sum(rep.bytes_by_tier.values()),
                "bytes_by_tier": rep.bytes_by_tier, "local_bytes": rep.local_bytes, "fallbacks": len(rep.fallbacks)}

    def l2(self) -> dict[str, Any]:
        from lifeline.checkpoint import StorageOptions, load, storage_from_uri

        s = self.settings
        storage, prefix = storage_from_uri(s.persist_uri, StorageOptions(
            endpoint=s.s3_endpoint, access_key=s.s3_access_key, secret_key=s.s3_secret_key.get_secret_value(),
            secure=s.s3_secure))
        rep = load(storage, prefix, s.job, self.step, self.layout, self.rank, RULES, self.into)
        return {"needed_bytes": rep.needed_bytes, "read_bytes": rep.read_bytes,
                "bytes_by_tier": {"L0": 0, "L1": 0, "L2": rep.read_bytes}, "fallbacks": len(rep.fallbacks)}

    def dcp(self, cache: str = "blockcache") -> dict[str, Any]:
        import fsspec
        import torch.distributed.checkpoint as dcp

        from lifeline.bench import _dcp_s3

        fsspec.get_filesystem_class("lminio").read_cache = cache
        _dcp_s3.FETCHED[0] = 0
        dcp.load(self.targets, storage_reader=dcp.FsspecReader(self.cfg["dcp"]))
        return {"needed_bytes": self.needed, "read_bytes": _dcp_s3.FETCHED[0]}

    def dcp_readahead(self) -> dict[str, Any]:
        return self.dcp("readahead")


def _crcs(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """crc32c of every tensor's bytes."""
    from lifeline.checkpoint import crc32c

    return {k: crc32c(memoryview(v.contiguous().view(-1).view(torch.uint8).numpy())) for k, v in state.items()}


def _profile(fn) -> tuple[dict[str, Any], list[str]]:
    prof = cProfile.Profile()
    out = prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    return out, buf.getvalue().splitlines()[-40:]


def target_rank(cfg: dict) -> None:
    """Serve commands (module docstring) as rank ``cfg["rank"]`` of the new layout (tensor degree
    ``cfg["world"]``): gloo group on ``cfg["port"]``, expected values from ``cfg["spec"]``.

    Raises:
        RuntimeError: the memory peer did not reshard (the catalog lacks the saved layout).
    """
    import torch.distributed as dist


    rank, world = join_group(cfg)
    try:
        expected = shard(StateSpec(**cfg["spec"]), world, rank)
        want = _crcs(expected)
        into = {k: torch.empty_like(v) for k, v in expected.items()}
        del expected
        peers = _Peers(cfg, into)
        one = torch.ones(1)
        _say({"op": "ready", "rank": rank})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "prep":
                for t in into.values():
                    t.fill_(float("nan"))
                _say({"op": "prepped"})
                continue
            fn = getattr(peers, cmd["peer"])
            profile = None
            if cmd.get("profile"):
                res, profile = _profile(fn)
            else:
                res = fn()
            t_loaded = time.monotonic()
            one.fill_(1.0)
            dist.all_reduce(one)  # training resumes: one collective over the new world
            t_resumed = time.monotonic()
            equal = float(one) == world and _crcs(into) == want
            _say({"op": "done", "peer": cmd["peer"], "rank": rank, "t_loaded": t_loaded, "t_resumed": t_resumed,
                  "equal": equal, **res, **({"profile": profile} if profile else {})})
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    target_rank(json.loads(sys.argv[1]))
