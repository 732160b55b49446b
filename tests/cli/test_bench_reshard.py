"""``lifeline bench reshard`` at a tiny size: the JSON's shape, every peer loaded the right bytes, and the
reshard from memory read nothing from L2 (a behaviour check; timings are the benchmark's business)."""

from __future__ import annotations

import pytest

import json

from ._cli import run_cli

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

PEERS = {"memory", "l2", "dcp", "dcp_readahead"}
PEER_FIELDS = {"resume_s", "load_s", "needed_bytes", "read_bytes", "read_over_needed", "cpu_s"}


def test_bench_reshard_tiny_grow_reads_memory_only_from_the_sidecars(tmp_path):
    # 2 -> 3: the new ranks' boundaries cut the old chunks (partial reads), and the step is held at L0 and L1
    res = run_cli(["bench", "reshard", "--gib", "0.01", "--tensors", "4", "--repeats", "1", "--changes", "2:3",
                   "--state-dir", str(tmp_path / "state")], cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not res.leftovers, f"processes left running: {res.leftovers}"
    out = json.loads(res.stdout)
    assert out["benchmark"] == "reshard" and out["repeats"] == 1 and out["bytes"] > 0
    assert len(out["load_average_start"]) == 3 and len(out["load_average_end"]) == 3
    assert set(out["targets_met"]) == {"memory_at_least_5x_faster_than_dcp", "memory_read_within_1_05x_needed",
                                       "l2_read_within_1_05x_needed", "memory_read_nothing_from_l2"}
    assert all(isinstance(v, bool) for v in out["targets_met"].values())
    [row] = out["rows"]
    assert row["change"] == "tensor 2 -> 3" and row["to_layout"]["tensor"] == 3
    assert set(row["peers"]) == PEERS and set(row["samples_resume_s"]) == PEERS
    assert {"dcp_over_memory", "dcp_over_l2", "l2_over_memory"} <= set(row["ratios"])
    assert out["ratios"]["tensor 2 -> 3"] == row["ratios"]
    for name, peer in row["peers"].items():
        assert PEER_FIELDS <= set(peer), (name, sorted(peer))
        assert peer["resume_s"] >= peer["load_s"] > 0, (name, peer)
        assert peer["needed_bytes"] == out["bytes"], (name, peer)  # the new ranks together need the whole state
        assert peer["read_bytes"] >= peer["needed_bytes"], (name, peer)
    # every old rank's step was held in memory by its own sidecar and a peer's (L1) and committed to L2
    assert all({"L2"} < set(h) and any(n.startswith("L1@") for n in h) for h in row["save"]["holders"].values())
    memory, l2 = row["peers"]["memory"], row["peers"]["l2"]
    assert memory["l2_bytes_every_run"] == [0] and memory["bytes_by_tier"]["L2"] == 0
    assert memory["bytes_by_tier"]["L0"] > 0 and memory["bytes_by_tier"]["L1"] > 0
    assert memory["bytes_by_tier"]["L0"] + memory["bytes_by_tier"]["L1"] == memory["read_bytes"]
    assert l2["bytes_by_tier"]["L2"] == l2["read_bytes"] and out["targets_met"]["memory_read_nothing_from_l2"]
