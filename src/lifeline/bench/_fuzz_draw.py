"""What one trial of ``lifeline bench fuzz`` runs: a job configuration and a fault schedule, drawn from its seed.

:func:`draw` is a pure function of ``(seed, max_world)``, so a failed trial replays with
``lifeline bench fuzz --seed S --trials 1`` (plus ``--max-world N`` when it was not the default).

The configuration has two parts:

* the *shape* — layout (tensor, pipeline, data, expert; 2..``max_world`` ranks, only layouts the
  GPT-MoE model takes: :func:`lifeline.launch.spec.load_for_launch` checks every candidate), the
  model's ``n_layers`` and ``micro_batches`` (fewer than, as many as or more than the stages) and
  ``steps``. It decides the numbers a failure-free run computes, so the failure-free reference is
  run once per shape (:attr:`FuzzTrial.shape_key`). It is drawn from ``seed // SHAPE_BLOCK``:
  consecutive seeds share a shape, and a bench run of N trials runs about N / SHAPE_BLOCK references.
* the model's ``compute_dtype`` (draw version 2, :data:`DRAWS`): bfloat16 compute weights for half
  the shape blocks (fp32 masters; sparse windows then store FROZEN operators in bfloat16), from
  a stream of its own, so version 1's draws are unchanged where it says float32.
* the rest, from the seed itself — ``schedule`` (gpipe or 1f1b: bit-identical to each other),
  ``checkpoint.every``, ``persist.every``, ``keep``, ``sparse.window`` (on or off),
  ``recovery.localizedReplay``, ``recovery.elastic`` (on or off): how the job checkpoints and
  recovers, never what it computes.

The fault schedule: one to :data:`MAX_FAULTS` faults of every kind ``lifeline run`` injects
(:data:`lifeline.bench._chaos_schedule.FAULTS`), each at a random step, at a checkpoint or window
boundary, or at the last step (a flip only after its tier holds a checkpoint), and possibly one more
process fault armed ``when=recovery`` (it fires while the first recovery is under way).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lifeline.bench._chaos_schedule import FAULTS, PROCESS_FAULTS, TrialSpec
from lifeline.bench.chaos import MODEL, job_doc
from lifeline.launch.inject import SERVICE_KINDS, Injection

__all__ = ["DRAWS", "NEWEST", "NEW_KINDS", "MAX_FAULTS", "MAX_WORLD", "SHAPE_BLOCK", "STEPS", "FuzzTrial", "draw", "layouts", "moment_of"]

DRAWS = 2
"""The draw version ``draw`` uses by default (``--draws``): 1 drew float32 compute only (every seed
found before 2026-11-29 replays with it: ``Regression.draws``); 2 also draws ``compute_dtype``;
3 (opt-in until a campaign has run it: docs/fuzz.md) also adds one fault of :data:`NEW_KINDS`."""
NEWEST = 3
"""The newest draw version (``--draws`` at most)."""
BFLOAT16 = 0.5
"""Share of the shape blocks drawn with bfloat16 compute weights (version 2)."""
NEW_KINDS = ("preempt", "nan", "slow")
"""Version 3's extra fault, one per trial (issue 27): a preemption (SIGTERM, 10 s grace: the rank
saves its step to L1 and its node goes, 0 steps lost), a transient NaN (the step's re-run is clean:
a faulty rank, restarted), a rank slowed 2x from its step on (no straggler policy in the spec: the
job only gets slower). A NaN that repeats would skip its batch, which the failure-free reference
does not: not drawn."""

MAX_WORLD = 8
"""Ranks at most (``--max-world``)."""
MAX_FAULTS = 4
"""Faults per trial at most (the one armed during a recovery included)."""
SHAPE_BLOCK = 4
"""Seeds ``k * SHAPE_BLOCK .. k * SHAPE_BLOCK + SHAPE_BLOCK - 1`` share a shape (and a reference run)."""
STEPS = 12
"""Steps of every job: divisible by 1, 2, 3, 4 and 6, so every ``persist.every`` drawn divides it and
the final state is digested from L2 (layout-independent, bit for bit)."""
DURING_RECOVERY = 0.35
BOUNDARY = 0.3
LAST_STEP = 0.15
DEGREES = {"tensor": (1, 2, 4), "pipeline": (1, 2, 3, 4), "data": (1, 2, 3, 4), "expert": (1, 2, 4)}
"""Candidate degrees: tensor and expert divide the model's 4 heads and 4 experts."""


@lru_cache(maxsize=None)
def layouts(max_world: int) -> tuple[dict[str, int], ...]:
    """Every layout of 2..``max_world`` ranks that the GPT-MoE model of the trials accepts (each with
    ``n_layers = max(2, pipeline)``), checked with ``lifeline run``'s own validator."""
    from lifeline.errors import ConfigError
    from lifeline.launch.spec import load_for_launch

    out = []
    for t in DEGREES["tensor"]:
        for p in DEGREES["pipeline"]:
            for d in DEGREES["data"]:
                for e in DEGREES["expert"]:
                    world = t * p * d * e
                    if not 2 <= world <= max_world:
                        continue
                    lay = {"tensor": t, "pipeline": p, "data": d, "expert": e}
                    try:
                        load_for_launch(_doc("fuzz", lay, {**MODEL, "n_layers": max(2, p)}))
                    except ConfigError:
                        continue
                    out.append(lay)
    return tuple(out)


