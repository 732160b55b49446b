"""Verified recovery (issue 22 defect 4): RecoveryVerifier against a real Redis catalog.

The copy "saved before the failure" is sealed exactly as the sidecar seals it (``seal_shard`` over the
blob ``write_shard`` made) and filed in the catalog; the recomputed state is then compared with it.
The end-to-end case (``lifeline run``, a perturbed re-run caught and recovered from) is
tests/launch/test_recovery_copies.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from lifeline.catalog import Catalog
from lifeline.checkpoint import Layout, PatternRules, Sharded, plan_shard, seal_shard, write_shard
from lifeline.errors import VerificationError
from lifeline.runtime._verify import RecoveryVerifier, perturb_point

LAYOUT = Layout(data=2)
RULES = PatternRules([("w", Sharded(0))])


@dataclass
class _Ctx:
    """The part of a RuntimeContext the verifier reads (a unit-test double; the real one runs end to end)."""

    catalog: Catalog
    layout: Layout = LAYOUT
    rank: int = 1
    job: str = "verify"
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def report(self, event: str, *, record: bool = True, **fields: Any) -> None:
        self.reports.append((event, fields))


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(8, 5, generator=g), "b": torch.randn(7, generator=g, dtype=torch.float64),
            "rng": bytes(range(13))}


def _file(catalog: Catalog, step: int, state: dict[str, Any]) -> None:
    plan = plan_shard(state, LAYOUT, 1, RULES)
    blob = bytearray(plan.nbytes)
    write_shard(plan, state, blob)
    catalog.add_holding(step, 1, "L0", 1, seal_shard(plan, blob, job="verify", step=step).to_json())


@pytest.fixture
def catalog(redis_server):
    cat = Catalog(redis_server.url, "verify", 2)
    try:
        yield cat
    finally:
        cat.wipe()
        cat.close()


def test_the_first_recomputed_step_with_a_record_is_compared_and_equal_passes(catalog):
    for step in (4, 5, 6):
        _file(catalog, step, _state(step))
    ctx = _Ctx(catalog)
    verifier = RecoveryVerifier(ctx, RULES)
    verifier.arm(4, how="restore")  # the restored copy itself was verified as it was read
    assert verifier.pending == (5,) and not verifier.due(4) and verifier.due(5)
    verifier.check(5, _state(5))
    assert ctx.reports[-1][0] == "verified" and ctx.reports[-1][1]["restored"] == 4
    assert verifier.pending == () and not verifier.due(6)  # only the first one


@pytest.mark.parametrize("change", ["tensor", "bytes", "dtype"])
def test_a_recomputed_state_that_differs_is_a_verification_error_naming_the_entry(catalog, change):
    _file(catalog, 9, _state(9))
    ctx = _Ctx(catalog)
    verifier = RecoveryVerifier(ctx, RULES)
    verifier.arm(8, how="localized replay")
    state = _state(9)
    if change == "tensor":
        state["w"][3, 1] = torch.nextafter(state["w"][3, 1], torch.tensor(9.0))  # one ulp
    elif change == "bytes":
        state["rng"] = bytes(range(1, 14))
    else:
        state["b"] = state["b"].float()
    with pytest.raises(VerificationError, match="step 9 differs") as err:
        verifier.check(9, state)
    assert err.value.rank == 1 and err.value.step == 9
    event, fields = ctx.reports[-1]
    assert event == "verify_failed" and fields["restored"] == 8 and fields["recovery"] == "localized replay"
    assert fields["entries"] == {"tensor": ["w"], "bytes": ["rng"], "dtype": ["b"]}[change]


def test_a_window_restore_is_compared_only_once_the_window_is_whole(catalog):
    for step in (6, 7, 8, 9):
        _file(catalog, step, _state(step))
    verifier = RecoveryVerifier(_Ctx(catalog), RULES)
    verifier.arm(6, how="window restore", not_before=8)  # slots 6, 7, 8: whole from step 8 on
    assert verifier.pending == (8,)


def test_a_record_of_another_layout_or_rank_is_not_compared(catalog):
    _file(catalog, 5, _state(5))
    other = _Ctx(catalog, layout=Layout(data=1, pipeline=2))
    verifier = RecoveryVerifier(other, RULES)
    verifier.arm(4, how="restore")
    assert verifier.pending == ()


def test_the_perturbation_fault_fires_only_at_its_rank_step_and_generation(monkeypatch):
    state = _state(1)
    before = state["w"].clone()
    monkeypatch.setenv("LIFELINE_FAULT_PERTURB", "1:5")
    assert not perturb_point(2, 1, 5, lambda: state) and not perturb_point(1, 0, 5, lambda: state)
    assert not perturb_point(1, 1, 4, lambda: state) and torch.equal(state["w"], before)
    assert perturb_point(1, 1, 5, lambda: state) and not torch.equal(state["w"], before)
