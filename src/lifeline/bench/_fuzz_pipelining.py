"""``lifeline bench fuzz --model pipelining-moe``: trials of examples/pipelining-moe, drawn from their seed.

The job runs the example's own script (``examples/pipelining-moe/train.py``, a ``torch.nn`` MoE split
with ``torch.distributed.pipelining``, docs/pipelining.md) as the TrainingJob's template command, as
tests/launch/test_pipelining_example.py does, with the trials' timeouts and settings of
:func:`lifeline.bench.chaos.job_doc`. :func:`draw` is a pure function of ``(seed, max_world)`` and
draws only configurations the adapter supports (one stage per rank, no data parallel replicas):

* the *shape*, from ``seed // SHAPE_BLOCK`` (a failure-free reference per shape, shared by the
  block's seeds): the number of stages (2 or 3, at most ``max_world``: the layout is ``pipeline``
  alone), the schedule (``gpipe`` or ``1f1b``; part of the shape because the reference must run the
  same torch schedule) and ``micro_batches`` (fewer than the stages under GPipe only — torch's 1F1B
  refuses fewer —, as many, one more, twice as many);
* the rest, from the seed: ``checkpoint.every``, ``persist.every``, ``keep``, ``sparse.window`` (on
  or off), ``recovery.localizedReplay`` (on or off). ``recovery.elastic`` stays off: a pipeline-only
  job has no smaller layout the example's stages could be resharded to;
* the fault schedule: the default model's (:func:`lifeline.bench._fuzz_draw._faults`: one to
  :data:`~lifeline.bench._fuzz_draw.MAX_FAULTS` faults of every kind ``lifeline run`` injects — trainer,
  sidecar, node, hang, Redis, MinIO, flips at L0/L1/L2 — at random steps, checkpoint and window
  boundaries, the last step, and one more process fault during a recovery).

The draws of the default model (:func:`lifeline.bench._fuzz_draw.draw`) are untouched: its random
streams are named differently (``fuzz-shape``/``fuzz-trial`` there, ``fuzz-pp-shape``/``fuzz-pp`` here).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lifeline.bench._fuzz_draw import MAX_WORLD, SHAPE_BLOCK, STEPS, FuzzTrial, _faults
from lifeline.bench.chaos import job_doc

__all__ = ["MODEL_NAME", "SCRIPT", "SCHEDULES", "STAGES", "PipeliningTrial", "draw", "job"]

MODEL_NAME = "pipelining-moe"
SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "pipelining-moe" / "train.py"
"""The example's script (a source checkout: the fuzzer runs it as the template command)."""
STAGES = (2, 3)
"""Numbers of stages drawn (capped by ``max_world``)."""
SCHEDULES = ("gpipe", "1f1b")
MAX_MICRO_BATCHES = 6


def job(layout_stages: int, args: dict[str, Any], steps: int = STEPS) -> dict:
    """The TrainingJob document of the example with ``layout_stages`` stages and model ``args``
    (``schedule``, ``micro_batches``): :func:`lifeline.bench.chaos.job_doc`'s settings (hang timeout
    8 s, start-up grace, the trials' environment), the example's script as the command, no model name
    (the script is the model: no checker), L2 only at the last step."""
    doc = job_doc(MODEL_NAME, pipeline=layout_stages, data=1, steps=steps, persist_every=steps)
    spec = doc["spec"]
    (trainer,) = spec["template"]["spec"]["containers"]
    trainer["command"] = ["python", str(SCRIPT)]
    spec["model"] = {"args": dict(args)}
    return doc


@dataclass(frozen=True)
class PipeliningTrial(FuzzTrial):
    """A drawn trial of examples/pipelining-moe (the fields of :class:`FuzzTrial`)."""

    @property
    def shape_key(self) -> str:
        """What decides the numbers of a failure-free run: stages, schedule, micro-batches, steps, seed."""
        return json.dumps({"model": MODEL_NAME, "layout": self.spec["layout"], "args": self.spec["model"]["args"],
                           "steps": self.steps, "seed": self.spec["seed"]}, sort_keys=True)

    def reference_doc(self) -> dict:
        """The failure-free reference's document: this shape, a dense checkpoint every step, L2 every
        4 steps, no sparse windows, no localized replay."""
        doc = job(int(self.spec["layout"]["pipeline"]), self.spec["model"]["args"], self.steps)
        doc["spec"]["checkpoint"]["persist"]["every"] = 4 if self.steps % 4 == 0 else self.steps
        return doc

    def describe(self) -> dict[str, Any]:
        """The configuration and faults, as the JSON shows a trial (``n_layers``: one block per stage)."""
        s = self.spec
        ck, rec, args = s["checkpoint"], s["recovery"], s["model"]["args"]
        return {"model": MODEL_NAME, "layout": s["layout"], "micro_batches": args["micro_batches"],
                "n_layers": s["layout"]["pipeline"], "schedule": args["schedule"], "steps": self.steps,
                "every": ck["every"], "persist_every": ck["persist"]["every"], "keep": ck["keep"],
                "sparse_window": (ck.get("sparse") or {}).get("window"),
                "localized_replay": rec.get("localizedReplay", False), "elastic": "elastic" in rec,
                "faults": [str(i) for i in self.injections], "moments": list(self.moments)}


def _shape(seed: int, max_world: int) -> tuple[int, str, int]:
    """``(stages, schedule, micro_batches)`` of the block of ``seed``."""
    rng = random.Random(f"fuzz-pp-shape:{seed // SHAPE_BLOCK}:{max_world}")
    stages = rng.choice([p for p in STAGES if p <= max_world])
    schedule = rng.choice(SCHEDULES)
    micro = rng.choice(sorted({m for m in (stages - 1, stages, stages + 1, 2 * stages)
                               if 1 <= m <= MAX_MICRO_BATCHES and (schedule == "gpipe" or m >= stages)}))
    return stages, schedule, micro


def draw(seed: int, *, max_world: int = MAX_WORLD) -> PipeliningTrial:
    """The trial of ``seed`` (see the module docstring). Deterministic in its arguments.

    Raises:
        ConfigError: ``max_world`` < 2 (no pipeline fits).
    """
    if max_world < min(STAGES):
        from lifeline.errors import ConfigError

        raise ConfigError(f"--model {MODEL_NAME} needs --max-world >= {min(STAGES)}, got {max_world}",
                          field="--max-world")
    stages, schedule, micro = _shape(seed, max_world)
    rng = random.Random(f"fuzz-pp:{seed}:{max_world}")
    every = rng.choice((1, 1, 2, 3))
    persist = rng.choice([m for m in (2, 3, 4, 6) if m % every == 0 and STEPS % m == 0])
    window = rng.choice((2, 3, 4)) if rng.random() < 0.5 else None
    localized = rng.random() < (0.75 if window else 0.5)
    doc = job(stages, {"schedule": schedule, "micro_batches": micro})
    spec = doc["spec"]
    spec["checkpoint"].update(every=every, keep=rng.choice((1, 2, 2, 3)))
    spec["checkpoint"]["persist"]["every"] = persist
    if window:
        spec["checkpoint"]["sparse"] = {"window": window}
    spec["recovery"]["localizedReplay"] = localized
    injections, moments = _faults(rng, world=stages, steps=STEPS, every=every, persist=persist, window=window)
    return PipeliningTrial(seed, max_world, copy.deepcopy(doc), injections, moments)
