"""Every bad input to the user's commands: exit 2, one line naming the field or flag, nothing started.

Each case runs the real CLI of this checkout (``lifeline.cli.main``, what ``python -m lifeline`` calls)
in an empty working directory holding only the case's input files, and asserts: exit code 2; exactly
one line on stderr, starting ``error:`` and naming the field or flag (each expected fragment); no
traceback; no process left running (found by an environment marker every child inherits, and in
process also as new children of this process); nothing written (the working directory and the
checkpoint store are unchanged: no ``.state``, no output file).

Most cases run in this process (``run_cli_here`` in ``_cli.py``: argv, working directory, environment,
standard streams and descriptors 1 and 2, logging, warnings and signal handlers as a fresh process has
them, all restored after; an attempt to start a process fails the case), which keeps the file's run
time a few seconds instead of a Python start-up and imports per case. The cases in ``SUBPROCESS`` still
run ``python -m lifeline`` as a subprocess (``run_cli``), each for the reason given there: the commands
whose real work starts services, forks or installs signal handlers, where a check that regressed
would let that work start inside pytest (in process it would be stopped by the guard, but only the
subprocess shows the whole command, as a user runs it, still exiting 2 and leaving nothing running),
and one usage error to keep the ``python -m lifeline`` entry point itself (``__main__``, the real
``sys.stderr``, the interpreter's exit status) under test.

The first cases are the "Found" items of issue 16, in its order.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ._cli import run_cli, run_cli_here, snapshot

_TRAINER = {"name": "trainer", "image": "lifeline:dev", "command": ["python", "-m", "lifeline", "trainer"]}
_ARGS = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_expert": 32, "seq_len": 32, "micro_batch": 2,
         "micro_batches": 2, "corpus_bytes": 65536}


def job(**changes: Any) -> dict:
    """A valid small TrainingJob (4 ranks) with ``changes`` applied: dotted paths; ``None`` deletes."""
    doc = {"apiVersion": "lifeline.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "tj"},
           "spec": {"replicas": 4, "layout": {"tensor": 1, "pipeline": 2, "data": 2, "expert": 1}, "steps": 6,
                    "seed": 1, "model": {"name": "gpt-moe", "args": dict(_ARGS)},
                    "template": {"spec": {"containers": [dict(_TRAINER)]}},
                    "checkpoint": {"every": 1, "persist": {"every": 2, "uri": "file://{cwd}/l2"}}}}
    doc = copy.deepcopy(doc)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


def J(**changes: Any) -> str:
    """The YAML text of :func:`job` (``__`` in a keyword stands for a dot)."""
    return yaml.safe_dump(job(**{k.replace("__", "."): v for k, v in changes.items()}))


GOOD = J()
BAD_BOTH = J(spec__colour="red", spec__checkpoint__every=4, spec__checkpoint__persist__every=6)
NO_S3_KEYS = ("LIFELINE_S3_ACCESS_KEY", "LIFELINE_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "LIFELINE_S3_ENDPOINT")

# (id, argv, files, expected fragments of the one line, extra env)
CASES: list[tuple[str, list[str], dict[str, str | bytes], list[str], dict[str, str]]] = [
    # --- issue 16, "Found": accepted, then harmful
    ("name-escapes-state", ["run", "j.yaml"], {"j.yaml": J(metadata__name="../../My Job")}, ["metadata.name"], {}),
    ("ranks-beyond-machine", ["run", "j.yaml"],
     {"j.yaml": J(spec__replicas=100000, spec__layout__data=100000, spec__layout__pipeline=1)},
     ["spec.replicas", "cores"], {}),
    ("seed-overflows", ["run", "j.yaml"], {"j.yaml": J(spec__seed=1e23)}, ["spec.seed"], {}),
    ("seed-1e23-text", ["run", "j.yaml"], {"j.yaml": GOOD.replace("seed: 1", "seed: 1e23")}, ["spec.seed"], {}),
    ("no-apiversion", ["run", "j.yaml"], {"j.yaml": J(apiVersion=None)}, ["apiVersion"], {}),
    ("no-kind", ["run", "j.yaml"], {"j.yaml": J(kind=None)}, ["kind"], {}),
    # --- tracebacks instead of one line
    ("binary-spec", ["run", "j.yaml"], {"j.yaml": b"\x89PNG\r\n\x1a\n\x00\xff\xfe"}, ["j.yaml"], {}),
    ("bad-bucket", ["run", "j.yaml"], {"j.yaml": J(spec__checkpoint__persist__uri="s3://Bad_Bucket!/ckpt")},
     ["spec.checkpoint.persist.uri", "bucket"], {}),
    ("uri-in-proc", ["run", "j.yaml"], {"j.yaml": J(spec__checkpoint__persist__uri="file:///proc/nope/ckpt")},
     ["spec.checkpoint.persist.uri", "/proc/nope/ckpt"], {}),
    ("validate-binary", ["validate", "j.yaml"], {"j.yaml": b"\x00\xff\xfe\xfd"}, ["j.yaml"], {}),
    ("export-onto-file", ["ckpt", "export", "{store}", "-j", "gpt", "--to", "safetensors", "-o", "out.st"],
     {"out.st": "keep me"}, ["--out", "--force"], {}),
    ("export-onto-dir", ["ckpt", "export", "{store}", "-j", "gpt", "--to", "safetensors", "-o", "d"],
     {"d/x": "x"}, ["--out"], {}),
    ("export-missing-parent", ["ckpt", "export", "{store}", "-j", "gpt", "--to", "safetensors", "-o", "no/such/m.st"],
     {}, ["--out", "no/such"], {}),
    ("operator-no-kubeconfig", ["operator"], {}, ["kubeconfig"],
     {"KUBECONFIG": "/nonexistent/kubeconfig", "HOME": "{cwd}"}),
    # --- checks that ran after services started
    ("persist-uri-flag", ["run", "j.yaml", "--persist-uri", "ftp://x/y"], {"j.yaml": GOOD}, ["--persist-uri"], {}),
    ("s3-no-credentials", ["run", "j.yaml", "--s3-endpoint", "127.0.0.1:9"],
     {"j.yaml": J(spec__checkpoint__persist__uri="s3://bucket/ckpt")}, ["LIFELINE_S3_ACCESS_KEY"], {}),
    ("timeout-zero", ["run", "j.yaml", "--timeout", "0"], {"j.yaml": GOOD}, ["--timeout"], {}),
    ("timeout-negative", ["run", "j.yaml", "--timeout", "-5"], {"j.yaml": GOOD}, ["--timeout"], {}),
    ("node-return-zero", ["run", "j.yaml", "--node-return-seconds", "0"], {"j.yaml": GOOD}, ["--node-return-seconds"],
     {}),
    ("slot-mib-zero", ["run", "j.yaml", "--slot-mib", "0"], {"j.yaml": GOOD}, ["--slot-mib"], {}),
    ("spare-nodes-negative", ["run", "j.yaml", "--spare-nodes", "-1"], {"j.yaml": GOOD}, ["--spare-nodes"], {}),
    # --- one at a time, hidden, unhelpful
    ("all-problems-at-once", ["run", "j.yaml"], {"j.yaml": BAD_BOTH},
     ["spec.colour", "spec.checkpoint.persist.every"], {}),
    ("validate-all-at-once", ["validate", "j.yaml"], {"j.yaml": BAD_BOTH},
     ["spec.colour", "spec.checkpoint.persist.every"], {}),
    ("empty-file", ["run", "j.yaml"], {"j.yaml": ""}, ["j.yaml", "empty"], {}),
    ("yaml-error-names-file", ["run", "j.yaml"], {"j.yaml": "spec: [unclosed\n"}, ["j.yaml", "line"], {}),
    ("uri-example-not-regex", ["validate", "j.yaml"], {"j.yaml": J(spec__checkpoint__persist__uri="http://x")},
     ["spec.checkpoint.persist.uri", "s3://bucket/prefix"], {}),
    # --- ckpt on a wrong path
    ("ls-missing-path", ["ckpt", "ls", "no/such/store"], {}, ["no/such/store"], {}),
    ("ls-not-a-store", ["ckpt", "ls", "."], {"notes.txt": "hello"}, ["not a checkpoint store"], {}),
    ("ls-no-such-job", ["ckpt", "ls", "{store}", "-j", "nosuch"], {}, ["nosuch", "{store}"], {}),
    ("show-missing-path", ["ckpt", "show", "no/such", "-j", "gpt"], {}, ["no/such"], {}),
    ("show-no-such-job", ["ckpt", "show", "{store}", "-j", "nosuch"], {}, ["nosuch", "{store}"], {}),
    ("verify-missing-path", ["ckpt", "verify", "no/such", "-j", "gpt"], {}, ["no/such"], {}),
    ("export-missing-path", ["ckpt", "export", "no/such", "-j", "gpt", "-o", "out"], {}, ["no/such"], {}),
    ("export-dcp-nonempty", ["ckpt", "export", "{store}", "-j", "gpt", "-o", "d"], {"d/x": "x"},
     ["--out", "not empty"], {}),
    # --- help and flags
    ("inject-comma-list", ["run", "j.yaml", "--inject-failure", "trainer:rank=1:step=2,node:rank=2:step=3"],
     {"j.yaml": GOOD}, ["--inject-failure", "repeat"], {}),
    ("tensors-false", ["ckpt", "show", "{store}", "-j", "gpt", "--tensors", "false"], {}, ["false"], {}),
    # --- more bad specs
    ("name-uppercase", ["validate", "j.yaml"], {"j.yaml": J(metadata__name="MyJob")}, ["metadata.name"], {}),
    ("name-missing", ["run", "j.yaml"], {"j.yaml": J(metadata=None)}, ["metadata.name"], {}),
    ("replicas-mismatch", ["run", "j.yaml"], {"j.yaml": J(spec__replicas=3)}, ["spec.replicas"], {}),
    ("unknown-field", ["run", "j.yaml"], {"j.yaml": J(spec__checkpoint__everyy=2)}, ["spec.checkpoint.everyy"], {}),
    ("no-trainer-container", ["validate", "j.yaml"],
     {"j.yaml": J(spec__template={"spec": {"containers": [{"name": "main", "command": ["x"]}]}})},
     ["spec.template.spec.containers"], {}),
    ("steps-zero", ["run", "j.yaml"], {"j.yaml": J(spec__steps=0)}, ["spec.steps"], {}),
    ("pipeline-zero", ["validate", "j.yaml"], {"j.yaml": J(spec__layout__pipeline=0)}, ["spec.layout.pipeline"], {}),
    ("model-arg", ["run", "j.yaml"], {"j.yaml": J(spec__model__args__d_model=30)}, ["spec.model.args.d_model"], {}),
    ("list-document", ["validate", "j.yaml"], {"j.yaml": "- 1\n- 2\n"}, ["j.yaml", "mapping"], {}),
    ("missing-file", ["run", "nosuch.yaml"], {}, ["nosuch.yaml"], {}),
    ("validate-missing-file", ["validate", "nosuch.yaml"], {}, ["nosuch.yaml"], {}),
    ("validate-no-argument", ["validate"], {}, ["JOB"], {}),
    # --- more bad flags of run
    ("steps-flag-zero", ["run", "j.yaml", "--steps", "0"], {"j.yaml": GOOD}, ["--steps"], {}),
    ("inject-unknown-kind", ["run", "j.yaml", "--inject-failure", "disk:rank=1:step=2"], {"j.yaml": GOOD},
     ["--inject-failure", "disk"], {}),
    ("unhealthy-node-unknown", ["run", "j.yaml", "--unhealthy-node", "node-99:compute"], {"j.yaml": GOOD},
     ["--unhealthy-node", "node-99", "KIND one of compute, slow, network"], {}),
    ("unhealthy-node-check-off", ["run", "j.yaml", "--unhealthy-node", "node-1:slow"], {"j.yaml": GOOD},
     ["--unhealthy-node", "spec.recovery.healthCheck.enabled: true"], {}),
    ("inject-rank-outside", ["run", "j.yaml", "--inject-failure", "node:rank=9:step=3"], {"j.yaml": GOOD},
     ["--inject-failure", "rank 9"], {}),
    ("inject-missing-step", ["run", "j.yaml", "--inject-failure", "trainer:rank=1"], {"j.yaml": GOOD},
     ["--inject-failure", "step"], {}),
    ("inject-flip-no-tier", ["run", "j.yaml", "--inject-failure", "flip:rank=1:step=2"], {"j.yaml": GOOD},
     ["--inject-failure", "missing tier"], {}),
    ("inject-redis-rank", ["run", "j.yaml", "--inject-failure", "redis:rank=1:step=2"], {"j.yaml": GOOD},
     ["--inject-failure", "leave out rank"], {}),
    ("inject-minio-without-minio", ["run", "j.yaml", "--inject-failure", "minio:step=2"], {"j.yaml": GOOD},
     ["--inject-failure", "starts no MinIO"], {}),
    ("spares-per-node-negative", ["run", "j.yaml", "--spares-per-node", "-1"], {"j.yaml": GOOD},
     ["--spares-per-node"], {}),
    ("standby-negative", ["run", "j.yaml", "--standby-nodes", "-1"], {"j.yaml": GOOD}, ["--standby-nodes"], {}),
    ("slot-mib-not-int", ["run", "j.yaml", "--slot-mib", "lots"], {"j.yaml": GOOD}, ["--slot-mib"], {}),
    ("slot-mib-beyond-memory", ["run", "j.yaml", "--slot-mib", "100000000"], {"j.yaml": GOOD},
     ["--slot-mib", "memory"], {}),
    ("unknown-option", ["run", "j.yaml", "--bogus"], {"j.yaml": GOOD}, ["--bogus"], {}),
    ("several-flags-at-once", ["run", "j.yaml", "--timeout", "0", "--slot-mib", "0"], {"j.yaml": GOOD},
     ["--timeout", "--slot-mib"], {}),
    # --- more ckpt
    ("ls-s3-bad-bucket", ["ckpt", "ls", "s3://Bad_Bucket!/x", "--s3-endpoint", "127.0.0.1:9"], {}, ["Bad_Bucket!"],
     {"LIFELINE_S3_ACCESS_KEY": "a", "LIFELINE_S3_SECRET_KEY": "b"}),
    ("ls-s3-no-endpoint", ["ckpt", "ls", "s3://bucket/x"], {}, ["--s3-endpoint"], {}),
    ("export-bad-format", ["ckpt", "export", "{store}", "-j", "gpt", "--to", "pickle", "-o", "m"], {}, ["--to"], {}),
    ("show-no-such-step", ["ckpt", "show", "{store}", "-j", "gpt", "--step", "5"], {}, ["--step", "5"], {}),
    ("rm-no-such-step", ["ckpt", "rm", "{store}", "-j", "gpt", "--step", "5"], {}, ["--step", "5"], {}),
    ("gc-keep-zero", ["ckpt", "gc", "{store}", "-j", "gpt", "--keep", "0"], {}, ["--keep"], {}),
    ("import-missing-file", ["ckpt", "import", "nosuch.safetensors", "{store}", "-j", "new", "--step", "1"], {},
     ["nosuch.safetensors"], {}),
    ("import-existing-step", ["ckpt", "import", "m.safetensors", "{store}", "-j", "gpt", "--step", "8"],
     {"m.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}, ["--step", "8"], {}),
    # --- bench
    ("bench-checkpoint-repeats", ["bench", "checkpoint", "--repeats", "0"], {}, ["--repeats"], {}),
    ("bench-checkpoint-size", ["bench", "checkpoint", "--size-mib", "0"], {}, ["--size-mib"], {}),
    ("bench-checkpoint-model", ["bench", "checkpoint", "--model", "gpt"], {}, ["--model", "fsdp2"], {}),
    ("bench-sidecar-sizes", ["bench", "sidecar", "--sizes", "huge"], {}, ["--sizes"], {}),
    ("bench-sidecar-repeats", ["bench", "sidecar", "--repeats", "0"], {}, ["--repeats"], {}),
    ("bench-recovery-fail-step", ["bench", "recovery", "--steps", "10", "--fail-step", "12"], {}, ["--fail-step"], {}),
    ("bench-recovery-steps", ["bench", "recovery", "--steps", "0"], {}, ["--steps"], {}),
    ("bench-operator-steps", ["bench", "operator", "--steps", "0"], {}, ["--steps"], {}),
    ("bench-operator-cluster", ["bench", "operator", "--cluster", "minikube"], {}, ["--cluster", "kind or dev"], {}),
    # --- kind
    ("kind-build-unknown", ["kind", "build", "everything"], {}, ["everything", "base, services, lifeline, node"], {}),
    ("bench-crash-trials", ["bench", "crash", "--trials-s3", "-1"], {}, ["--trials-s3"], {}),
    ("bench-crash-no-trials", ["bench", "crash", "--trials", "0"], {}, ["--trials"], {}),
    ("bench-chaos-trials", ["bench", "chaos", "--trials", "0"], {}, ["--trials"], {}),
    ("bench-chaos-steps", ["bench", "chaos", "--steps", "10", "--persist-every", "4"], {}, ["--steps", "multiple"], {}),
    ("bench-chaos-faults", ["bench", "chaos", "--faults", "trainer,disk"], {}, ["--faults", "disk"], {}),
    ("bench-chaos-bed", ["bench", "chaos", "--bed", "kind"], {}, ["--bed"], {}),
    ("bench-state-dir-file", ["bench", "recovery", "--state-dir", "f"], {"f": "x"}, ["--state-dir"], {}),
    ("bench-reshard-gib", ["bench", "reshard", "--gib", "0"], {}, ["--gib"], {}),
    ("bench-reshard-changes", ["bench", "reshard", "--changes", "4:4"], {}, ["--changes", "4:2,2:4"], {}),
    ("bench-reshard-changes-text", ["bench", "reshard", "--changes", "four"], {}, ["--changes"], {}),
]


# The cases that run as a subprocess (module docstring), and why; every other case runs in this process.
SUBPROCESS = {
    "operator-no-kubeconfig": "the operator role: configures logging and runs kopf's asyncio loop and HTTP "
                              "endpoints until SIGTERM; HOME and KUBECONFIG are read by the Kubernetes client",
    "persist-uri-flag": "run: one of the checks that once ran after services had started (issue 16)",
    "s3-no-credentials": "run: S3 credentials from the environment; once checked after services had started",
    "inject-minio-without-minio": "run with an injection that starts and takes down MinIO",
    "bench-crash-trials": "bench crash forks a zygote that forks savers and sets SIGCHLD to SIG_IGN",
    "bench-chaos-faults": "bench chaos kills and SIGSTOPs the processes of whole runs",
    "bench-sidecar-sizes": "bench sidecar starts Redis, MinIO and sidecar servers in sessions of their own "
                           "(stopped by killpg)",
    "unknown-option": "a usage error through python -m lifeline itself: __main__, the real sys.stderr, the "
                      "interpreter's exit status",
}


def _fill(text: str, cwd: Path, store: Path) -> str:
    return text.replace("{cwd}", str(cwd)).replace("{store}", str(store))


@pytest.mark.parametrize(("case", "argv", "files", "expected", "env"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, ckpt_store, case, argv, files, expected, env):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name, content in files.items():
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(_fill(content, cwd, ckpt_store))
    before, store_before = snapshot(cwd), snapshot(ckpt_store)
    run = run_cli if case in SUBPROCESS else run_cli_here
    res = run([_fill(a, cwd, ckpt_store) for a in argv], cwd=cwd,
              env={k: _fill(v, cwd, ckpt_store) for k, v in env.items()}, drop_env=NO_S3_KEYS)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, (res.returncode, res.stderr, res.stdout[-2000:])
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: "), lines[0]
    for fragment in expected:
        assert _fill(fragment, cwd, ckpt_store) in lines[0], (fragment, lines[0])
    assert not res.leftovers, f"processes left running: {res.leftovers}"
    assert snapshot(cwd) == before, "nothing may be written"
    assert snapshot(ckpt_store) == store_before, "the checkpoint store must not change"


def test_at_least_forty_cases():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)
    assert set(SUBPROCESS) <= {c[0] for c in CASES}, set(SUBPROCESS) - {c[0] for c in CASES}
