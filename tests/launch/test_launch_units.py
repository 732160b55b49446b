"""Units of the launcher with real counterparts: the final-state digest, seeding a fresh catalog
(real Redis) from an L2 checkpoint so a sidecar can verify the stored blobs, per-tier steps."""

from __future__ import annotations

import json
import threading

import torch

from lifeline.checkpoint import (
    Layout,
    MemoryStorage,
    PatternRules,
    Replicated,
    Sharded,
    ShardMetadata,
    blob_key,
    read_manifest,
    save_states,
)
from lifeline.control import Holding
from lifeline.launch._observe import seed_l2_holdings, tier_steps
from lifeline.launch.summary import await_metas, checksum_digest, state_digest
from lifeline.catalog import Catalog


def test_state_digest_is_bit_exact_and_order_independent():
    a = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
    b = {"b": a["b"].clone(), "w": a["w"].clone()}
    assert state_digest(a) == state_digest(b)
    flipped = b["w"].clone()
    flipped.view(torch.int32)[1, 2] ^= 1  # one bit of one element
    assert state_digest({**b, "w": flipped}) != state_digest(a)
    assert state_digest({**b, "w": b["w"].to(torch.float64)}) != state_digest(a)  # dtype counts


def test_seeded_catalog_lets_stored_blobs_verify(redis_server):
    layout = Layout(tensor=2)
    rules = PatternRules([("w", Sharded(0))], default=Replicated())
    full = torch.arange(32, dtype=torch.float32).view(8, 4)
    states = [{"w": full[r * 4:(r + 1) * 4].clone(), "bias": torch.full((3,), 2.0), "rng": bytes([r]) * 7}
              for r in range(2)]
    storage = MemoryStorage()
    save_states(storage, "", "seedjob", 8, layout, rules, states)
    manifest = read_manifest(storage, "", "seedjob", 8)
    catalog = Catalog(redis_server.url, "seedjob", 2)
    try:
        seed_l2_holdings(catalog, manifest)
        for rank in range(2):
            assert catalog.holder_names(8, rank) == {"L2"}
            meta = ShardMetadata.from_json(catalog.meta(8, rank))
            blob = storage.get(blob_key("", "seedjob", 8, rank))
            assert meta.nbytes == len(blob) and meta.layout == layout and meta.rank == rank
            meta.verify(memoryview(blob))  # what the sidecar does before serving an L2 copy
        corrupt = bytearray(storage.get(blob_key("", "seedjob", 8, 1)))
        corrupt[0] ^= 0xFF
        try:
            ShardMetadata.from_json(catalog.meta(8, 1)).verify(memoryview(corrupt))
        except Exception as err:  # noqa: BLE001 - the checksum error type is the format's
            assert "checksum" in str(err).lower()
        else:
            raise AssertionError("a corrupt blob verified against the seeded metadata")
        metas = catalog.metas(8)
        digest = checksum_digest(metas)
        renamed = [json.dumps({**json.loads(m), "job": "another-job"}) for m in metas]
        assert checksum_digest(renamed) == digest  # the job's name is not part of the state
        changed = json.loads(metas[1])
        next(iter(changed["tensors"].values()))["chunks"][0][4] ^= 1  # one chunk's crc32c differs
        assert checksum_digest([metas[0], json.dumps(changed), *metas[2:]]) != digest
        assert checksum_digest([metas[0], None, *metas[2:]]) != digest  # a missing shard shows
    finally:
        catalog.wipe()
        catalog.close()


