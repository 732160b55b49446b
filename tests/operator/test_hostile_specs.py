"""Hostile specs (issue 15): hypothesis-made invalid TrainingJobs against the real kube-apiserver of
the dev cluster with the real operator running (``python -m lifeline operator``, a subprocess).

Each document (:mod:`tests.operator._hostile`) must end one of three ways:

* **schema_rejected**: the API server refuses it (CRD schema, CEL, strict field validation)
  with a message naming the mutated field;
* **marked_failed**: accepted, then marked Failed by the operator, reason ``InvalidSpec``, a
  message naming the field, exactly once (``lifeline_operator_reconciles_total{outcome=
  "invalid_spec"}`` is 1 and stays 1);
* **accepted_valid**: the mutation left a runnable job: the operator creates all its pods;
* **too_large**: the document is over the API server's request limit (3 MiB; huge strings JSON-
  escaped): refused with 413 before it is read, so no field can be named. Counted apart.

Never a crash (the operator process exits, or a reconcile raises a Python error) and never a
retry loop (a job's reconcile count keeps growing). A retry loop is caught by the operator's own
per-job counters: after the last document, the test awaits three more resync ticks of a valid
canary job and checks that no hostile job's count moved, and that the operator's debug log of that
window has no line of kopf retrying (a patch kopf cannot apply, a handler failed temporarily).

``LIFELINE_FUZZ_EXAMPLES`` (default 40) sets the number of generated documents; the seed is fixed
(hypothesis ``derandomize``). The tally is printed as one ``HOSTILE {json}`` line (``pytest -s``)
and written to ``$LIFELINE_FUZZ_REPORT`` when set.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
import urllib3
from hypothesis import HealthCheck, Phase, example, given, settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from lifeline._poll import wait_for
from lifeline.api.crd import CRD_NAME, CRD_PATH
from lifeline.api.trainingjob import GROUP, PLURAL, VERSION

from _hostile import apply_mutations, base_job, mutations

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("LIFELINE_FUZZ_EXAMPLES", "40"))
OUTCOME_TIMEOUT = 60.0  # seconds for the operator to mark or run one accepted document
REQUEST_TIMEOUT = 30  # seconds for one API request (a hang is a finding, not a stuck test)
RETRY_BOUND = 2  # retried reconciles one job may have (a transient API error), never more
LOOP_LINES = ("Could not apply the patch", "failed temporarily", "Traceback")  # kopf retrying, at debug level
CRASH_FREE = {"InvalidSpec", "ApiException", "CatalogError", "MaxRetryError", "ProtocolError"}

# The defects found earlier, replayed first (hypothesis' explicit phase).
ENV_AS_MAP = [("replace", ("template", "spec", "containers", 0, "env"), {"FOO": {"nested": "bar"}})]
POD_REFUSED = [("replace", ("template", "spec", "containers", 0, "ports"), [{"containerPort": -1}])]
BAD_QUANTITY = [("replace", ("template", "spec", "containers", 0, "resources"), {"requests": {"cpu": "lots"}})]
BAD_RECORD = [("annotate", ("lifeline.dev/applied",), "[1]")]
LABELS_AS_LIST = [("replace", ("template", "metadata"), {"labels": ["a", "b"]})]
PRIORITY_BY_HAND = [("replace", ("template", "spec", "priority"), 60)]  # an admission plugin's 403


def _await(what: str, fn, timeout: float = OUTCOME_TIMEOUT, interval: float = 0.1):
    """Await ``fn`` returning a truthy value (:func:`lifeline._poll.wait_for`, the shared loop)."""
    return wait_for(fn, timeout, what, interval)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Operator:
    """The operator as a subprocess watching one namespace, its ``/metrics`` on loopback."""

    def __init__(self, devcluster, namespace: str, log_path: Path):
        self.namespace = namespace
        self.port = _free_port()
        env = {**os.environ, "KUBECONFIG": str(devcluster.kubeconfig),
               "LIFELINE_OPERATOR_REDIS_URL": devcluster.redis_url, "LIFELINE_OPERATOR_RESYNC_SECONDS": "1",
               "LIFELINE_OPERATOR_BIND_ADDRESS": "127.0.0.1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lifeline", "operator", "-n", namespace, "--metrics-port", str(self.port),
             "--liveness-port", "-1", "--verbose"], env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metrics(self) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        """``(job, outcome) -> reconciles`` of this namespace and ``error class -> reconcile errors``."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        reconciles: dict[tuple[str, str], float] = {}
        errors: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "lifeline_operator_reconciles_total" and s.labels["namespace"] == self.namespace:
                    reconciles[(s.labels["job"], s.labels["outcome"])] = s.value
                elif s.name == "lifeline_operator_reconcile_errors_total":
                    errors[s.labels["error"]] = s.value
        return reconciles, errors

    def counts(self, job: str) -> dict[str, float]:
        reconciles, _ = self.metrics()
        return {o: reconciles.get((job, o), 0.0) for o in ("ok", "invalid_spec", "retry")}

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def crd(devcluster):
    """The TrainingJob CRD, Established (applied unless already there; left as found)."""
    existing = devcluster.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name").strip()
    if not existing:
        devcluster.kubectl("apply", "--server-side", "--field-manager=lifeline-test", "-f", str(ROOT / CRD_PATH))
    devcluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    yield CRD_NAME
    if not existing:
        devcluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=120s", timeout=150)


