"""Test helpers: a small GPT-MoE TrainingJob (4 ranks, PP=2 x DP=2) and ways to run it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from lifeline._poll import wait_for
from lifeline.runtime.events import read_events
from typing import Any

import yaml

TRAINER_COMMAND = ["python", "-m", "lifeline", "trainer"]

# Small enough for 2 shared cores; the layout still exercises pipeline and data parallelism.
MODEL_ARGS = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_expert": 32, "seq_len": 32, "micro_batch": 2,
              "micro_batches": 2, "corpus_bytes": 65536}
STEPS = 12
PERSIST_EVERY = 4

# Timeouts short enough that a hung collective fails within the test's time (settings of the runtime).
TEST_ENV = {"LIFELINE_COLLECTIVE_TIMEOUT_SECONDS": "20", "LIFELINE_RENDEZVOUS_TIMEOUT_SECONDS": "180",
            "LIFELINE_RECOVERY_TIMEOUT_SECONDS": "180"}


def job_doc(name: str, *, pipeline: int = 2, data: int = 2, steps: int = STEPS, **spec: Any) -> dict:
    """A TrainingJob document (a dict, as ``yaml.safe_load`` gives it)."""
    doc = {
        "apiVersion": "lifeline.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": pipeline * data,
            "layout": {"tensor": 1, "pipeline": pipeline, "data": data, "expert": 1},
            "steps": steps,
            "seed": 7,
            "model": {"name": "gpt-moe", "args": dict(MODEL_ARGS)},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "lifeline:dev",
                                                  "command": list(TRAINER_COMMAND),
                                                  "env": [{"name": k, "value": v} for k, v in TEST_ENV.items()]}]}},
            "checkpoint": {"every": 1, "peerReplicas": 1, "keep": 2,
                           "persist": {"every": PERSIST_EVERY, "uri": "file:///unused"}},
            "recovery": {"maxRestarts": 10, "hangTimeoutSeconds": 240, "elastic": {"minReplicas": 2}},
        },
    }
    for key, value in spec.items():
        doc["spec"][key] = value
    return doc


def example_doc(example: str, steps: int) -> dict:
    """``examples/<example>/trainingjob.yaml`` with the script's absolute path, ``steps`` steps (the
    last one persisted to L2) and the tests' timeouts. Asserts the template command is the example's
    script, run from the repository root, as its README line says."""
    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "examples" / example / "trainingjob.yaml").read_text())
    (trainer,) = doc["spec"]["template"]["spec"]["containers"]
    assert trainer["command"] == ["python", f"examples/{example}/train.py"], trainer
    trainer["command"] = ["python", str(root / "examples" / example / "train.py")]
    trainer["env"] = [{"name": k, "value": v} for k, v in TEST_ENV.items()]
    doc["spec"].update(steps=steps)
    doc["spec"]["checkpoint"]["persist"]["every"] = steps
    return doc


def write_job(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(copy.deepcopy(doc)))
    return path


def lifeline_run(job: Path, state_dir: Path, *args: str, timeout: float = 400) -> dict:
    """Run ``lifeline run JOB --json`` to completion; return the summary (asserting exit 0)."""
    proc = subprocess.run([sys.executable, "-m", "lifeline", "run", str(job), "--state-dir", str(state_dir),
                           "--json", *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"lifeline run exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def start_run(job: Path, state_dir: Path, *args: str, log: Path) -> subprocess.Popen:
    """Start ``lifeline run`` in the background (its own process group), output to ``log``."""
    handle = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "lifeline", "run", str(job), "--state-dir", str(state_dir),
                             "--json", *args], stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    handle.close()
    return proc


def await_condition(cond: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """Poll ``cond`` until truthy (returning its value); ``TimeoutError`` after ``timeout`` seconds."""
    return wait_for(cond, timeout, what, poll)


def trainer_events(state_dir: Path) -> list[dict]:
    """Every JSON event line the trainers printed (all ranks, all incarnations)."""
    return read_events(sorted((state_dir / "logs").glob("*-trainer.log")))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie is dead (a run's processes are adopted by whichever process
    is a child subreaper when their launcher dies, and a test process that ran a Supervisor in
    process is one: see lifeline.launch.templates)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in ("Z", "X")