def test_the_final_digest_awaits_a_rank_whose_sidecar_files_its_last_save_after_the_trainers_finished(redis_server):
    """The sidecar files a save a moment after the trainer's save returned: digesting at once named
    that rank ``missing`` (a failure-free run's digest differed from an identical one's: stop 39's CI)."""
    catalog = Catalog(redis_server.url, "late-filing", 2)
    meta = {r: json.dumps({"rank": r, "tensors": {"w": {"chunks": [[[0], [4], 0, 16, 7 + r]]}}, "bytes": {}})
            for r in range(2)}

    class Asked:  # the real catalog; says when the digest first found rank 0 missing
        def __init__(self) -> None:
            self.missing = threading.Event()

        def metas(self, step: int) -> list:
            out = catalog.metas(step)
            if out[0] is None:
                self.missing.set()
            return out

    asked = Asked()
    try:
        catalog.add_holding(12, 1, "L0", 1, meta[1])
        late = threading.Thread(target=lambda: asked.missing.wait(30) and catalog.add_holding(12, 0, "L0", 0, meta[0]))
        late.start()
        metas = await_metas(asked, 12, 30.0)
        late.join()
        assert asked.missing.is_set() and metas == [meta[0], meta[1]]
        assert checksum_digest(metas) == checksum_digest(catalog.metas(12))
        # a rank that never files is reported missing once the wait is over (never a hang)
        assert await_metas(catalog, 13, 0.2) == [None, None]
    finally:
        catalog.wipe()
        catalog.close()


def test_tier_steps_needs_every_rank():
    h = {Holding(3, 0, "L0", 0), Holding(3, 1, "L0", 1), Holding(4, 0, "L0", 0), Holding(3, 0, "L1", 1),
         Holding(2, 0, "L2"), Holding(2, 1, "L2")}
    assert tier_steps(frozenset(h), 2) == {"L0": 3, "L1": None, "L2": 2}


def _await_ready(spare, timeout: float = 120.0) -> None:
    from lifeline._poll import wait_for

    wait_for(spare.ready, timeout, "the spare to finish its imports", 0.02)