def _doc(name: str, layout: dict[str, int], model: dict[str, Any], steps: int = STEPS) -> dict:
    doc = job_doc(name, pipeline=layout["pipeline"], data=layout["data"], steps=steps, persist_every=steps,
                  model=model)
    doc["spec"]["layout"] = dict(layout)
    doc["spec"]["replicas"] = layout["tensor"] * layout["pipeline"] * layout["data"] * layout["expert"]
    return doc


@dataclass(frozen=True)
class FuzzTrial:
    """One drawn trial: its ``seed``, the TrainingJob document ``doc``, the fault ``injections`` and
    the ``moments`` each was placed at (``random``, ``boundary``, ``last``, ``recovery``)."""

    seed: int
    max_world: int
    doc: dict = field(hash=False, compare=False)
    injections: tuple[Injection, ...]
    moments: tuple[str, ...]
    draws: int = DRAWS

    @property
    def spec(self) -> dict:
        return self.doc["spec"]

    @property
    def world(self) -> int:
        return int(self.spec["replicas"])

    @property
    def steps(self) -> int:
        return int(self.spec["steps"])

    @property
    def shape_key(self) -> str:
        """What decides the numbers of a failure-free run: layout, model arguments but the pipeline
        schedule (GPipe and 1F1B are bit-identical), steps and seed."""
        args = {k: v for k, v in self.spec["model"]["args"].items() if k != "schedule"}
        return json.dumps({"layout": self.spec["layout"], "args": args, "steps": self.steps,
                           "seed": self.spec["seed"]}, sort_keys=True)

    @property
    def chaos(self) -> TrialSpec:
        """The trial as ``lifeline bench chaos`` runs one."""
        return TrialSpec(self.seed, self.injections)

    def reference_doc(self) -> dict:
        """The failure-free reference's document: this shape, the spec's defaults for the rest
        (GPipe, a dense checkpoint every step, no localized replay)."""
        doc = _doc("fuzz", self.spec["layout"], {k: v for k, v in self.spec["model"]["args"].items()
                                                 if k != "schedule"}, self.steps)
        doc["spec"]["checkpoint"]["persist"]["every"] = 4 if self.steps % 4 == 0 else self.steps
        return doc

    def describe(self) -> dict[str, Any]:
        """The configuration and faults, as the JSON shows a trial."""
        s = self.spec
        ck, rec = s["checkpoint"], s["recovery"]
        return {"layout": s["layout"], "micro_batches": s["model"]["args"]["micro_batches"],
                "n_layers": s["model"]["args"]["n_layers"], "schedule": s["model"]["args"].get("schedule", "gpipe"),
                "compute_dtype": s["model"]["args"].get("compute_dtype", "float32"),
                "steps": self.steps, "every": ck["every"], "persist_every": ck["persist"]["every"], "keep": ck["keep"],
                "sparse_window": (ck.get("sparse") or {}).get("window"),
                "localized_replay": rec.get("localizedReplay", False), "elastic": "elastic" in rec,
                "faults": [str(i) for i in self.injections], "moments": list(self.moments)}


def _shape(seed: int, max_world: int) -> tuple[dict[str, int], int, int]:
    """``(layout, n_layers, micro_batches)`` of the block of ``seed``: a world size weighted 1 / size
    (small jobs are cheaper; every size still comes up), then one of its layouts."""
    rng = random.Random(f"fuzz-shape:{seed // SHAPE_BLOCK}:{max_world}")
    by_world: dict[int, list[dict[str, int]]] = {}
    for cand in layouts(max_world):
        by_world.setdefault(cand["tensor"] * cand["pipeline"] * cand["data"] * cand["expert"], []).append(cand)
    sizes = sorted(by_world)
    lay = rng.choice(by_world[rng.choices(sizes, [1.0 / w for w in sizes])[0]])
    p = lay["pipeline"]
    micro = rng.choice(sorted({m for m in (p - 1, p, p + 1, 2 * p) if 1 <= m <= 6} | ({2, 3} if p == 1 else set())))
    return dict(lay), max(2, p), micro


def _boundaries(steps: int, every: int, persist: int, window: int | None) -> list[int]:
    marks = {s for s in range(2, steps - 1) if s % every == 0 or s % persist == 0 or (window and s % window == 0)}
    return sorted(marks) or list(range(2, steps - 1))


def _compute_dtype(seed: int, max_world: int, draws: int) -> dict[str, str]:
    """The model argument ``compute_dtype`` of the block of ``seed`` (version 2; none in version 1)."""
    if draws < 2 or random.Random(f"fuzz-dtype:{seed // SHAPE_BLOCK}:{max_world}").random() >= BFLOAT16:
        return {}
    return {"compute_dtype": "bfloat16"}