@pytest.fixture(scope="module")
def fuzz(devcluster, crd, tmp_path_factory):
    """A namespace, the operator watching it, a valid canary job (its ticks are the clock), and
    the Kubernetes clients. Yields a namespace of attributes."""
    ns = f"fuzz-{uuid.uuid4().hex[:6]}"
    devcluster.create_namespace(ns)
    op = Operator(devcluster, ns, tmp_path_factory.mktemp("hostile") / "operator.log")
    api = devcluster.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, base_job("canary"))
        def canary_ran():
            assert op.alive(), f"the operator exited; log: {op.log_path}"
            try:
                return op.counts("canary")["ok"] >= 1
            except OSError:  # /metrics not served yet
                return False

        _await("the operator to run the canary", canary_ran, timeout=120)
        yield type("Fuzz", (), dict(ns=ns, op=op, custom=custom, core=core))
    finally:
        try:  # while the operator runs: it removes kopf's finalizers
            custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
            _await("the fuzzed jobs to be deleted",
                   lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"], timeout=120)
        finally:
            op.stop()
            devcluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
        print(f"operator log: {op.log_path}")


def _message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body).get("message", err.body))
    except (TypeError, ValueError, AttributeError):
        return str(err.body or err.reason)


def _names(muts) -> list[str]:
    """What a refusal or a Failed message may name for these mutations: a field's top two levels."""
    out = []
    for op, path, _ in muts:
        if op == "annotate":
            out += ["metadata.annotations", path[0]]
        elif op == "layout":
            out += ["spec.layout", "spec.replicas"]
        else:
            out.append("spec." + str(path[0]))
    return out


