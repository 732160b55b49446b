"""Template processes (real processes, no torch): a forked spare is the launcher's own child and runs
its assignment exactly as a fresh spare does; a template that is not single-threaded refuses to
fork and the pool falls back to fresh spares; the pool forks spares by node and role."""

from __future__ import annotations

import json
import os
import signal
import sys

from lifeline._poll import wait_for
from lifeline.launch.env import ProcessSpec


def _base(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}, **extra}


def _template(tmp_path, modules=("json",), **env):
    from lifeline.launch.templates import Template, await_ready

    template = Template("trainer", _base(**env), tmp_path / "template.log", modules)
    await_ready([template], 60)
    return template


def test_a_forked_spare_is_our_child_and_runs_its_assignment_with_its_env_log_and_exit_code(tmp_path):
    from lifeline.launch.spare_pool import Spare

    script = tmp_path / "container.py"
    script.write_text("import os, sys, json\n"
                      "print(json.dumps({'x': os.environ.get('LIFELINE_X'), 'inherited': os.environ.get('ONLY_SPARE'),"
                      " 'argv': sys.argv[1:], 'json_loaded': 'json' in sys.modules, 'ppid': os.getppid()}))\n"
                      "sys.exit(3)\n")
    template = _template(tmp_path, ONLY_SPARE="1")
    try:
        assert template.ready() and template.failure is None
        spare = Spare.fork("node-0", "trainer", template, tmp_path / "spare.log")
        wait_for(spare.ready, 30, "the forked spare's ready line", 0.01)
        proc = spare.assign(ProcessSpec((sys.executable, str(script), "a", "b"), _base(LIFELINE_X="rank-env")),
                            tmp_path / "trainer.log")
        assert proc.wait(timeout=60) == 3  # waitpid on a forked process: it was adopted by this one
    finally:
        template.stop()
    assert template.proc.returncode == 0  # EOF on its socket ends it
    lines = [json.loads(line) for line in (tmp_path / "trainer.log").read_text().splitlines() if line.startswith("{")]
    assert lines[0]["event"] == "spare_assigned" and lines[0]["pid"] == proc.pid
    assert lines[1] == {"x": "rank-env", "inherited": None, "argv": ["a", "b"], "json_loaded": True,
                        "ppid": os.getpid()}


def test_a_signal_to_a_forked_spare_is_seen_in_its_exit_status(tmp_path):
    from lifeline.launch.spare_pool import Spare

    template = _template(tmp_path)
    try:
        spare = Spare.fork("node-0", "trainer", template, tmp_path / "spare.log")
        proc = spare.assign(ProcessSpec((sys.executable, "-c", "import signal; print('up', flush=True); signal.pause()"),
                                        _base()), tmp_path / "trainer.log")
        log = tmp_path / "trainer.log"
        wait_for(lambda: log.exists() and "up" in log.read_text(), 30, "the assignment to run", 0.01)
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        template.stop()


def test_a_template_with_a_second_thread_refuses_to_fork_and_the_pool_starts_fresh_spares(tmp_path, monkeypatch):
    import lifeline.launch.spare_pool as spares

    (tmp_path / "threaded.py").write_text("import threading, time\n"
                                          "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    monkeypatch.setattr(spares, "PRELOAD", {"trainer": ("threaded",)})
    env = _base(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    pool = spares.SparePool({"trainer": env}, tmp_path, templates=True)
    try:
        pool.start_templates()
        template = pool.templates["trainer"]
        wait_for(lambda: template.ready() or template.failure is not None, 60, "the template's verdict", 0.02)
        assert not template.ready() and "2 threads" in template.failure
        spare = pool.fill([("node-0", "trainer", 1)])
        assert "trainer" in pool.no_template and "2 threads" in pool.no_template["trainer"]
        spare = spare or pool.fill([("node-0", "trainer", 1)])
        assert spare is not None and not hasattr(spare.proc, "_template")  # a fresh process
        assert pool.fresh("node-0", "trainer") is None  # no template: the caller starts a fresh process
    finally:
        pool.close()


def test_a_pool_with_templates_forks_every_wanted_spare_once_the_template_is_ready(tmp_path, monkeypatch):
    import lifeline.launch.spare_pool as spares
    from lifeline.launch.templates import ForkedProcess

    monkeypatch.setattr(spares, "PRELOAD", {"trainer": ("json",), "sidecar": ("json",)})
    pool = spares.SparePool({"trainer": _base(), "sidecar": _base()}, tmp_path, templates=True)
    wanted = [("node-0", "trainer", 1), ("node-1", "trainer", 1), ("node-4", "sidecar", 1), ("node-4", "trainer", 1)]
    try:
        pool.warm_all(wanted, timeout=60)
        assert sorted((s.node, s.role) for s in pool.spares) == sorted((n, r) for n, r, _ in wanted)
        assert all(isinstance(s.proc, ForkedProcess) and s.ready() for s in pool.spares)
        assert set(pool.template_pids()) == {"trainer", "sidecar"}
        taken = pool.take("node-1", "trainer")
        assert taken is not None and pool.take("node-1", "trainer") is None
        again = pool.fill(wanted)  # the template is ready: the missing spare is forked at once
        assert again is not None and (again.node, again.role) == ("node-1", "trainer") and isinstance(again.proc,
                                                                                                      ForkedProcess)
        taken.stop()
        assert taken.proc.returncode is not None
    finally:
        pool.close()
    assert pool.spares == [] and pool.templates == {}