def test_a_spare_becomes_the_assigned_python_command_with_its_env_log_and_exit_code(tmp_path):
    import os
    import sys

    from lifeline.launch.env import ProcessSpec
    from lifeline.launch.spare_pool import Spare

    script = tmp_path / "container.py"
    script.write_text("import os, sys, json\n"
                      "print(json.dumps({'x': os.environ.get('LIFELINE_X'), 'inherited': os.environ.get('ONLY_SPARE'),"
                      " 'argv': sys.argv[1:], 'json_loaded': 'json' in sys.modules}))\n"
                      "sys.exit(3)\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    spare = Spare.start("node-0", "trainer", {**base, "ONLY_SPARE": "1"}, tmp_path / "spare.log", modules=["json"])
    try:
        _await_ready(spare)
        proc = spare.assign(ProcessSpec((sys.executable, str(script), "a", "b"), {**base, "LIFELINE_X": "rank-env"}),
                            tmp_path / "trainer.log")
        assert proc.wait(timeout=60) == 3  # the container's exit code is the process's
    finally:
        spare.stop()
    lines = [json.loads(line) for line in (tmp_path / "trainer.log").read_text().splitlines() if line.startswith("{")]
    assert lines[0]["event"] == "spare_assigned" and lines[0]["pid"] == proc.pid
    # exactly the assigned environment (nothing the spare was started with), the container's argv
    assert lines[1] == {"x": "rank-env", "inherited": None, "argv": ["a", "b"], "json_loaded": True}


def test_a_spare_assigned_while_still_importing_runs_the_assignment(tmp_path):
    """The launcher closes its end of the spare's stdout on assignment; a spare still importing
    then writes its ready line into a closed pipe and must go on (it used to die of
    BrokenPipeError, exit 1: a second recovery for nothing)."""
    import os
    import sys

    from lifeline.launch.env import ProcessSpec
    from lifeline.launch.spare_pool import Spare

    script = tmp_path / "container.py"
    script.write_text("import sys\nprint('assigned ran')\nsys.exit(0)\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    spare = Spare.start("node-0", "trainer", base, tmp_path / "spare.log", modules=["torch"])
    try:
        assert not spare.ready()  # importing torch takes seconds: the assignment comes first
        proc = spare.assign(ProcessSpec((sys.executable, str(script)), base), tmp_path / "trainer.log")
        assert proc.wait(timeout=120) == 0, (tmp_path / "spare.log").read_text()[-2000:]
    finally:
        spare.stop()
    assert "assigned ran" in (tmp_path / "trainer.log").read_text()
    assert "spare_ready" not in (tmp_path / "trainer.log").read_text()


def test_a_spare_runs_python_modules_in_process_and_execs_other_commands(tmp_path):
    import os
    import sys

    from lifeline.launch.env import ProcessSpec
    from lifeline.launch.spare_pool import Spare

    (tmp_path / "in.json").write_text('{"b": 1, "a": [2]}')
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    module = Spare.start("node-0", "trainer", base, tmp_path / "s1.log", modules=["json"])
    shell = Spare.start("node-1", "sidecar", base, tmp_path / "s2.log", modules=[])
    try:
        _await_ready(module)
        _await_ready(shell)
        p1 = module.assign(ProcessSpec((sys.executable, "-m", "json.tool", "--sort-keys", str(tmp_path / "in.json")),
                                       base), tmp_path / "m.log")
        p2 = shell.assign(ProcessSpec(("/bin/sh", "-c", "echo sh:$LIFELINE_Y; exit 4"), {**base, "LIFELINE_Y": "y"}),
                          tmp_path / "sh.log")
        assert p1.wait(timeout=60) == 0 and p2.wait(timeout=60) == 4
    finally:
        module.stop()
        shell.stop()
    text = (tmp_path / "m.log").read_text()
    assert json.loads(text[text.index("\n{") + 1:]) == {"a": [2], "b": 1}
    assert (tmp_path / "sh.log").read_text().splitlines()[-1] == "sh:y"


def test_a_spare_pool_fills_one_at_a_time_and_hands_out_spares_by_node_and_role(tmp_path, monkeypatch):
    import os

    import lifeline.launch.spare_pool as spares

    monkeypatch.setattr(spares, "PRELOAD", {"trainer": ("json",), "sidecar": ("json",)})  # light spares
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    pool = spares.SparePool({"trainer": base, "sidecar": base}, tmp_path)
    wanted = [("node-0", "trainer", 1), ("node-4", "sidecar", 1), ("node-4", "trainer", 1)]
    try:
        first = pool.fill(wanted)
        assert first is not None and (first.node, first.role) == ("node-0", "trainer")
        assert pool.fill(wanted) is None  # one at a time: the first is still importing
        _await_ready(first)
        second = pool.fill(wanted)
        assert (second.node, second.role) == ("node-4", "sidecar")
        assert pool.take("node-1", "trainer") is None
        assert pool.take("node-0", "trainer") is first and pool.take("node-0", "trainer") is None
        first.stop()
        _await_ready(second)
        pool.fill([("node-0", "trainer", 1)])  # node-4 is no longer wanted: its spare is stopped
        assert second.proc.poll() is not None
        assert {(s.node, s.role) for s in pool.spares} == {("node-0", "trainer")}
    finally:
        pool.close()
    assert pool.spares == [] and pool.pids() == []


def test_the_supervisor_rides_out_a_catalog_outage_then_fails_naming_it(tmp_path):
    import socket

    import pytest

    from lifeline.errors import CatalogError
    from lifeline.launch.spec import load_for_launch
    from lifeline.launch.supervisor import CATALOG_OUTAGE_SECONDS, LaunchOptions, Supervisor

    from ._jobs import job_doc

    with socket.socket() as s:  # a port nobody listens on: Redis is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sup = Supervisor(load_for_launch(job_doc("outage")), LaunchOptions(state_dir=tmp_path))
    sup.catalog = Catalog(f"redis://127.0.0.1:{port}", "outage", 4)
    try:
        assert sup._read_catalog(1000.0) is None  # one missed round is retried, not fatal
        assert sup._read_catalog(1000.0 + CATALOG_OUTAGE_SECONDS / 2) is None
        with pytest.raises(CatalogError):
            sup._read_catalog(1000.0 + CATALOG_OUTAGE_SECONDS + 1)
        assert any("catalog unavailable" in e for e in sup.snapshot.events)
    finally:
        sup.catalog.close()
