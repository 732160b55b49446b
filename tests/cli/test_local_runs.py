"""``lifeline validate`` and the local-run commands (``jobs``, ``describe``, ``logs``, ``stop``) on a fake state dir."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from lifeline.cli import app
from lifeline.errors import ConfigError
from lifeline.launch.local_runs import find_runs, open_run, stop_run

from ._cli import run_cli
from .test_bad_input import job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

runner = CliRunner()


def test_validate_ok_is_one_line(tmp_path):
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(job()).replace("{cwd}", str(tmp_path)))
    res = run_cli(["validate", "j.yaml"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines() == [res.stdout.strip()] and res.stdout.startswith("ok: j.yaml: ")
    assert "4 ranks" in res.stdout and not (tmp_path / ".state").exists()


def _fake_run(root, name, *, launcher, phase=None):
    state = root / name
    (state / "logs").mkdir(parents=True)
    (state / "processes.json").write_text(json.dumps({"launcher": launcher, "redis": 999999,
                                                      "ranks": {"0": {"trainer": 999998}}, "spares": []}))
    (state / "run.json").write_text(json.dumps({"job": name, "ranks": 1, "steps": 5, "started_at": time.time(),
                                                "launcher": launcher}))
    if phase:
        (state / "summary.json").write_text(json.dumps({"job": name, "phase": phase, "step": 5}))
    (state / "logs" / "rank-0-node-0-trainer.log").write_text("step 1\nstep 2\n")
    (state / "logs" / "rank-0-node-0-sidecar.log").write_text("sidecar up\n")
    return state


@pytest.fixture
def sleeper():
    """A real child process whose command line names lifeline (as a launcher's does)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; sys.argv.append('lifeline'); time.sleep(60)",
                             "lifeline"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_jobs_describe_logs(tmp_path, sleeper):
    root = tmp_path / "run"
    _fake_run(root, "done", launcher=999997, phase="Succeeded")
    _fake_run(root, "live", launcher=sleeper.pid)
    assert {r.name: r.status for r in find_runs(root)} == {"done": "Succeeded", "live": "running"}
    res = runner.invoke(app, ["jobs", "--root", str(root), "--json"])
    assert res.exit_code == 0, res.output
    assert {d["job"]: d["status"] for d in json.loads(res.output)} == {"done": "Succeeded", "live": "running"}
    res = runner.invoke(app, ["describe", "live", "--root", str(root), "--json"])
    doc = json.loads(res.output)
    assert doc["status"] == "running" and doc["processes"]["launcher"] == sleeper.pid
    res = runner.invoke(app, ["logs", "done", "--root", str(root), "--rank", "0", "--role", "trainer"])
    assert res.exit_code == 0 and res.output == "step 1\nstep 2\n"
    res = runner.invoke(app, ["logs", "done", "--root", str(root)])
    assert "rank-0-node-0-sidecar| sidecar up" in res.output
    res = runner.invoke(app, ["logs", "done", "--root", str(root), "--rank", "3"])
    assert isinstance(res.exception, ConfigError) and res.exception.field == "--rank"
    with pytest.raises(ConfigError, match="runs there: done, live"):
        open_run("nosuch", root)


def test_stop_terminates_the_launcher(tmp_path, sleeper):
    root = tmp_path / "run"
    _fake_run(root, "live", launcher=sleeper.pid)
    report = stop_run(open_run("live", root), grace=10)
    assert report["stopped"] and report["launcher"] == sleeper.pid and not report["left"]
    assert sleeper.wait(timeout=5) == -15  # SIGTERM
    res = runner.invoke(app, ["stop", "live", "--root", str(root)])
    assert res.exit_code == 0 and "not running" in res.output
