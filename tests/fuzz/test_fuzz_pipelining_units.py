"""``bench fuzz --model pipelining-moe``'s draws without running a job: determinism, validity, coverage of
the configurations examples/pipelining-moe supports and of the fault space, and the default model's draws
left as they were."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import random
from collections import Counter

import pytest
import torch

from lifeline.bench._chaos_schedule import FAULTS
from lifeline.bench._fuzz_draw import DRAWS, MAX_FAULTS, SHAPE_BLOCK, STEPS
from lifeline.bench._fuzz_draw import draw as draw_default
from lifeline.bench._fuzz_pipelining import SCRIPT, draw
from lifeline.bench.fuzz import MODELS, drawer, replay_command
from lifeline.errors import ConfigError
from lifeline.launch.spec import load_for_launch, trainer_argv

SEEDS = range(400)


def test_a_pipelining_trial_is_a_pure_function_of_its_seed():
    for seed in (0, 7, 12345):
        a, b = draw(seed, max_world=3), draw(seed, max_world=3)
        assert a.describe() == b.describe() and a.doc == b.doc and a.injections == b.injections


def test_seeds_of_one_block_share_a_shape_and_reference_and_differ_otherwise():
    trials = [draw(s, max_world=3) for s in range(6 * SHAPE_BLOCK)]
    for k in range(6):
        block = trials[k * SHAPE_BLOCK:(k + 1) * SHAPE_BLOCK]
        assert len({t.shape_key for t in block}) == 1
        assert len({json.dumps(t.reference_doc(), sort_keys=True) for t in block}) == 1
    assert len({json.dumps([t.spec, [str(i) for i in t.injections]], sort_keys=True) for t in trials}) == len(trials)
    assert len({t.shape_key for t in trials}) > 1


@pytest.mark.parametrize("max_world", [2, 3, 8])
def test_every_drawn_job_runs_the_example_script_with_a_layout_it_supports(max_world):
    for seed in SEEDS:
        t = draw(seed, max_world=max_world)
        job = load_for_launch(t.doc)  # raises on a setting lifeline run rejects
        argv = trainer_argv(job)
        assert argv[1:] == [str(SCRIPT)] and SCRIPT.is_file()
        assert t.spec["layout"] == {"tensor": 1, "pipeline": t.world, "data": 1, "expert": 1}
        assert 2 <= t.world <= min(3, max_world) and t.steps == STEPS
        assert "name" not in t.spec["model"]  # the script is the model: no gpt-moe checker
        args = t.spec["model"]["args"]
        assert args["schedule"] in ("gpipe", "1f1b") and 1 <= args["micro_batches"] <= 6
        if args["schedule"] == "1f1b":  # torch's Schedule1F1B refuses fewer micro-batches than stages
            assert args["micro_batches"] >= t.world
        assert "elastic" not in t.spec["recovery"]
        assert t.steps % t.spec["checkpoint"]["persist"]["every"] == 0  # the digest is the L2 state
        assert 1 <= len(t.injections) <= MAX_FAULTS
        for inj in t.injections:
            assert 1 <= inj.step < t.steps and 0 <= inj.rank < t.world
            if inj.kind == "flip" and inj.tier == "L2":
                assert inj.step > t.spec["checkpoint"]["persist"]["every"]
            elif inj.kind == "flip":
                assert inj.step > t.spec["checkpoint"]["every"]
        ref = t.reference_doc()
        load_for_launch(ref)
        assert ref["spec"]["model"] == t.spec["model"] and ref["spec"]["layout"] == t.spec["layout"]
        assert ref["spec"]["checkpoint"]["every"] == 1 and "sparse" not in ref["spec"]["checkpoint"]
        assert not ref["spec"]["recovery"].get("localizedReplay")


def test_the_pipelining_draws_cover_every_dimension_setting_fault_and_moment():
    seen: dict[str, Counter] = {}
    for seed in SEEDS:
        d = draw(seed, max_world=3).describe()
        for k in ("schedule", "every", "persist_every", "keep", "sparse_window", "localized_replay", "micro_batches"):
            seen.setdefault(k, Counter())[str(d[k])] += 1
        p = d["layout"]["pipeline"]
        seen.setdefault("stages", Counter())[p] += 1
        seen.setdefault("micro_vs_stages", Counter())[
            "fewer" if d["micro_batches"] < p else "more" if d["micro_batches"] > p else "equal"] += 1
        seen.setdefault("sparse_x_localized", Counter())[(d["sparse_window"] is None, d["localized_replay"])] += 1
        for f, m in zip(d["faults"], d["moments"]):
            kind = f.split(":")[0]
            seen.setdefault("faults", Counter())[f"flip:{f.split('tier=')[1][:2]}" if kind == "flip" else kind] += 1
            seen.setdefault("moments", Counter())[m] += 1
    assert set(seen["stages"]) == {2, 3}
    assert set(seen["schedule"]) == {"gpipe", "1f1b"}
    assert {"None", "2", "3", "4"} == set(seen["sparse_window"])
    assert set(seen["localized_replay"]) == {"True", "False"} and len(seen["sparse_x_localized"]) == 4
    assert {"1", "2", "3"} == set(seen["keep"]) and {"1", "2", "3"} == set(seen["every"])
    assert {"2", "3", "4", "6"} <= set(seen["persist_every"])
    assert {"fewer", "equal", "more"} == set(seen["micro_vs_stages"])
    assert set(seen["faults"]) == set(FAULTS)
    assert set(seen["moments"]) == {"random", "boundary", "last", "recovery"}


def test_the_default_models_draws_are_those_of_before():
    """Every regression seed of the reference model replays the same trial: the describe() of seeds
    0..63 at --max-world 8 and 4 under draw version 1 (without the ``compute_dtype`` version 2 added,
    float32 there), pinned when --model was added; the default drawer draws the newest version."""
    pins = {8: "a004785f621d8419554887c9b04ec398e91794a8c9b6d64b488a41a9df4029c7",
            4: "114252ce66b9b9187c3eb83921342e5cb8ee34a84ce77c5cf58695c7d22367a7"}
    for max_world, pin in pins.items():
        described = [draw_default(s, max_world=max_world, draws=1).describe() for s in range(64)]
        assert {d.pop("compute_dtype") for d in described} == {"float32"}
        got = json.dumps(described, sort_keys=True)
        assert hashlib.sha256(got.encode()).hexdigest() == pin
        assert drawer(MODELS[0], 1)(5, max_world=max_world) == draw_default(5, max_world=max_world, draws=1)
        assert drawer()(5, max_world=max_world).draws == DRAWS


def test_the_model_option_names_its_draws_and_its_replay_command():
    assert drawer("pipelining-moe") is draw
    with pytest.raises(ConfigError):
        drawer("llama")
    with pytest.raises(ConfigError):
        draw(0, max_world=1)
    assert replay_command(5, 3, model="pipelining-moe") == \
        "lifeline bench fuzz --seed 5 --trials 1 --max-world 3 --model pipelining-moe"
    assert replay_command(5) == "lifeline bench fuzz --seed 5 --trials 1"


def test_the_cli_rejects_an_unknown_model():
    from typer.testing import CliRunner

    from lifeline.bench.cli import app

    res = CliRunner().invoke(app, ["fuzz", "--model", "llama", "--trials", "1"])
    assert isinstance(res.exception, ConfigError) and "--model" in str(res.exception)


def test_the_example_takes_the_drawn_stages_and_micro_batches():
    spec = importlib.util.spec_from_file_location("pipelining_moe_example", SCRIPT)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    last = ex.build_stage(1, 0, stages=2)
    assert last.last and not last.first and hasattr(last, "head")
    assert ex.build_stage(1, 0).first is False and not ex.build_stage(1, 0).last  # default: 3 stages
    x, y = ex.batch(ex.corpus(), 3, 7, micro_batches=3)
    assert x.shape == y.shape == (3 * ex.MICRO_BATCH, ex.SEQ)
    assert torch.equal(ex.batch(ex.corpus(), 3, 7)[0], ex.batch(ex.corpus(), 3, 7, ex.MICRO_BATCHES)[0])
    assert set(ex.SCHEDULES) == {"gpipe", "1f1b"}


def _initial_state(ex, prior: int, seeded: bool) -> dict:
    """The initial state a new rank-2 process of the example snapshots (``StatefulTrainer``), in a
    process whose Python ``random`` started at ``prior`` (a fresh interpreter seeds it from urandom)."""
    from lifeline.runtime import StatefulTrainer

    random.seed(prior)
    if seeded:
        ex.seed_everything(7)
    module = ex.build_stage(2, 7)
    optim = torch.optim.AdamW(module.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)
    return StatefulTrainer({"model": module, "optim": optim, "sched": sched}, lambda i: None).initial_state()


def test_fuzz_seed_11_a_new_process_starts_from_the_same_initial_state():
    """Fuzz seed 11 (``--model pipelining-moe --max-world 3``): a Rollback to the initial state loaded, in a
    process started after the job began, another Python RNG state than the first process had (``rng.python``
    is in every checkpoint), and the verified restart failed on the blob size. The example seeds ``random``."""
    spec = importlib.util.spec_from_file_location("pipelining_moe_example", SCRIPT)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    state = random.getstate()
    try:
        a, b = _initial_state(ex, 1, seeded=False), _initial_state(ex, 2, seeded=False)
        assert a["rng.python"] != b["rng.python"]  # the bug: unseeded, two processes differ
        a, b = _initial_state(ex, 1, seeded=True), _initial_state(ex, 2, seeded=True)
    finally:
        random.setstate(state)
    assert a.keys() == b.keys()
    for k in a:
        assert (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]), k
    src = inspect.getsource(ex.main)
    assert 0 <= src.index("seed_everything(seed)") < src.index("build_stage(")
