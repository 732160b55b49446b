"""MoEvement's sparse-checkpoint window schedule (lifeline.checkpoint, planned in every rank)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lifeline.checkpoint import (
    Operator,
    SlotCost,
    WindowSchedule,
    agree_window,
    budget_bytes,
    needs_replan,
    plan_window,
    with_window,
)
from lifeline.errors import ConfigError


def experts(n: int, params: int = 100, layer: int = 0) -> list[Operator]:
    return [Operator(f"l{layer}.e{i}", params, "expert", layer, 10 * i) for i in range(n)]


def slot_bytes(schedule: WindowSchedule, i: int, c: int) -> int:
    """The definition, computed from names: 12 B/param ACTIVE + c B/param for every later operator."""
    p = {op.name: op.params for op in schedule.operators}
    later = [n for j, s in enumerate(schedule.slots) if j > i for n in s]
    return 12 * sum(p[n] for n in schedule.slots[i]) + c * sum(p[n] for n in later)


def most_expensive_with(ordered: list[Operator], k: int, c: int) -> int:
    n = len(ordered)
    return max(12 * sum(o.params for o in ordered[a:a + k]) + c * sum(o.params for o in ordered[a + k:])
               for a in range(0, n, k))


operators = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 50), st.sampled_from(["expert", "expert", "router", "dense"])),
    min_size=1, max_size=24,
).map(lambda rows: [Operator(f"op{i:02d}", p, kind, None if kind == "dense" else 0, a if kind == "expert" else 0)
                    for i, (p, a, kind) in enumerate(rows)])


# --- ordering ---------------------------------------------------------------------------------


def test_least_popular_expert_first_routers_and_dense_last():
    ops = [
        Operator("dense", 5000, "dense"),
        Operator("l0.router", 50, "router", 0),
        Operator("l0.e2", 100, "expert", 0, 30),
        Operator("l0.e0", 100, "expert", 0, 900),
        Operator("l1.e1", 100, "expert", 1, 30),  # tie on 30 tokens: by name
        Operator("l0.e1", 100, "expert", 0, 7),
        Operator("a.router", 50, "router", 1),
    ]
    s = plan_window(ops, budget_bytes=10**9)
    assert s.window == 1
    assert s.order == ("l0.e1", "l0.e2", "l1.e1", "l0.e0", "a.router", "l0.router", "dense")
    assert s.slots == (s.order,)


def test_popularity_decides_the_slot_not_input_order():
    ops = experts(8)
    s = plan_window(reversed(ops), budget_bytes=12 * 100 + 4 * 700)  # one ACTIVE per slot
    assert [s.active_slot(f"l0.e{i}") for i in range(8)] == list(range(8))


# --- sizing -----------------------------------------------------------------------------------


def test_largest_k_that_fits_and_exact_slot_bytes():
    ops = experts(8)
    fits_two = 12 * 200 + 4 * 600  # slot 0 with k = 2: 4800 bytes
    s = plan_window(ops, budget_bytes=fits_two)
    assert (s.window, [len(x) for x in s.slots]) == (4, [2, 2, 2, 2])
    assert [s.bytes_at(i) for i in range(4)] == [4800, 4000, 3200, 2400]
    assert s.max_slot_bytes == 4800 and not s.over_budget
    assert plan_window(ops, budget_bytes=fits_two - 1).window == 8
    assert plan_window(ops, budget_bytes=12 * 800).window == 1


def test_uneven_last_slot():
    s = plan_window(experts(10), budget_bytes=12 * 400 + 4 * 600)  # k = 4: W = ceil(10 / 4)
    assert [len(x) for x in s.slots] == [4, 4, 2]


def test_bf16_compute_weights_fit_more_per_slot():
    ops, budget = experts(16), 12 * 300 + 4 * 1300
    assert plan_window(ops, budget_bytes=budget, compute_bytes_per_param=2).window < plan_window(
        ops, budget_bytes=budget).window


def test_a_later_big_slot_counts_too():
    # dense (1000 params) goes last: ACTIVE alone it costs 12 000 B, more than slot 0 ever does
    ops = [*experts(4), Operator("dense", 1000, "dense")]
    s = plan_window(ops, budget_bytes=11_000)
    assert s.over_budget and s.window == 5 and s.max_slot_bytes == 12_000 == s.bytes_at(4)


def test_over_budget_still_checkpoints_one_operator_per_step():
    ops = experts(3, params=1000)
    s = plan_window(ops, budget_bytes=100)
    assert s.over_budget and s.window == 3
    assert sorted(n for slot in s.slots for n in slot) == sorted(o.name for o in ops)


@settings(max_examples=150, deadline=None)
@given(operators, st.integers(1, 400_000), st.sampled_from([2, 4]))
def test_schedule_invariants(ops, budget, c):
    s = plan_window(ops, budget_bytes=budget, compute_bytes_per_param=c)
    names = [n for slot in s.slots for n in slot]
    assert sorted(names) == sorted(o.name for o in ops)  # every operator ACTIVE exactly once
    assert s.window == len(s.slots) and all(s.slots)
    k = len(s.slots[0])
    assert all(len(x) == k for x in s.slots[:-1]) and s.window == -(-len(ops) // k)
    for i in range(s.window):
        assert s.bytes_at(i) == slot_bytes(s, i, c)
        assert set(s.frozen(i)) == {n for n in names if s.active_slot(n) > i}
        if i:
            assert set(s.frozen(i)) < set(s.frozen(i - 1)) or not s.frozen(i - 1)
    assert s.frozen(s.window - 1) == ()
    assert s.over_budget == (s.max_slot_bytes > budget)
    ordered = list(s.operators)
    if s.over_budget:  # no k fits at all
        assert k == 1 and all(most_expensive_with(ordered, j, c) > budget for j in range(1, len(ops) + 1))
    else:  # k fits and no larger k does
        assert all(most_expensive_with(ordered, j, c) > budget for j in range(k + 1, len(ops) + 1))


@settings(max_examples=100, deadline=None)
@given(operators, st.integers(1, 200_000), st.integers(0, 200_000))
def test_larger_budget_never_lengthens_the_window(ops, budget, more):
    assert plan_window(ops, budget_bytes=budget + more).window <= plan_window(ops, budget_bytes=budget).window


# --- one W for every rank ---------------------------------------------------------------------


def test_agree_window_is_the_max():
    assert agree_window([3, 7, 5]) == 7
    assert agree_window((1,)) == 1


def test_with_window_spreads_the_same_order():
    s = plan_window(experts(10), budget_bytes=12 * 400 + 4 * 600)  # W = 3
    t = with_window(s, 4)
    assert t.window == 4 and t.order == s.order
    assert [len(x) for x in t.slots] == [2, 2, 3, 3]
    assert with_window(s, s.window) is s
    assert with_window(s, 4) == t  # deterministic
    wide = with_window(s, 13)
    assert [len(x) for x in wide.slots] == [1] * 10 + [0] * 3
    assert wide.frozen(12) == () and wide.bytes_at(12) == 0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(0, 30))
def test_stretching_uniform_operators_stays_within_the_planned_bytes(n, k, extra):
    s = plan_window(experts(n), budget_bytes=12 * 100 * k + 4 * 100 * (n - min(k, n)))
    t = with_window(s, s.window + extra)
    assert [name for x in t.slots for name in x] == list(s.order)
    sizes = [len(x) for x in t.slots]
    assert max(sizes) <= len(s.slots[0])
    if extra:  # balanced, the bigger slots (or the empty ones) last
        assert max(sizes) - min(sizes) <= 1
        assert sizes == (sorted(sizes) if n >= t.window else sorted(sizes, reverse=True))
    assert t.max_slot_bytes <= s.max_slot_bytes and not t.over_budget


def test_budget_bytes():
    assert budget_bytes(0.5, 2e9) == 1_000_000_000
    assert budget_bytes(0.1, 1001) == 100


# --- re-planning (MoEvement: >= 25 % of experts changed by > 10 %, or step time by > 10 %) ----


FOUR = {"a": 100, "b": 100, "c": 100, "d": 100}


@pytest.mark.parametrize(
    ("counts", "replan"),
    [
        ({**FOUR, "a": 110}, False),  # exactly 10 %: not a change
        ({**FOUR, "a": 90}, False),
        ({**FOUR, "a": 111}, True),  # 1 of 4 experts = 25 %
        ({**FOUR, "a": 89}, True),
        (FOUR, False),
        ({**FOUR, "e": 5}, False),  # a new expert counts as changed: 1 of 5 = 20 %
        ({**FOUR, "e": 5, "f": 5}, True),  # 2 of 6
    ],
)
def test_replan_expert_threshold(counts, replan):
    assert needs_replan(FOUR, counts, 10.0, 10.0) is replan


def test_replan_needs_a_quarter_of_the_experts():
    eight = {f"e{i}": 50 for i in range(8)}
    one = {**eight, "e0": 80}
    two = {**one, "e1": 0}
    assert not needs_replan(eight, one, 1.0, 1.0)  # 12.5 %
    assert needs_replan(eight, two, 1.0, 1.0)  # 25 %
    assert needs_replan({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 0, "c": 0}, 1.0, 1.0)  # 0 -> 1 changed
    assert not needs_replan({"a": 0}, {"a": 0}, 1.0, 1.0)
    assert needs_replan({"a": 5, "b": 5}, {"a": 5}, 1.0, 1.0)  # an expert gone counts as changed


@pytest.mark.parametrize(("before", "after", "replan"),
                         [(10.0, 11.0, False), (10.0, 9.0, False), (10.0, 11.001, True), (10.0, 8.999, True)])
def test_replan_step_time_threshold(before, after, replan):
    assert needs_replan({}, {}, before, after) is replan
    assert needs_replan(FOUR, FOUR, before, after) is replan


# --- bad input names the field ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: plan_window([], budget_bytes=10), "operators"),
        (lambda: plan_window([*experts(2), *experts(1)], budget_bytes=10), "operators"),
        (lambda: plan_window(experts(2), budget_bytes=0), "budget_bytes"),
        (lambda: plan_window(experts(2), budget_bytes=-5), "budget_bytes"),
        (lambda: plan_window(experts(2), budget_bytes=10, compute_bytes_per_param=0), "compute_bytes_per_param"),
        (lambda: SlotCost(13), "compute_bytes_per_param"),
        (lambda: Operator("x", -1, "expert", 0, 0), "params"),
        (lambda: Operator("x", 1, "expert", 0, -3), "activations"),
        (lambda: Operator("x", 1, "attention"), "kind"),
        (lambda: Operator("", 1, "dense"), "name"),
        (lambda: plan_window(experts(2), budget_bytes=10).active_slot("nope"), "name"),
        (lambda: plan_window(experts(2), budget_bytes=10**6).frozen(1), "slot"),
        (lambda: plan_window(experts(2), budget_bytes=10**6).bytes_at(-1), "slot"),
        (lambda: with_window(plan_window(experts(4), budget_bytes=10), 2), "window"),
        (lambda: agree_window([]), "windows"),
        (lambda: agree_window([2, 0]), "windows"),
        (lambda: budget_bytes(0.0, 1e9), "step_seconds"),
        (lambda: budget_bytes(1.0, -1.0), "copy_bytes_per_second"),
        (lambda: needs_replan({"a": -1}, {"a": 1}, 1.0, 1.0), "previous_counts"),
        (lambda: needs_replan({}, {}, 0.0, 1.0), "previous_step_seconds"),
        (lambda: WindowSchedule((("b",), ("a",)), tuple(experts(1)), 10), "slots"),
    ],
)
def test_bad_input_raises_config_error_naming_the_field(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field and field in str(err.value)
