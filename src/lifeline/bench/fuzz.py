"""``lifeline bench fuzz``: the differential fuzzer — random jobs under random faults against failure-free runs.

Each trial draws a job configuration and a fault schedule from its seed (:mod:`._fuzz_draw`: a
layout over tensor, pipeline, data and expert within ``max_world`` ranks, the pipeline schedule,
``checkpoint.every``, ``keep``, ``persist.every``, sparse windows, localized replay, elastic, and 1–4
faults of every kind ``lifeline run`` injects, at random steps, boundaries, the last step and
during a recovery), runs it under ``lifeline run`` in this process (:func:`._chaos_trial.run_trial`)
and compares it with the failure-free run of the same shape (run once per shape and cached for the
invocation; ``exact_reference`` runs one per full configuration instead). A trial fails when
(:func:`check`):

* ``bench chaos``'s verdict fails (the job did not finish, the final digest differs from the
  reference, the latest complete step moved backwards, a torn or an undetected corrupt copy);
* a loss differs from the reference's at some step (every report, replays included) or a step the
  reference reported has none;
* a recovery did not take the cheapest rung the copies allowed, or answered no new fault;
* a fault cost more time than the bound of its kind (:func:`._fuzz_check.time_bound`).

A failed trial prints the one command that replays it: ``lifeline bench fuzz --seed S --trials 1``.

``model`` (``--model``): ``gpt-moe`` (default: the reference trainer, :mod:`._fuzz_draw`) or
``pipelining-moe`` (examples/pipelining-moe's script under its own draws, :mod:`._fuzz_pipelining`);
the checks are the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lifeline.bench._chaos_schedule import TrialSpec
from lifeline.bench._chaos_trial import median, run_trial, verdict
from lifeline.bench._fuzz_check import (
    extra_recoveries,
    loss_problems,
    losses,
    replans_after_corruption,
    rung_problems,
    time_bound,
    time_problems,
)
from lifeline.bench._fuzz_draw import DRAWS, MAX_WORLD, FuzzTrial, draw, moment_of
from lifeline.bench.chaos import _load

__all__ = ["run", "run_one", "check", "replay_command", "commit_seed", "References", "TRIAL_TIMEOUT", "MODELS",
           "drawer"]

MODELS = ("gpt-moe", "pipelining-moe")
"""``--model`` values; the first is the default."""

TRIAL_TIMEOUT = 600.0
"""A run (reference or trial) still going after this many seconds fails."""


def drawer(model: str = MODELS[0], draws: int | None = None):
    """The draw function (``draw(seed, *, max_world) -> FuzzTrial``) of ``model`` (:data:`MODELS`), at
    draw version ``draws`` (default: the model's default, :data:`lifeline.bench._fuzz_draw.DRAWS`;
    version 3 adds the new fault kinds, opt-in).

    Raises:
        ConfigError: an unknown model, or a draw version the model does not have.
    """
    from lifeline.errors import ConfigError

    if model == MODELS[0]:
        version = DRAWS if draws is None else draws
        draw(0, max_world=2, draws=version)  # refuses an unknown version
        return lambda seed, *, max_world=MAX_WORLD: draw(seed, max_world=max_world, draws=version)
    if model == MODELS[1]:
        from lifeline.bench._fuzz_pipelining import draw as draw_pipelining

        if draws not in (None, 1):
            raise ConfigError(f"--model {model} has draw version 1 only, got --draws {draws}", field="--draws")
        return draw_pipelining
    raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {model!r}", field="--model")


def replay_command(seed: int, max_world: int = MAX_WORLD, exact_reference: bool = False,
                   model: str = MODELS[0], draws: int | None = None) -> str:
    """The command that replays the trial of ``seed`` (``--draws`` when not the model's newest version)."""
    extra = "" if max_world == MAX_WORLD else f" --max-world {max_world}"
    extra += " --exact-reference" if exact_reference else ""
    extra += "" if model == MODELS[0] else f" --model {model}"
    extra += "" if draws is None or (model == MODELS[0] and draws == DRAWS) else f" --draws {draws}"
    return f"lifeline bench fuzz --seed {seed} --trials 1{extra}"


def commit_seed(cwd: str | Path | None = None) -> int:
    """The seed of this commit: ``LIFELINE_FUZZ_SEED`` if set, else the first 7 hex digits of
    ``git rev-parse HEAD`` (0 outside a git checkout)."""
    env = os.environ.get("LIFELINE_FUZZ_SEED")
    if env:
        return int(env)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
        return int(head[:7], 16)
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 3)


