"""The ``torch.distributed.pipelining`` adapter (``lifeline.runtime.Pipeline``/``PipelineTrainer``).

Real ranks: the 3-stage MoE of examples/pipelining-moe under ``Schedule1F1B`` and ``ScheduleGPipe``
over gloo, one process per stage (``_pipelining_worker.py``). Each stage logs what it sends; then each stage alone replays
the last step from its neighbours' logged tensors (activations, gradients, and the stages'
gradient sums of squares of the global-norm clipping), once interrupted part-way (a missing entry, then
``abandon_step``) and once whole, and must end bit-identical to the live step: parameters, AdamW
state, LR scheduler, loss, and the entries it logs again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # multi-rank torch runs (docs/testing.md): ~15 s

WORKER = Path(__file__).with_name("_pipelining_worker.py")
STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pipelining")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(out), str(STEPS)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(3)]
    try:
        outputs = [p.communicate(timeout=240)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{outputs[r][-3000:]}"
    return {"refused": torch.load(out / "refused-1.pt"),
            **{sched: [{"live": torch.load(out / f"{sched}-rank-{r}.pt"),
                        "replay": torch.load(out / f"{sched}-replay-{r}.pt")} for r in range(3)]
               for sched in ("1f1b", "gpipe")}}


def _same(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]


@pytest.fixture(params=["1f1b", "gpipe"])
def ranks(runs, request) -> list[dict]:
    return runs[request.param]


def test_every_stage_logs_each_micro_batch_it_sends_downstream_and_upstream(ranks):
    keys = [set(r["live"]["log"]) for r in ranks]
    mbs = range(4)
    norms = {(s, 0, "norm") for s in range(STEPS)}
    assert keys[0] == {(s, m, "fwd") for s in range(STEPS) for m in mbs} | norms
    assert keys[1] == {(s, m, d) for s in range(STEPS) for m in mbs for d in ("fwd", "bwd")} | norms
    assert keys[2] == {(s, m, "bwd") for s in range(STEPS) for m in mbs} | norms
    assert ranks[0]["live"]["log"][(0, 0, "fwd")].shape == (2, 16, 32)
    assert ranks[2]["live"]["log"][(1, 3, "bwd")].dtype == torch.float32


def test_a_stage_without_static_shapes_or_gradient_flags_is_refused(runs):
    no_shapes, no_grads = runs["refused"]
    assert "input_args and output_args" in no_shapes
    assert "requires_grad=True" in no_grads


def test_every_stage_logs_the_same_gradient_sums_of_squares_and_the_clip_is_active(ranks):
    for step in range(STEPS):
        (a, b, c) = (r["live"]["log"][(step, 0, "norm")] for r in ranks)
        assert a.dtype == torch.float64 and a.shape == (3,) and torch.equal(a, b) and torch.equal(b, c)
    norms = [float(ranks[0]["live"]["log"][(s, 0, "norm")].sum().sqrt()) for s in range(STEPS)]
    assert max(norms) > 0.5, f"global norms {norms} never exceed the example's clip: the clip is not exercised"


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_one_stage_replays_its_last_step_from_the_logs_bit_identically(ranks, rank):
    live, replay = ranks[rank]["live"], ranks[rank]["replay"]
    assert replay["partial_step"] == STEPS - 1, "the interrupted replay advanced the step"
    assert replay["step"] == STEPS
    assert _same(live["after"], replay["after"]) == [], "replayed state differs from the live step"
    assert not _same(live["before"], live["after"]) == [], "the step changed nothing: the test cannot fail"
    assert replay["loss"] == live["losses"][-1]
    assert replay["relogged"].keys() == replay["logged"].keys()
    assert _same(replay["relogged"], replay["logged"]) == [], "re-logged entries differ"
