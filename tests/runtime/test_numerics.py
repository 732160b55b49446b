"""The numerics check (docs/numerics.md): the detection rule, the re-run that tells a bad batch from a
faulty rank, the spec and the ``nan`` fault's launcher/trainer protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from pydantic import ValidationError

from lifeline.api import LossSpikeSpec, RecoverySpec
from lifeline.checkpoint import Layout
from lifeline.errors import ConfigError
from lifeline.launch import inject
from lifeline.launch._poison import nan_env
from lifeline.models.gpt_moe import GPTMoEConfig
from lifeline.models.gpt_moe._trainer import GPTMoETrainer, deterministic_cpu
from lifeline.runtime import _numerics
from lifeline.runtime._hooks import ChecksNumerics
from lifeline.runtime._numerics import (NAN, OK, SPIKE, FaultyRankError, NumericsGuard, SkippedStep, SpikeRule,
                                        parse_poison, verdict)

RULE = SpikeRule(factor=10.0, window=4)


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("loss, norm, want", [
    (2.5, 1.0, OK), (None, None, OK), (None, 3.0, OK),
    (math.nan, 1.0, NAN), (2.5, math.nan, NAN), (math.inf, 1.0, NAN), (2.5, -math.inf, NAN), (None, math.nan, NAN),
])
def test_non_finite_loss_or_gradient_norm_is_nan(loss, norm, want):
    assert verdict(loss, norm, [], RULE) == want


def test_a_spike_is_a_loss_above_factor_times_the_running_median_of_a_full_window():
    history = [100.0, 3.0, 2.0, 2.0, 4.0]  # the window is the last 4: median 2.5
    assert verdict(25.0, 1.0, history, RULE) == OK  # exactly factor x median: not above
    assert verdict(25.01, 1.0, history, RULE) == SPIKE
    assert verdict(25.01, 1.0, history[-3:], RULE) == OK  # fewer than `window` losses: no rule yet
    assert verdict(25.01, 1.0, history, None) == OK  # spike rule off: only non-finite values count
    assert verdict(None, 1.0, history, RULE) == OK  # a rank without a loss


def test_poison_env_parses_steps_and_transient_entries_and_ignores_garbage():
    assert parse_poison("5,9:transient, x ,") == {5: False, 9: True}
    assert parse_poison("") == {}


# ---------------------------------------------------------------- the re-run, on a fake trainer
@dataclass(frozen=True)
class Report:
    step: int
    loss: float | None
    tokens: int = 8
    seconds: float = 0.001


class Fake:
    """Loss of step s: ``losses[s]``; ``updates`` counts applied optimizer updates."""

    def __init__(self, losses: dict[int, float]) -> None:
        self.step, self.losses, self.updates, self.abandoned = 0, losses, [], 0
        self.before_update = None
        self._loss: float | None = None

    def train_step(self) -> Report:
        self._loss = self.losses.get(self.step + 1, 1.0)
        if self.before_update is not None:
            self.before_update()
        self.updates.append(self.step + 1)
        self.step += 1
        return Report(self.step, self._loss)

    def step_numerics(self):
        return self._loss, 0.5

    def abandon_step(self) -> None:
        self.abandoned += 1

    def skip_batch(self) -> None:
        self.step += 1


def guard(events: list, **kw) -> NumericsGuard:
    return NumericsGuard(lambda event, **f: events.append((event, f)), **kw)


def test_a_bad_batch_is_re_run_then_skipped_and_recorded():
    events: list = []
    g, t = guard(events, rule=RULE, poison={3: False}), Fake({})
    assert isinstance(t, ChecksNumerics)
    results = [g.train_step(t) for _ in range(5)]
    assert isinstance(results[2], SkippedStep) and results[2].step == 3 and results[2].loss is None
    assert t.updates == [1, 2, 4, 5] and t.step == 5 and t.abandoned == 2  # both tries stopped, no update
    assert events == [("skipped_batch", {"step": 3, "reason": "nan", "ranks": [0]})]
    assert g.checks == 6 and t.before_update is None  # the hook is the guard's during its step only


def test_a_loss_spike_that_recurs_is_a_bad_batch():
    events: list = []
    t = Fake({1: 3.0, 2: 2.0, 3: 2.0, 4: 2.0, 5: 2.0, 6: 50.0})
    g = guard(events, rule=RULE)
    for _ in range(7):
        g.train_step(t)
    assert 6 not in t.updates and t.step == 7
    assert events == [("skipped_batch", {"step": 6, "reason": "spike", "ranks": [0]})]
    assert 6 not in g.losses and g.history(8) == [2.0, 2.0, 2.0, 1.0]  # a skipped loss is not history


def test_a_transient_nan_is_a_faulty_rank_and_the_clean_re_run_is_kept(tmp_path):
    events: list = []
    g, t = guard(events, rule=RULE, poison={2: True}, marks=tmp_path), Fake({})
    for _ in range(3):
        g.train_step(t)
    assert t.updates == [1, 2, 3] and t.abandoned == 1
    assert events == [("faulty_rank", {"step": 2, "reason": "nan", "ranks": [0]})]
    # fired once per run: a restarted trainer re-running step 2 (the marker stays) finds it clean
    again, t = guard(events, rule=RULE, poison={2: True}, marks=tmp_path), Fake({})
    for _ in range(3):
        again.train_step(t)
    assert t.abandoned == 0 and (tmp_path / "nan-2").exists() and len(events) == 1


def test_a_faulty_rank_among_healthy_ones_fails_after_the_step():
    """Two ranks emulated: rank 1 (this one) alone flagged the first try; the re-run is clean."""
    events: list = []
    g = guard(events, rule=RULE, poison={1: True}, world=lambda: (1, 2))
    t = Fake({})
    with pytest.raises(FaultyRankError, match="faulty rank"):
        g.train_step(t)
    assert t.updates == [1] and events == [("faulty_rank", {"step": 1, "reason": "nan", "ranks": [1]})]


def test_a_configured_skip_skips_unchecked():
    events: list = []
    g, t = guard(events, skip_steps=[2]), Fake({})
    for _ in range(3):
        g.train_step(t)
    assert t.updates == [1, 3] and g.checks == 2
    assert events == [("skipped_batch", {"step": 2, "reason": "configured", "ranks": []})]


def test_the_guard_from_the_environment():
    assert NumericsGuard.from_env(print, {}).rule == SpikeRule()
    assert NumericsGuard.from_env(print, {_numerics.NUMERICS_ENV: '{"enabled": false}'}) is None
    g = NumericsGuard.from_env(print, {_numerics.NUMERICS_ENV: LossSpikeSpec(factor=4, window=3, skip_steps=[7])
                                       .model_dump_json(by_alias=True), _numerics.NAN_ENV: "5:transient"})
    assert (g.rule, g.skip_steps, g.poison) == (SpikeRule(4.0, 3), frozenset({7}), {5: True})


# ---------------------------------------------------------------- the reference trainer, bit for bit
CFG = dict(d_model=32, n_layers=2, n_heads=4, d_expert=32, seq_len=32, micro_batch=2, micro_batches=2,
           corpus_bytes=1 << 16)


def _train(steps: int, **kw) -> tuple[dict, list]:
    deterministic_cpu()
    trainer = GPTMoETrainer(GPTMoEConfig(**CFG), Layout(), 0)
    trainer.connect()
    events: list = []
    g = guard(events, **kw)
    for _ in range(steps):
        g.train_step(trainer)
    return {k: v.clone() if isinstance(v, torch.Tensor) else bytes(v) for k, v in trainer.state().items()}, events


def test_a_poisoned_batch_ends_bit_identical_to_a_run_that_skips_it():
    poisoned, events = _train(5, rule=RULE, poison={3: False})
    skipped, _ = _train(5, rule=RULE, skip_steps=[3])
    plain, _ = _train(5, rule=RULE)
    assert events == [("skipped_batch", {"step": 3, "reason": "nan", "ranks": [0]})]
    assert poisoned.keys() == skipped.keys()
    for k, v in poisoned.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, skipped[k]), k
            assert not v.is_floating_point() or bool(torch.isfinite(v).all()), k  # no NaN reached the weights
        else:
            assert v == skipped[k], k
    assert any(isinstance(v, torch.Tensor) and not torch.equal(v, plain[k]) for k, v in poisoned.items())


# ---------------------------------------------------------------- spec and fault
def test_loss_spike_spec_defaults_and_validation():
    spec = RecoverySpec().loss_spike
    assert (spec.enabled, spec.factor, spec.window, spec.skip_steps) == (True, 10.0, 20, [])
    got = RecoverySpec.model_validate({"lossSpike": {"factor": 3, "window": 5, "skipSteps": [9, 2, 9]}}).loss_spike
    assert (got.factor, got.window, got.skip_steps) == (3.0, 5, [2, 9])
    for bad in ({"factor": 1}, {"window": 0}, {"skipSteps": [0]}, {"spike": 1}):
        with pytest.raises(ValidationError):
            LossSpikeSpec.model_validate(bad)


def test_the_nan_fault_parses_and_reaches_its_rank_in_the_trainers_format(tmp_path):
    assert inject.NAN_ENV == _numerics.NAN_ENV and "nan" in inject.KINDS
    a = inject.parse_injection("nan:rank=1:step=4", world_size=2, steps=8)
    b = inject.parse_injection("nan:step=2:rank=1:transient=1", world_size=2, steps=8)
    assert (a.kind, a.rank, a.step, a.transient, a.holds, a.kills, a.loses_node) == ("nan", 1, 4, False, False, (), False)
    assert str(b) == "nan:rank=1:step=2:transient=1" and inject.hold_steps([a, b], 1) == ()
    env = nan_env([a, b, inject.Injection("trainer", 1, 5)], 1, tmp_path)
    assert parse_poison(env[_numerics.NAN_ENV]) == {2: True, 4: False} and nan_env([a], 0, tmp_path) == {}
    assert env[_numerics.NAN_DIR_ENV] == str(tmp_path / "holds" / "rank-1")  # the hold files' directory
    for text in ("nan:rank=1:step=4:when=recovery", "trainer:rank=1:step=4:transient=1", "nan:rank=1:step=4:transient=2"):
        with pytest.raises(ConfigError):
            inject.parse_injection(text, world_size=2, steps=8)
    # fires (for the summary) once the rank reported the step; no hold, no recovery needed
    pending = [a]
    assert inject.due(pending, {1: 3}, held=set()) == [] and inject.due(pending, {1: 4}, held=set()) == [a]


def test_the_spec_reaches_the_trainer_as_lifeline_numerics():
    """spec.recovery.lossSpike -> the pod's LIFELINE_NUMERICS -> TrainerSettings.numerics -> the guard."""
    from lifeline.api.load import load_trainingjob
    from lifeline.api.manifests import PodConfig, rank_pod
    from lifeline.api.pod import TrainerSettings

    doc = {"apiVersion": "lifeline.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j", "uid": "u"},
           "spec": {"replicas": 1, "layout": {}, "steps": 9, "recovery": {"lossSpike": {"factor": 3, "skipSteps": [4]}},
                    "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}}}}
    pod = rank_pod(load_trainingjob(doc), 0, generation=0, config=PodConfig(redis_url="redis://r:6379/0"))
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    raw = {e["name"]: e.get("value") for e in trainer["env"]}[_numerics.NUMERICS_ENV]
    settings = TrainerSettings.load(job="j", rank=0, world_size=1, secret="s" * 16, numerics=raw)
    g = NumericsGuard.from_env(print, {_numerics.NUMERICS_ENV: settings.numerics})
    assert (g.rule, g.skip_steps) == (SpikeRule(3.0, 20), frozenset({4}))
