"""``kubectl drain`` of a running job's node on the dev cluster, with the chart's operator and real trainers:
a planned migration (docs/preemption.md, "On Kubernetes"). The job's PodDisruptionBudget lets the drain
evict the rank's pod; its trainer gets SIGTERM, checkpoints the step it completes to a peer's L1 within
the pod's grace while its sidecar keeps serving, and leaves; the operator plans only then, and the plan
restores that step with the rank on another node: no step lost."""

from __future__ import annotations

import pytest
import yaml

from _e2e import EXAMPLE, STEPS, _forget_l2, _get, _story, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_kubectl_drain_of_a_jobs_node_is_a_migration_that_loses_no_step(devcluster, operator_release):
    ns, name = operator_release, "drained"
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = name
    spec = body["spec"]
    # 4x the other runs' steps: the drain cordons, then evicts pod by pod through the budget, and in a CI
    # run (stop 38's rehearsal) 40 steps ended before the rank's eviction reached it (no recovery at all)
    spec.update(replicas=2, steps=4 * STEPS, layout={"tensor": 1, "pipeline": 1, "data": 2, "expert": 1})
    spec["checkpoint"]["every"] = 3  # the preempted step is saved by every rank after their agreement
    spec["checkpoint"]["persist"]["every"] = 12
    spec["recovery"].pop("elastic")
    spec["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3"}}  # one rank per node
    _forget_l2(devcluster, name)
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def progressed():
        st = _get(devcluster, "trainingjob", name, "-n", ns).get("status") or {}
        return st if st.get("phase") == "Running" and (st.get("step") or 0) >= 5 else None

    _wait("training to pass step 5", progressed, timeout=300)
    pdb = _get(devcluster, "pdb", f"{name}-lifeline", "-n", ns)
    assert pdb["spec"]["minAvailable"] == 1
    pod = _get(devcluster, "pod", f"{name}-1", "-n", ns)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 60
    node = pod["spec"]["nodeName"]
    try:
        devcluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=240s",
                           timeout=300)

        def finished():
            st = _get(devcluster, "trainingjob", name, "-n", ns).get("status") or {}
            return st if st.get("phase") in ("Succeeded", "Failed") else None

        st = _wait("the job to finish", finished, timeout=600)
    except Exception:
        print(_story(devcluster, ns, name))
        raise
    finally:
        devcluster.kubectl("uncordon", node, check=False)
    history = [(r["kind"], r["ranks"], r.get("fromStep"), r.get("reason", "")[:300]) for r in st.get("recoveries", [])]
    print(f"drained {node}; recoveries: {history}")
    assert st["phase"] == "Succeeded", f"{st.get('message')}; recoveries: {history}"
    assert st["recoveries"], f"the drain migrated nothing (step {st.get('step')}):\n{_story(devcluster, ns, name)}"
    first = st["recoveries"][0]
    assert first["kind"] == "ReplacePods" and first["ranks"] == [1], history
    assert "preemption of rank 1" in first["reason"] and "0 steps lost" in first["reason"], history
    moved = _get(devcluster, "pod", f"{name}-1", "-n", ns)
    assert moved["spec"]["nodeName"] != node