class References:
    """Failure-free runs, one per key (a trial's shape, or its whole configuration), run on first use
    under ``root`` and kept for the invocation: digest, losses, wall time (state removed unless ``keep``)."""

    def __init__(self, root: Path, *, exact: bool = False, keep: bool = False, timeout: float = TRIAL_TIMEOUT):
        self.root, self.exact, self.keep, self.timeout = root, exact, keep, timeout
        self.runs: dict[str, dict[str, Any]] = {}

    def key(self, trial: FuzzTrial) -> str:
        return json.dumps(trial.spec, sort_keys=True) if self.exact else trial.shape_key

    def get(self, trial: FuzzTrial) -> dict[str, Any]:
        key = self.key(trial)
        if key not in self.runs:
            doc = json.loads(json.dumps(trial.doc)) if self.exact else trial.reference_doc()
            state = self.root / f"reference-{len(self.runs)}"
            s = run_trial(doc, TrialSpec(-1, ()), state / "run", persist_uri=f"file://{state / 'l2'}",
                          timeout=self.timeout, templates=True)  # failure-free: forked processes only save time
            ok = s["phase"] == "Succeeded" and not s.get("error") and bool(s.get("digest"))
            self.runs[key] = {"ok": ok, "digest": s.get("digest"), "losses": losses(state / "run" / "logs"),
                              "wall_seconds": s["wall_seconds"], "seed": trial.seed, "state_dir": str(state),
                              "why": None if ok else f"{s['phase']} {s.get('error') or ''}".strip(),
                              "recoveries": len(s.get("recoveries", []))}
            if ok and not self.keep:
                shutil.rmtree(state, ignore_errors=True)
        return self.runs[key]