def draw(seed: int, *, max_world: int = MAX_WORLD, draws: int = DRAWS) -> FuzzTrial:
    """The trial of ``seed`` (see the module docstring). Deterministic in its arguments.

    Raises:
        ConfigError: ``draws`` is not a draw version (1 .. :data:`DRAWS`).
    """
    if draws not in range(1, NEWEST + 1):
        from lifeline.errors import ConfigError

        raise ConfigError(f"--draws must be in [1, {NEWEST}], got {draws!r}", field="--draws")
    layout, n_layers, micro = _shape(seed, max_world)
    rng = random.Random(f"fuzz-trial:{seed}:{max_world}")
    world = layout["tensor"] * layout["pipeline"] * layout["data"] * layout["expert"]
    every = rng.choice((1, 1, 2, 3))
    persist = rng.choice([m for m in (2, 3, 4, 6) if m % every == 0 and STEPS % m == 0])
    window = rng.choice((2, 3, 4)) if rng.random() < 0.4 else None
    localized = rng.random() < (0.75 if window else 0.5)
    doc = _doc("fuzz", layout, {**MODEL, "n_layers": n_layers, "micro_batches": micro,
                                "schedule": rng.choice(("gpipe", "1f1b")), **_compute_dtype(seed, max_world, draws)})
    spec = doc["spec"]
    spec["checkpoint"].update(every=every, keep=rng.choice((1, 2, 2, 3)))
    spec["checkpoint"]["persist"]["every"] = persist
    if window:
        spec["checkpoint"]["sparse"] = {"window": window}
    spec["recovery"]["localizedReplay"] = localized
    if rng.random() < 0.5:
        spec["recovery"]["elastic"] = {"minReplicas": 1}
    injections, moments = _faults(rng, world=world, steps=STEPS, every=every, persist=persist, window=window)
    if draws >= 3:
        injections, moments = _with_new_kind(seed, max_world, world, injections, moments)
    return FuzzTrial(seed, max_world, copy.deepcopy(doc), injections, moments, draws)


def _with_new_kind(seed: int, max_world: int, world: int, injections: tuple[Injection, ...],
                   moments: tuple[str, ...]) -> tuple[tuple[Injection, ...], tuple[str, ...]]:
    """Version 3: the trial's faults plus one of :data:`NEW_KINDS` at a random step and rank, from a
    stream of its own (the version-2 draws of the seed are unchanged)."""
    rng = random.Random(f"fuzz-kind:{seed}:{max_world}")
    kind, rank, step = rng.choice(NEW_KINDS), rng.randrange(world), rng.randint(2, STEPS - 2)
    extra = {"preempt": Injection("preempt", rank, step, seconds=10.0),
             "nan": Injection("nan", rank, step, transient=True),
             "slow": Injection("slow", rank, step, factor=2.0)}[kind]
    out = sorted([*zip(injections, moments), (extra, "random")], key=lambda x: (x[0].step, x[0].when is not None))
    return tuple(i for i, _ in out), tuple(m for _, m in out)


def _faults(rng: random.Random, *, world: int, steps: int, every: int, persist: int,
            window: int | None) -> tuple[tuple[Injection, ...], tuple[str, ...]]:
    n = rng.randint(1, MAX_FAULTS)
    during = n > 1 and rng.random() < DURING_RECOVERY
    base = n - 1 if during else n
    marks = _boundaries(steps, every, persist, window)
    out: list[tuple[Injection, str]] = []
    last_used = False
    for _ in range(base):
        kind = rng.choice(FAULTS)
        r = rng.random()
        if r < LAST_STEP and not last_used:
            step, moment, last_used = steps - 1, "last", True
        elif r < LAST_STEP + BOUNDARY:
            step, moment = rng.choice(marks), "boundary"
        else:
            step, moment = rng.randint(2, steps - 2), "random"
        name, _, tier = kind.partition(":")
        if name == "flip" and tier == "L2" and step <= persist:  # a checkpoint must be in L2 to flip
            step = min(steps - 1, persist + 1 + rng.randrange(max(1, steps - persist - 2)))
        elif name == "flip" and step <= every:  # and one in memory (no draw: the other trials stay as they were)
            step = every + 1
        if name == "minio":
            inj = Injection("minio", 0, step, seconds=float(rng.randint(2, 5)))
        elif name in SERVICE_KINDS:
            inj = Injection(name, 0, step)
        else:
            inj = Injection(name, rng.randrange(world), step, tier or None)
        out.append((inj, moment))
    first = min((i for i, _ in out if i.kind not in SERVICE_KINDS), key=lambda i: i.step, default=None)
    if during and first is not None:
        out.append((Injection(rng.choice(PROCESS_FAULTS), rng.randrange(world), first.step, when="recovery"),
                    "recovery"))
    out.sort(key=lambda x: (x[0].step, x[0].when is not None))
    return tuple(i for i, _ in out), tuple(m for _, m in out)


def moment_of(trial: FuzzTrial, fault: str) -> str:
    """The moment a fault (its ``--inject-failure`` text) was placed at."""
    for inj, moment in zip(trial.injections, trial.moments):
        if str(inj) == fault:
            return moment
    return "random"

