"""Killed dev clusters' node arenas are swept by the next ``up`` (memory nothing else frees)."""

from pathlib import Path

from lifeline.devcluster._netclaim import sweep_stale_arenas


def test_only_arenas_of_clusters_that_no_longer_run_are_removed(tmp_path):
    def arena(name: str, owner: str | None) -> Path:
        d = tmp_path / name
        (d / "node-1").mkdir(parents=True)
        (d / "node-1" / "slot-0").write_bytes(b"\0" * 64)
        if owner is not None:
            (d / "owner").write_text(owner)
        return d

    dead, alive, unknown = arena("lifeline-0badc0de", "/state/dead"), arena("lifeline-600dc0de", "/state/alive"), \
        arena("lifeline-5ca1ab1e", None)
    claim = tmp_path / "lifeline-net-42"
    claim.mkdir()
    (claim / "owner").write_text("/state/dead")
    removed = sweep_stale_arenas(lambda state_dir: state_dir == Path("/state/alive"), root=tmp_path)
    assert removed == [dead] and not dead.exists()
    assert alive.exists() and unknown.exists() and claim.exists(), "a live, an unowned arena and a net claim stay"
