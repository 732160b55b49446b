"""docs/sdk.md cannot drift: every code block marked ``<!-- sdk-test -->`` runs as a script.

One rank, no services (world size 1 needs no catalog), checkpoints in a temporary directory
(``LIFELINE_CHECKPOINT_URI``). Each block runs twice in one process: to step 3, then to step 5,
where it must restore step 3 and train steps 4 and 5 only. Also checks that every name the SDK
exports resolves and is visible to type checkers (the ``TYPE_CHECKING`` block).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lifeline.runtime

DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"
MARK = re.compile(r"<!-- sdk-test -->\n```python\n(.*?)```", re.S)

RUNNER = """
import os, sys
blocks = [open(path).read() for path in sys.argv[1:]]
for index, code in enumerate(blocks):
    os.environ["LIFELINE_CHECKPOINT_URI"] = os.path.join(os.environ["CK_ROOT"], f"block-{index}")
    for steps in ("3", "5"):
        os.environ["LIFELINE_STEPS"] = steps
        print(f"--- block {index} steps {steps}", flush=True)
        exec(compile(code, f"sdk.md block {index}", "exec"), {"__name__": "__main__"})
"""


def marked_blocks() -> list[str]:
    """The marked Python blocks of docs/sdk.md, in order."""
    return MARK.findall(DOC.read_text())


def test_the_marked_blocks_of_the_sdk_page_run_and_resume(tmp_path):
    blocks = marked_blocks()
    assert len(blocks) >= 2, "docs/sdk.md lost its marked example blocks"
    paths = []
    for i, code in enumerate(blocks):
        paths.append(tmp_path / f"block-{i}.py")
        paths[-1].write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    env.update(LIFELINE_JOB="sdk-docs", LIFELINE_RANK="0", LIFELINE_WORLD_SIZE="1", LIFELINE_CHECKPOINT_EVERY="1",
               LIFELINE_SECRET="sdk-docs-secret-0123456789", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               CK_ROOT=str(tmp_path / "ck"))
    proc = subprocess.run([sys.executable, "-c", RUNNER, *map(str, paths)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = proc.stdout.split("--- block ")[1:]
    assert len(runs) == 2 * len(blocks)
    for run in runs:
        header, _, body = run.partition("\n")
        events = [json.loads(line) for line in body.splitlines() if line.startswith("{")]
        steps = [e["step"] for e in events if e["event"] == "step"]
        restores = [e["step"] for e in events if e["event"] == "restore"]
        saves = [e["step"] for e in events if e["event"] == "save"]
        if header.endswith("steps 3"):
            assert (steps, restores, saves) == ([1, 2, 3], [], [1, 2, 3]), (header, events)
        else:  # resumed from the first run's last checkpoint
            assert (steps, restores, saves) == ([4, 5], [3], [4, 5]), (header, events)


def test_every_exported_name_resolves_and_is_visible_to_type_checkers():
    tree = ast.parse(Path(lifeline.runtime.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    visible = {alias.asname or alias.name for n in guarded.body for alias in n.names}
    assert set(lifeline.runtime.__all__) <= visible, set(lifeline.runtime.__all__) - visible
    for name in lifeline.runtime.__all__:
        assert getattr(lifeline.runtime, name) is not None
