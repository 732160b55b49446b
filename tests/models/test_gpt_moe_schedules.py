"""Pipeline schedules as data (``_pipeline_schedules.py``): model-checked against gloo's rendezvous semantics.

Every stage's op list is run by a small simulator in which a transfer completes only once the
neighbour has posted its complement (gloo's ``send`` waits for the matching ``recv``), the two
transfers of an :class:`Exchange` are posted together, and transfers on one channel must meet in
the same micro-batch order (gloo matches by source, first in first out). A deadlock or a crossed
pair fails the test; a control shows the simulator catches the deadlock of a naive 1F1B.
"""

from __future__ import annotations

import pytest

from lifeline.errors import ConfigError
from lifeline.models.gpt_moe import GPTMoEConfig, check
from lifeline.models.gpt_moe._pipeline_schedules import (BWD, FWD, Compute, Exchange, Op, peak_in_flight,
                                                schedule_ops)


class Deadlock(AssertionError):
    pass


def simulate(programs: list[list[Op]]) -> int:
    """Run every stage's ops to the end under rendezvous semantics; returns the rounds taken.
    Raises :class:`Deadlock` when no stage can move, AssertionError on a crossed pair."""
    pcs = [0] * len(programs)
    done: list[set[int]] = [set() for _ in programs]

    def current(s: int) -> Op | None:
        return programs[s][pcs[s]] if pcs[s] < len(programs[s]) else None

    rounds = 0
    while any(current(s) is not None for s in range(len(programs))):
        rounds += 1
        moved = False
        for s in range(len(programs)):
            while isinstance(current(s), Compute):
                pcs[s] += 1
                moved = True
        for s in range(len(programs)):
            op = current(s)
            if not isinstance(op, Exchange):
                continue
            for i, t in enumerate(op.transfers):
                if not t.send or i in done[s]:
                    continue
                peer = s + t.peer
                other = current(peer)
                if not isinstance(other, Exchange):
                    continue
                for j, u in enumerate(other.transfers):
                    if j not in done[peer] and not u.send and u.direction == t.direction:
                        assert u.micro_batch == t.micro_batch, f"crossed: stage {s} sends {t}, {peer} awaits {u}"
                        done[s].add(i)
                        done[peer].add(j)
                        moved = True
                        break
        for s in range(len(programs)):
            op = current(s)
            if isinstance(op, Exchange) and len(done[s]) == len(op.transfers):
                pcs[s] += 1
                done[s] = set()
                moved = True
        if not moved:
            raise Deadlock(f"stuck at {[current(s) for s in range(len(programs))]}")
    return rounds


def _programs(schedule: str, stages: int, micro_batches: int) -> list[list[Op]]:
    return [schedule_ops(schedule, stages, s, micro_batches) for s in range(stages)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_schedule_completes_under_rendezvous_semantics(schedule):
    checked = 0
    for stages in range(1, 9):
        for micro_batches in range(1, 13):
            programs = _programs(schedule, stages, micro_batches)
            simulate(programs)
            for stage, ops in enumerate(programs):
                computes = [(op.kind, op.micro_batch) for op in ops if isinstance(op, Compute)]
                assert [m for k, m in computes if k == FWD] == list(range(micro_batches))
                # the backwards in micro-batch order under both schedules: the same gradient sums
                assert [m for k, m in computes if k == BWD] == list(range(micro_batches))
                for m in range(micro_batches):
                    assert computes.index((FWD, m)) < computes.index((BWD, m))
                expected = micro_batches if schedule == "gpipe" else min(stages - stage, micro_batches)
                assert peak_in_flight(ops) == expected, (stages, stage, micro_batches)
                exchanges = [op for op in ops if isinstance(op, Exchange)]
                assert all(1 <= len(op.transfers) <= 2 for op in exchanges)
                assert all(len({t.peer for t in op.transfers}) == 1 for op in exchanges), "one neighbour each"
                checked += 1
    assert checked == 8 * 9 // 2 * 12


def _text(ops: list[Op]) -> list[str]:
    return [f"{op.kind}{op.micro_batch}" if isinstance(op, Compute) else
            "+".join(f"{'send' if t.send else 'recv'}-{t.direction}{t.micro_batch}" for t in op.transfers)
            for op in ops]


def test_1f1b_on_three_stages_follows_megatron():
    assert _text(schedule_ops("1f1b", 3, 0, 4)) == [
        "fwd0", "send-fwd0", "fwd1", "send-fwd1",  # two warm-up forwards
        "fwd2", "send-fwd2+recv-bwd0", "bwd0", "fwd3", "send-fwd3+recv-bwd1", "bwd1",  # 1F1B
        "recv-bwd2", "bwd2", "recv-bwd3", "bwd3"]  # two cool-down backwards
    assert _text(schedule_ops("1f1b", 3, 1, 4)) == [
        "recv-fwd0", "fwd0", "send-fwd0", "recv-fwd1",
        "fwd1", "send-fwd1+recv-bwd0", "bwd0", "send-bwd0+recv-fwd2",
        "fwd2", "send-fwd2+recv-bwd1", "bwd1", "send-bwd1+recv-fwd3",
        "fwd3", "send-fwd3+recv-bwd2", "bwd2", "send-bwd2",
        "recv-bwd3", "bwd3", "send-bwd3"]
    assert _text(schedule_ops("1f1b", 3, 2, 4)) == [
        "recv-fwd0", "fwd0", "bwd0", "send-bwd0+recv-fwd1", "fwd1", "bwd1", "send-bwd1+recv-fwd2",
        "fwd2", "bwd2", "send-bwd2+recv-fwd3", "fwd3", "bwd3", "send-bwd3"]


def test_the_simulator_catches_a_naive_1f1b_that_deadlocks():
    """Splitting each paired exchange into a blocking send, then a receive (no isend/irecv pair)
    deadlocks two neighbours that both send first: the check above has teeth."""
    def naive(ops: list[Op]) -> list[Op]:
        out: list[Op] = []
        for op in ops:
            if isinstance(op, Exchange) and len(op.transfers) == 2:
                out += [Exchange((t,)) for t in sorted(op.transfers, key=lambda t: not t.send)]
            else:
                out.append(op)
        return out

    simulate(_programs("1f1b", 2, 1))  # no steady round with two transfers: fine
    with pytest.raises(Deadlock):
        simulate([naive(ops) for ops in _programs("1f1b", 2, 3)])


def test_schedule_is_validated_naming_the_field():
    assert GPTMoEConfig().schedule == "gpipe"
    assert GPTMoEConfig(schedule="1f1b").validate().schedule == "1f1b"
    with pytest.raises(ConfigError) as err:
        GPTMoEConfig(schedule="pipedream").validate()
    assert err.value.field == "schedule" and "'gpipe', '1f1b'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check({"schedule": "interleaved"}, {"pipeline": 2})
    assert err.value.field == "args.schedule"
    with pytest.raises(ConfigError) as err:
        schedule_ops("zb-h1", 2, 0, 4)
    assert err.value.field == "schedule"
