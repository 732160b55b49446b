"""``lifeline.runtime.hf``: bad use is a ``ConfigError`` that names the field and the fix.

One rank, no services (world size 1 needs no catalog), checkpoints in a temporary directory; the
script runs in a subprocess (``init()`` joins a process group). The recovery paths are tested end
to end by ``tests/launch/test_hf_example.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


SCRIPT = """
import json, os, sys, tempfile
sys.path.insert(0, os.environ["EXAMPLE_DIR"])
import train as example
import lifeline.runtime as lifeline
from lifeline.errors import ConfigError
from lifeline.runtime.hf import LifelineTrainer, training_arguments

ctx = lifeline.init()
args = training_arguments(ctx, output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4)
out = {"env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}}
out["max_steps"], out["seed"], out["save_strategy"] = args.max_steps, args.seed, getattr(args.save_strategy, "value", args.save_strategy)
try:
    LifelineTrainer(ctx, model=example.build_model(0), args=training_arguments(ctx, output_dir=tempfile.mkdtemp(),
                    max_steps=ctx.settings.steps + 1), train_dataset=example.JsonBytes())
except ConfigError as err:
    out["max_steps_error"] = [err.field, str(err)]
trainer = LifelineTrainer(ctx, model=example.build_model(0), args=args, train_dataset=example.JsonBytes())
try:
    trainer.train(resume_from_checkpoint=True)
except ConfigError as err:
    out["resume_error"] = [err.field, str(err)]
trainer.train()
ctx.close()
print("RESULT " + json.dumps(out), flush=True)
"""


def test_the_trainer_takes_the_jobs_steps_and_refuses_a_resume_of_its_own(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(LIFELINE_JOB="hf-errors", LIFELINE_RANK="0", LIFELINE_WORLD_SIZE="1", LIFELINE_CHECKPOINT_EVERY="2",
               LIFELINE_STEPS="3", LIFELINE_MODEL=json.dumps({"seed": 7}), LIFELINE_SECRET="hf-errors-secret-0123456789",
               LIFELINE_CHECKPOINT_URI=str(tmp_path / "ck"), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               EXAMPLE_DIR=str(root / "examples" / "hf-trainer"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert out["env"] == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert (out["max_steps"], out["seed"], out["save_strategy"]) == (3, 7, "no"), out
    field, message = out["max_steps_error"]
    assert field == "max_steps" and "spec.steps=3" in message and "max_steps=ctx.settings.steps" in message
    field, message = out["resume_error"]
    assert field == "resume_from_checkpoint" and "leave it unset" in message
    events = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"')]  # the Trainer logs dicts too
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3]
    assert [e["step"] for e in events if e["event"] == "save"] == [2, 3], "every 2 steps and the last one"