def check(trial: FuzzTrial, summary: dict[str, Any], ref: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The reasons ``summary`` (a faulted run of ``trial``) fails against the reference ``ref``
    (empty: passed), and the trial's figures (time lost per fault, extra recoveries)."""
    logs = Path(summary["state_dir"]) / "logs"
    reasons = verdict(summary, ref)
    if ref.get("recoveries"):
        reasons.append(f"the failure-free reference recovered {ref['recoveries']} times")
    reasons += loss_problems(losses(logs), ref["losses"])
    keep = int(trial.spec["checkpoint"]["keep"])
    reasons += rung_problems(summary, logs, world=trial.world, keep=keep)
    extra = extra_recoveries(summary)
    reasons += [f"extra recovery: {e}" for e in extra]
    rows, slow = time_problems(summary, trial.world)
    reasons += slow
    return reasons, {"time_lost": rows, "extra_recoveries": len(extra),
                     "replans_after_corruption": replans_after_corruption(summary)}


def run_one(seed: int, *, root: Path, refs: References, max_world: int = MAX_WORLD, keep: bool = False,
            timeout: float = TRIAL_TIMEOUT, templates: bool = False, model: str = MODELS[0],
            draws: int | None = None) -> dict[str, Any]:
    """Draw, run and check the trial of ``seed`` (its state under ``root``; removed when it passed,
    unless ``keep``; ``templates``: the faulted run forks its processes from templates; ``model`` and
    ``draws``: whose draws, which version, :func:`drawer`). Returns ``{"seed", "config", "reasons",
    "replay", "summary", ...}``."""
    trial = drawer(model, draws)(seed, max_world=max_world)
    t0 = time.monotonic()
    ref = refs.get(trial)
    ref_seconds = time.monotonic() - t0
    state = root / f"trial-{seed}"
    out: dict[str, Any] = {"seed": seed, "config": trial.describe(), "replay": replay_command(seed, max_world,
                                                                                          refs.exact, model, draws)}
    if not ref["ok"]:
        out.update(reasons=[f"the failure-free reference did not succeed: {ref['why']} (logs in "
                            f"{ref['state_dir']})"], summary=None, figures={}, state_dir=ref["state_dir"],
                   wall_seconds=0.0, reference_seconds=round(ref_seconds, 3))
        return out
    uri = "s3://lifeline/fuzz" if trial.chaos.needs_minio else f"file://{state / 'l2'}"
    s = run_trial(trial.doc, trial.chaos, state, persist_uri=uri, timeout=timeout, templates=templates)
    reasons, figures = check(trial, s, ref)
    out.update(reasons=reasons, summary=s, figures=figures, state_dir=str(state), wall_seconds=s["wall_seconds"],
               reference_seconds=round(ref_seconds, 3))
    if reasons:
        try:
            (state / "trial.json").write_text(json.dumps({k: v for k, v in out.items()}, indent=1, default=str))
        except OSError:
            pass
    elif not keep:
        shutil.rmtree(state, ignore_errors=True)
    return out


def run(*, trials: int = 100, seed: int = 0, max_world: int = MAX_WORLD, workdir: str | None = None,
        keep: bool = False, exact_reference: bool = False, timeout: float = TRIAL_TIMEOUT,
        progress: bool = True, templates: bool = False, model: str = MODELS[0], draws: int | None = None
        ) -> dict[str, Any]:
    """Run ``trials`` trials (trial ``i`` has seed ``seed + i``) of ``model`` (:data:`MODELS`); returns
    the JSON object.

    Fields: ``trials``, ``failures`` (count; target 0), ``failed`` (each failed trial: seed,
    configuration, reasons, ``replay`` command, state dir), ``recoveries_per_rung`` and ``_per_tier``,
    ``time_lost_seconds`` per fault kind (``n``, ``median``, ``p95``, ``max``, ``unmeasured``, ``bound``),
    ``second_recoveries_without_a_second_fault`` (target 0), ``replans_after_a_detected_corruption``
    (second recoveries a flip's corrupted copy called for when it was read), ``faults_fired`` / ``faults_not_fired``
    per kind, ``moments`` (where the faults were placed), ``configs`` (what was drawn), ``references``
    (failure-free runs), wall time per trial, load.
    """
    draw_trial = drawer(model, draws)
    root = Path(workdir or tempfile.mkdtemp(prefix="lifeline-bench-fuzz-"))
    root.mkdir(parents=True, exist_ok=True)
    refs = References(root, exact=exact_reference, keep=keep, timeout=timeout)
    t0, load_before = time.monotonic(), _load()
    rungs: dict[str, int] = {}
    tiers: dict[str, int] = {}
    lost: dict[str, list[float]] = {}
    fired: dict[str, int] = {}
    never: dict[str, int] = {}
    moments: dict[str, int] = {}
    unmeasured: dict[str, int] = {}
    configs: dict[str, dict[str, int]] = {}
    failed, walls, extra, replans = [], [], 0, 0
    for i in range(trials):
        res = run_one(seed + i, root=root, refs=refs, max_world=max_world, keep=keep, timeout=timeout,
                      templates=templates, model=model, draws=draws)
        s, cfg = res["summary"], res["config"]
        for k in ("layout", "schedule", "every", "persist_every", "keep", "sparse_window", "localized_replay",
                  "elastic", "micro_batches", "compute_dtype"):
            if k not in cfg:
                continue
            v = cfg[k] if k != "layout" else "x".join(str(cfg[k][d]) for d in ("tensor", "pipeline", "data", "expert"))
            configs.setdefault(k, {})[str(v)] = configs.setdefault(k, {}).get(str(v), 0) + 1
        if s is not None:
            walls.append(res["wall_seconds"])
            trial = draw_trial(seed + i, max_world=max_world)
            for r in s["recoveries"]:
                rungs[r["action"]] = rungs.get(r["action"], 0) + 1
                tiers[str(r["tier"])] = tiers.get(str(r["tier"]), 0) + 1
            fired_names = {f["fault"] for f in s["faults"]}
            for f in s["faults"]:
                name = f"flip:{f['tier']}" if f["kind"] == "flip" else f["kind"]
                bucket = never if f.get("ineffective") else fired
                bucket[name] = bucket.get(name, 0) + 1
                m = moment_of(trial, f["fault"])
                moments[m] = moments.get(m, 0) + 1
            for inj in trial.injections:
                if str(inj) not in fired_names:
                    name = f"flip:{inj.tier}" if inj.kind == "flip" else inj.kind
                    never[name] = never.get(name, 0) + 1
            for row in res["figures"]["time_lost"]:
                if row["seconds"] is not None:
                    lost.setdefault(row["name"], []).append(row["seconds"])
                else:  # never caught up, or no recovery after it (a fault at the last step)
                    unmeasured[row["name"]] = unmeasured.get(row["name"], 0) + 1
            extra += res["figures"]["extra_recoveries"]
            replans += res["figures"]["replans_after_corruption"]
        if res["reasons"]:
            failed.append({k: res[k] for k in ("seed", "config", "reasons", "replay", "state_dir")})
        if progress:
            verdict_text = "ok" if not res["reasons"] else "FAILED: " + " | ".join(res["reasons"])[:600]
            print(f"[fuzz] seed {seed + i} ({i + 1}/{trials}) {res['wall_seconds']:.0f} s "
                  f"{res['config']['faults']}: {verdict_text}" + (f"\n[fuzz]   replay: {res['replay']}"
                                                                   if res["reasons"] else ""),
                  file=sys.stderr, flush=True)
    return {
        "bench": "fuzz", "bed": "lifeline run", "model": model, "seed": seed, "max_world": max_world,
        "draws": draws if draws is not None else (DRAWS if model == MODELS[0] else 1), "trials": trials,
        "failures": len(failed), "passed": trials - len(failed), "failed": failed,
        "recoveries_per_rung": dict(sorted(rungs.items())), "recoveries_per_tier": dict(sorted(tiers.items())),
        "time_lost_seconds": {k: {"n": len(lost.get(k, [])), "median": median(lost.get(k, [])),
                                  "p95": _percentile(lost.get(k, []), 0.95),
                                  "max": round(max(lost[k]), 3) if lost.get(k) else None,
                                  "unmeasured": unmeasured.get(k, 0),
                                  "bound": {"2_ranks": round(time_bound(k, 2), 1),
                                            f"{max_world}_ranks": round(time_bound(k, max_world), 1)}}
                              for k in sorted(set(lost) | set(unmeasured))},
        "second_recoveries_without_a_second_fault": extra,
        "replans_after_a_detected_corruption": replans,
        "faults_fired": dict(sorted(fired.items())), "faults_not_fired": dict(sorted(never.items())),
        "moments": dict(sorted(moments.items())), "configs": configs,
        "references": {"runs": len(refs.runs), "per": "configuration" if exact_reference else "shape",
                       "median_wall_seconds": median([r["wall_seconds"] for r in refs.runs.values()])},
        "trial_wall_seconds": {"median": median(walls), "p95": _percentile(walls, 0.95),
                               "max": round(max(walls), 3) if walls else None},
        "seconds": round(time.monotonic() - t0, 1), "load_average": {"before": load_before, "after": _load()},
        "cpus": os.cpu_count(), "workdir": str(root),
    }
