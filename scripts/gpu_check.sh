#!/usr/bin/env bash
# GPU check (issue 24): the DDP example (examples/ddp/train.py) with one rank and its sidecar on one
# GPU under `lifeline run`, its model and optimizer state on CUDA. Prints one JSON line: the trainer's
# stall per save (median of the save events after the first, seconds), one device-to-host copy of the
# same state into pinned host memory (median of 20, seconds), and their ratio.
#
#   scripts/gpu_check.sh [STEPS]        # from the repository root, on a machine with a CUDA GPU
#
# Exits 2 with a message when no CUDA device is visible to PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
STEPS="${1:-40}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device visible to PyTorch (torch.cuda.is_available() is False); run it on a GPU machine" >&2
  exit 2
fi

"$PY" -m pytest -q -p no:cacheprovider tests/gpu   # the CUDA staging path (collected only with a GPU)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$WORK" "$STEPS" <<'EOF'
import sys, yaml
work, steps = sys.argv[1], int(sys.argv[2])
doc = yaml.safe_load(open("examples/ddp/trainingjob.yaml"))
doc["spec"].update(replicas=1, steps=steps)
doc["spec"]["layout"]["data"] = 1
doc["spec"]["checkpoint"].update(peerReplicas=0)  # one node: no peer to hold an L1 copy
doc["spec"]["checkpoint"]["persist"]["every"] = steps
(trainer,) = doc["spec"]["template"]["spec"]["containers"]
trainer["env"] = [{"name": "LIFELINE_EXAMPLE_DEVICE", "value": "cuda"}]
yaml.safe_dump(doc, open(f"{work}/job.yaml", "w"))
EOF

timeout 600 "$PY" -m lifeline run "$WORK/job.yaml" --state-dir "$WORK/state" --persist-uri "$WORK/l2" --json > "$WORK/summary.json"

"$PY" - "$WORK" <<'EOF'
import importlib.util, json, statistics, sys, time
from pathlib import Path
import torch
from lifeline.runtime import read_events

work = sys.argv[1]
summary = json.loads(open(f"{work}/summary.json").read().strip().splitlines()[-1])
if summary["phase"] != "Succeeded":
    sys.exit(f"gpu_check: the job ended {summary['phase']}")
saves = [e for e in read_events(sorted(Path(f"{work}/state/logs").glob("rank-*-trainer.log"))) if e["event"] == "save" and e.get("stall_seconds") is not None]
stalls = [e["stall_seconds"] for e in sorted(saves, key=lambda e: e["step"])][1:]
if not stalls:
    sys.exit("gpu_check: no save events with stall_seconds in the trainer's events")

spec = importlib.util.spec_from_file_location("ddp_example", "examples/ddp/train.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
model = example.CharMLP().cuda()
optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
x, y = example.batch(example.corpus(), 0, 0, 1, 0)
torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
optim.step()
state = [p.detach() for p in model.parameters()] + [t for s in optim.state.values() for t in s.values()
                                                     if isinstance(t, torch.Tensor) and t.is_cuda]
host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in state]
copies = []
for _ in range(20):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for h, t in zip(host, state):
        h.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    copies.append(time.perf_counter() - t0)
stall, copy = statistics.median(stalls), statistics.median(copies)
print(json.dumps({"device": torch.cuda.get_device_name(0), "saves": len(stalls),
                  "state_bytes": sum(t.numel() * t.element_size() for t in state),
                  "stall_seconds": round(stall, 6), "d2h_copy_seconds": round(copy, 6),
                  "stall_per_copy": round(stall / copy, 2)}))
EOF
