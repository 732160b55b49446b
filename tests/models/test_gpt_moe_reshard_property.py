"""Invariant 2 on the reference model, as a property over layouts (issue 12): a trained GPT-MoE state
saved in layout A, loaded into layout B, saved again and consolidated is bit-identical to the state
consolidated straight from A: for every single-dimension change (tensor, pipeline, data, expert) up
and down, and for changes of several at once.

The state is a one-rank trainer's after two real optimizer steps (AdamW moments non-zero), spread
into A's ranks through the universal format: each rank of A or B is a real ``GPTMoETrainer`` built
for its coordinates, whose ``load_state`` takes what the loader gives it. No process group is needed
to build, load and save, so many layouts fit in one process.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifeline.checkpoint import Layout, MemoryStorage, consolidate, load, save_states
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules

CFG = GPTMoEConfig(corpus_bytes=1 << 16, d_model=32, d_expert=32, seq_len=16, micro_batch=2, micro_batches=2)
RULES = pattern_rules(CFG)
DEGREES = {"tensor": (1, 2, 4), "pipeline": (1, 2), "data": (1, 2, 3), "expert": (1, 2, 4)}
MAX_WORLD = 8


@pytest.fixture(scope="module")
def trained() -> dict:
    """The one-rank state after two optimizer steps (tensors and byte entries)."""
    t = GPTMoESpec(CFG).build(Layout(), 0)
    t.connect()
    for _ in range(2):
        t.train_step()
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in t.state().items()}


def _states(storage: MemoryStorage, step: int, layout: Layout) -> list[dict]:
    """Every rank of ``layout`` loaded from checkpoint ``step`` into a fresh trainer; their states."""
    out = []
    for rank in range(layout.world_size):
        trainer = GPTMoESpec(CFG).build(layout, rank)
        into = trainer.state()
        load(storage, "ck", "prop", step, layout, rank, RULES, into)
        trainer.load_state(into)
        out.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in trainer.state().items()})
    return out



@st.composite
def layout_pairs(draw) -> tuple[Layout, Layout]:
    """Two layouts of at most ``MAX_WORLD`` ranks: B differs from A in one dimension (half the cases)
    or in any number of them."""
    a = Layout(**{k: draw(st.sampled_from(v)) for k, v in DEGREES.items()})
    if a.world_size > MAX_WORLD:
        a = Layout(tensor=a.tensor, pipeline=a.pipeline, data=1, expert=1)
    if draw(st.booleans()):
        dim = draw(st.sampled_from(sorted(DEGREES)))
        b = Layout(**{**a.to_dict(), dim: draw(st.sampled_from([d for d in DEGREES[dim] if d != a.to_dict()[dim]]))})
    else:
        b = Layout(**{k: draw(st.sampled_from(v)) for k, v in DEGREES.items()})
    if b.world_size > MAX_WORLD:
        b = Layout(tensor=b.tensor, pipeline=b.pipeline, data=1, expert=1)
    return a, b


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=layout_pairs())
def test_save_in_a_load_in_b_consolidates_bit_identically(trained, pair):
    a, b = pair
    storage = MemoryStorage()
    save_states(storage, "ck", "prop", 1, Layout(), RULES, [trained])
    in_a = _states(storage, 1, a)
    save_states(storage, "ck", "prop", 2, a, RULES, in_a)
    in_b = _states(storage, 2, b)
    save_states(storage, "ck", "prop", 3, b, RULES, in_b)
    direct, via_b = consolidate(storage, "ck", "prop", 2), consolidate(storage, "ck", "prop", 3)
    assert direct.keys() == via_b.keys() == consolidate(storage, "ck", "prop", 1).keys()
    for k in direct:
        assert torch.equal(direct[k], via_b[k]), (a, b, k)
    moments = [k for k in direct if k.startswith("optim.exp_avg_sq.")]
    assert moments and any(torch.count_nonzero(direct[k]) for k in moments)  # a real optimizer state


@pytest.mark.parametrize("dim", sorted(DEGREES))
def test_every_single_dimension_up_and_down(trained, dim):
    """The property's explicit cases: each dimension from its smallest degree to its largest and back."""
    lo, hi = DEGREES[dim][0], DEGREES[dim][-1]
    storage = MemoryStorage()
    save_states(storage, "ck", "prop", 1, Layout(), RULES, [trained])
    small, large = Layout(**{dim: lo}), Layout(**{dim: hi})
    save_states(storage, "ck", "prop", 2, large, RULES, _states(storage, 1, large))
    save_states(storage, "ck", "prop", 3, small, RULES, _states(storage, 2, small))
    save_states(storage, "ck", "prop", 4, large, RULES, _states(storage, 3, large))
    first = consolidate(storage, "ck", "prop", 1)
    for step in (2, 3, 4):
        other = consolidate(storage, "ck", "prop", step)
        assert first.keys() == other.keys()
        for k in first:
            assert torch.equal(first[k], other[k]), (dim, step, k)
