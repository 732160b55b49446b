"""Helpers of the operator's e2e tests on the dev cluster (tests/operator/test_e2e*.py): waits, reads,
a failed run's story, the example's L2 in the cluster's MinIO and a failure-free reference run."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lifeline._poll import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "lifeline"
SRC = Path(__import__("lifeline").__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gpt-moe.yaml"
STEPS = 40  # of the real-trainer run
RELEASE = "ll"
OPERATOR_SA = "ll-lifeline-operator"


def _wait(what: str, fn, timeout: float = 180.0, interval: float = 0.5):
    """Poll ``fn`` until it returns a truthy value (:func:`lifeline._poll.wait_for`); fail naming ``what``
    and the last value after ``timeout`` seconds."""
    last = [None]

    def probe():
        last[0] = fn()
        return last[0]

    try:
        return wait_for(probe, timeout, what, interval)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last[0]!r}") from None


def _get(dc, *args) -> dict:
    return json.loads(dc.kubectl("get", *args, "-o", "json"))


def _story(dc, ns: str, job: str) -> str:
    """What a failed wait shows: the job's status, its pods, and the tails of the operator's and the
    trainers' logs."""
    st = _get(dc, "trainingjob", job, "-n", ns).get("status") or {}
    out = [f"status: {st.get('phase')} {st.get('message')!r} layout={st.get('layout')} step={st.get('step')}",
           *(f"  recovery {r}" for r in st.get("recoveries", []))]
    for pod in _get(dc, "pods", "-n", ns)["items"]:
        meta = pod["metadata"]
        out.append(f"pod {meta['name']} node={pod['spec'].get('nodeName')} phase={pod['status'].get('phase')} "
                   f"gen={meta.get('labels', {}).get('lifeline.dev/generation')} deleting={bool(meta.get('deletionTimestamp'))}")
        for c, previous in ((c, p) for c in pod["spec"]["containers"] for p in (True, False)):
            try:
                path = Path(dc.log_path(meta["name"], c["name"], namespace=ns, previous=previous))
                lines = [f"{'(previous) ' if previous else ''}{line}" for line in
                         path.read_text(errors="replace").splitlines()]
            except (OSError, Exception):  # noqa: BLE001 - diagnostics only (no previous run, no log)
                continue
            errors = [line for line in lines[:-8] if "error" in line.lower() or "Traceback" in line][-10:]
            out += [f"    {c['name']}: {line[:400]}" for line in errors + lines[-8:]]
    return "\n".join(out)


def _reference_digest(body: dict, tmp_path: Path) -> str:
    """Digest of the final state of ``lifeline run`` of the same spec without failures (local
    processes, their own Redis, L2 on the filesystem)."""
    import subprocess
    import sys

    job = tmp_path / "reference.yaml"
    job.write_text(yaml.safe_dump(body))
    p = subprocess.run(
        [sys.executable, "-m", "lifeline", "run", str(job), "--json", "--state-dir", str(tmp_path / "reference"),
         "--persist-uri", str(tmp_path / "reference-l2"), "--timeout", "600"],
        capture_output=True, text=True, cwd=ROOT, timeout=660)
    assert p.returncode == 0, f"the failure-free reference run failed:\n{p.stderr[-3000:]}"
    digest = json.loads(p.stdout.strip().splitlines()[-1])["digest"]
    assert (digest["source"], digest["step"]) == ("L2", STEPS), digest
    return digest["sha256"]


def _l2(devcluster):
    """``(storage, prefix)`` of the example's L2 URI in the cluster's MinIO."""
    from lifeline.checkpoint import StorageOptions, storage_from_uri

    uri = yaml.safe_load(EXAMPLE.read_text())["spec"]["checkpoint"]["persist"]["uri"]
    return storage_from_uri(uri, StorageOptions(endpoint=devcluster.minio_endpoint,
                                                access_key=devcluster.minio_access_key,
                                                secret_key=devcluster.minio_secret_key))


def _forget_l2(devcluster, job: str) -> None:
    storage, prefix = _l2(devcluster)
    for key in storage.list(f"{prefix.strip('/')}/{job}/"):
        storage.delete(key)


def _l2_digest(devcluster, job: str, step: int) -> str:
    """SHA-256 of the consolidated state of ``job``'s checkpoint ``step`` in the cluster's MinIO."""
    from lifeline.checkpoint import consolidate
    from lifeline.launch.summary import await_l2_step, state_digest

    storage, prefix = _l2(devcluster)
    assert await_l2_step(storage, prefix, job, step, 120.0), f"step {step} of {job} never reached L2"
    return state_digest(consolidate(storage, prefix, job, step))