class Run:
    """One fuzz run: applies documents, classifies outcomes, keeps the tally."""

    def __init__(self, fz):
        self.fz = fz
        self.tally = Counter(tried=0, schema_rejected=0, too_large=0, marked_failed=0, accepted_valid=0, crashes=0,
                             retry_loops=0, unhandled=0)
        self.problems: list[str] = []
        self.failed: dict[str, dict[str, float]] = {}  # job -> counts when it was marked Failed
        self.valid: list[str] = []

    def one(self, muts) -> None:
        fz = self.fz
        self.tally["tried"] += 1
        name = f"h-{self.tally['tried']:04d}"
        body = apply_mutations(base_job(name), muts)
        try:
            fz.custom.create_namespaced_custom_object(GROUP, VERSION, fz.ns, PLURAL, body, field_validation="Strict",
                                                      _request_timeout=REQUEST_TIMEOUT)
        except (urllib3.exceptions.HTTPError, OSError) as err:  # the API server did not answer in time
            self.problems.append(f"{name}: no answer to the create in {REQUEST_TIMEOUT}s: {err!s:.200} <- {muts!r:.300}")
            return
        except ApiException as err:
            msg = _message(err)
            if err.status in (400, 422) and any(n in msg for n in _names(muts)):
                self.tally["schema_rejected"] += 1
            elif err.status == 413:  # over the API server's 3 MiB request limit: refused unread, no field to name
                self.tally["too_large"] += 1
            else:
                self.problems.append(f"{name}: refused ({err.status}) without naming {_names(muts)}: {msg[:300]} "
                                     f"<- {muts!r:.300}")
            return
        try:
            outcome = _await(f"{name} to be marked Failed or run", lambda: self._outcome(name, body))
        except TimeoutError as err:
            self.tally["unhandled"] += 1
            self.problems.append(f"{name}: neither Failed nor running: {err!s:.300} <- {muts!r:.300}")
            return
        if outcome == "crashed":
            return
        if outcome == "valid":
            self.tally["accepted_valid"] += 1
            self.valid.append(name)
            fz.custom.delete_namespaced_custom_object(GROUP, VERSION, fz.ns, PLURAL, name)
            return
        st = outcome
        ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
        if ready.get("reason") != "InvalidSpec" or not any(n in st.get("message", "") for n in _names(muts) + ["spec."]):
            self.problems.append(f"{name}: Failed without an InvalidSpec reason naming a field: {st!r:.400}")
        self.tally["marked_failed"] += 1
        self.failed[name] = fz.op.counts(name)

    def _outcome(self, name: str, body: dict):
        fz = self.fz
        if not fz.op.alive():
            self.tally["crashes"] += 1
            self.problems.append(f"{name}: the operator exited with {fz.op.proc.returncode}")
            pytest.fail(f"the operator crashed on {name}; log: {fz.op.log_path}")
        st = fz.custom.get_namespaced_custom_object(GROUP, VERSION, fz.ns, PLURAL, name,
                                                    _request_timeout=REQUEST_TIMEOUT).get("status") or {}
        if st.get("phase") == "Failed" and fz.op.counts(name)["invalid_spec"] >= 1:
            return st
        if st.get("phase") in ("Pending", "Running", "Succeeded"):
            pods = fz.core.list_namespaced_pod(fz.ns, label_selector=f"lifeline.dev/job={name}").items
            if len(pods) == st.get("replicas", -1):
                return "valid"
        return None

    def _ticks(self, n: int) -> None:
        op = self.fz.op
        start = op.counts("canary")["ok"]
        _await(f"{n} resync ticks of the canary", lambda: op.counts("canary")["ok"] >= start + n)

    def settle(self) -> None:
        """Count retry loops and crashes: no hostile job's reconciles may move while the operator
        ticks the canary three times (after one tick for a reconcile racing the last Failed)."""
        op = self.fz.op
        self._ticks(1)
        before, _ = op.metrics()
        log_at = op.log_path.stat().st_size
        self._ticks(3)
        after, errors = op.metrics()
        quiet_log = op.log_path.read_bytes()[log_at:].decode(errors="replace").splitlines()
        looping = [line for line in quiet_log if any(m in line for m in LOOP_LINES)]
        if looping:
            self.tally["retry_loops"] += 1
            self.problems.append(f"{len(looping)} log lines of kopf retrying over three resync ticks, e.g. "
                                 f"{looping[0][:300]}")
        jobs = {job for job, _ in after} - {"canary"}
        for name in sorted(jobs):
            now = {o: after.get((name, o), 0.0) for o in ("ok", "invalid_spec", "retry")}
            then = {o: before.get((name, o), 0.0) for o in ("ok", "invalid_spec", "retry")}
            expected_failed = name in self.failed
            if now != then or now["retry"] > RETRY_BOUND or now["invalid_spec"] != (1 if expected_failed else 0):
                self.tally["retry_loops"] += 1
                self.problems.append(f"{name}: reconciles {then} -> {now} over three resync ticks "
                                     f"(marked Failed: {expected_failed})")
        for error, n in errors.items():
            if error not in CRASH_FREE:
                self.tally["crashes"] += int(n)
                self.problems.append(f"{n:.0f} reconciles raised {error} (a handler crash); see {op.log_path}")
        if not op.alive():
            self.tally["crashes"] += 1
            self.problems.append(f"the operator exited with {op.proc.returncode}")


def test_hostile_specs_are_rejected_or_failed_once(fuzz):
    run = Run(fuzz)

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @example(ENV_AS_MAP)
    @example(POD_REFUSED)
    @example(BAD_QUANTITY)
    @example(BAD_RECORD)
    @example(LABELS_AS_LIST)
    @example(PRIORITY_BY_HAND)
    @given(mutations())
    def hostile(muts):
        run.one(muts)

    hostile()
    run.settle()
    report = dict(run.tally, examples=EXAMPLES)
    print("HOSTILE " + json.dumps(report, sort_keys=True))
    if os.environ.get("LIFELINE_FUZZ_REPORT"):
        Path(os.environ["LIFELINE_FUZZ_REPORT"]).write_text(json.dumps({**report, "problems": run.problems}, indent=1))
    assert run.tally["tried"] == run.tally["schema_rejected"] + run.tally["too_large"] + run.tally["marked_failed"] + \
        run.tally["accepted_valid"] + run.tally["unhandled"] + len([p for p in run.problems if "refused" in p])
    assert not run.problems, "\n".join(run.problems[:30])
    assert (run.tally["crashes"], run.tally["retry_loops"], run.tally["unhandled"]) == (0, 0, 0)
    assert run.tally["schema_rejected"] > 0 and run.tally["marked_failed"] > 0  # both defences were exercised
