"""Bad input fails before anything starts, naming the field; the spec -> process env mapping is the operator's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lifeline.api.pod import SidecarSettings, TrainerSettings
from lifeline.errors import ConfigError
from lifeline.launch.env import Secrets, rank_processes
from lifeline.launch.inject import Injection, parse_injection, random_injections
from lifeline.launch.spec import load_for_launch

from ._jobs import job_doc, write_job


def _field(doc: dict) -> str:
    with pytest.raises(ConfigError) as err:
        load_for_launch(doc)
    return err.value.field


def test_replicas_must_match_layout():
    doc = job_doc("bad")
    doc["spec"]["replicas"] = 3
    assert _field(doc) == "spec.replicas"


def test_a_model_is_checked_only_when_a_checker_is_registered_for_it():
    """The job's model is spec.model.name; without one, gpt-moe only when the command is the reference
    trainer: a script of one's own with no model name is not checked (docs/sdk.md)."""
    own = ["python", "examples/ddp/train.py"]
    doc = job_doc("own")
    doc["spec"]["model"] = {"args": {"d_model": -1}}  # the reference checker would refuse this
    assert _field(doc) == "spec.model.args.d_model"  # reference command, no name: gpt-moe is checked
    doc["spec"]["template"]["spec"]["containers"][0]["command"] = own
    assert load_for_launch(doc).name == "own"  # own command, no name: no model, no check
    doc["spec"]["model"]["name"] = "gpt-moe"
    assert _field(doc) == "spec.model.args.d_model"  # named: its registered checker runs
    doc["spec"]["model"]["name"] = "my-mlp"
    assert load_for_launch(doc).name == "own"  # no checker registered for it: not checked


def test_unknown_field_is_named():
    doc = job_doc("bad")
    doc["spec"]["checkpoint"]["everyy"] = 2
    assert _field(doc) == "spec.checkpoint.everyy"


def test_trainer_container_required_and_needs_a_command():
    doc = job_doc("bad")
    doc["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    assert _field(doc) == "spec.template.spec.containers"
    doc = job_doc("bad")
    del doc["spec"]["template"]["spec"]["containers"][0]["command"]
    assert _field(doc) == "spec.template.spec.containers[0].command"


def test_layout_the_model_cannot_take():
    assert _field(job_doc("bad", pipeline=4, data=1)) == "spec.layout.pipeline"  # 4 stages, 2 layers
    doc = job_doc("bad")
    doc["spec"]["layout"]["tensor"], doc["spec"]["replicas"] = 3, 12  # 3 does not divide n_heads=4
    assert _field(doc) == "spec.layout.tensor"
    doc["spec"]["layout"]["tensor"], doc["spec"]["replicas"] = 2, 8  # tensor parallel is supported
    assert load_for_launch(doc) is not None


def test_bad_model_argument():
    doc = job_doc("bad")
    doc["spec"]["model"]["args"]["d_model"] = 30  # not n_heads x an even head size
    assert _field(doc) == "spec.model.args.d_model"
    doc["spec"]["model"]["args"] = {"d_modle": 32}
    assert _field(doc) == "spec.model.args.d_modle"


def test_inject_failure_parsing():
    assert parse_injection("node:rank=2:step=35", world_size=4, steps=60) == Injection("node", 2, 35)
    assert parse_injection("trainer:step=3:rank=0") == Injection("trainer", 0, 3)
    assert parse_injection("node:rank=1:step=60", world_size=4, steps=60) == Injection("node", 1, 60)  # a late failure
    for text in ("disk:rank=1:step=2", "trainer:rank=1", "trainer:rank=x:step=2", "trainer:rank=4:step=2",
                 "trainer:rank=1:step=61", "hang:rank=1:step=60", "trainer:rank=1:step=60:when=recovery",
                 "trainer:rank=1:step=2:color=red"):
        with pytest.raises(ConfigError) as err:
            parse_injection(text, world_size=4, steps=60)
        assert err.value.field == "--inject-failure", text
    a = random_injections(3, ("trainer", "node"), world_size=4, steps=12)
    assert a == random_injections(3, ("trainer", "node"), world_size=4, steps=12)
    assert a[0].step < a[1].step < 11 and all(0 <= i.rank < 4 for i in a)


def test_cli_rejects_bad_input_before_starting_anything(tmp_path):
    doc = job_doc("bad")
    doc["spec"]["replicas"] = 3
    job = write_job(tmp_path / "bad.yaml", doc)
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-m", "lifeline", "run", str(job), "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "spec.replicas (3) must equal" in proc.stderr
    assert not state.exists(), "nothing may start (not even the state dir) for a bad spec"
    good = write_job(tmp_path / "good.yaml", job_doc("good"))
    proc = subprocess.run([sys.executable, "-m", "lifeline", "run", str(good), "--state-dir", str(state),
                           "--inject-failure", "node:rank=9:step=3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "rank 9 outside [0, 4)" in proc.stderr
    assert not state.exists()


def _settings(cls, env, monkeypatch):
    """Load ``cls`` from exactly the ``LIFELINE_*`` variables of ``env`` (as the process would)."""
    import os

    for name in [k for k in os.environ if k.startswith("LIFELINE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("LIFELINE_"):
            monkeypatch.setenv(name, value)
    return cls.load()


def test_rank_processes_env_is_the_operators_pod_resolved(tmp_path, monkeypatch):
    job = load_for_launch(job_doc("envjob"))
    procs = rank_processes(job, 3, layout=job.spec.layout, generation=0, node="node-5", pod_ip="127.0.0.7",
                           arena_dir=tmp_path / "arena", redis_url="redis://127.0.0.1:1/0",
                           secrets=Secrets("k" * 32, "ak", "sk"), persist_uri="file:///tmp/l2")
    assert procs.trainer.argv[:3] == (sys.executable, "-m", "lifeline")
    assert procs.sidecar.argv == (sys.executable, "-m", "lifeline", "sidecar")
    side = _settings(SidecarSettings, procs.sidecar.env, monkeypatch)
    assert (side.rank, side.world_size, side.node, side.pod_ip) == (3, 4, "node-5", "127.0.0.7")
    assert side.secret.get_secret_value() == "k" * 32 and side.persist_uri == "file:///tmp/l2"
    assert side.persist_every == 4 and side.peer_replicas == 1 and side.peer_port == 0
    assert str(side.arena_dir) == str(tmp_path / "arena")
    trainer = _settings(TrainerSettings, procs.trainer.env, monkeypatch)
    assert trainer.layout == {"tensor": 1, "pipeline": 2, "data": 2, "expert": 1}
    assert trainer.steps == 12 and trainer.model["seed"] == 7 and trainer.model["d_model"] == 32
    assert trainer.collective_timeout_seconds == 20  # the template's own env reaches the trainer
    assert procs.trainer.env["GLOO_SOCKET_IFNAME"] == "lo"


def test_negative_spare_counts_name_the_option(tmp_path):
    from lifeline.errors import ConfigError
    from lifeline.launch.supervisor import LaunchOptions

    for name in ("spares_per_node", "standby_nodes"):
        with pytest.raises(ConfigError) as err:
            LaunchOptions(state_dir=tmp_path, **{name: -1})
        assert err.value.field == name and f"--{name.replace('_', '-')}" in str(err.value)
