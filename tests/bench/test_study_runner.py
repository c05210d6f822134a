"""The process pool's tasks (`bench/core/pool.py`, the GPU check's kind of
spec), run as stand-in modules that print `RESULT <json>`: a result is
recorded with its machine, a failure or a task past its time limit is
recorded with its error and never started again, a backend that is not
installed is said once and its tasks wait, a task that finds no GPU stops
the call, and nothing starts that is expected to end after the budget."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import bench
from bench.core import pool
from bench.core import provenance
from bench.core import records
from bench.core import runspec

# A task module: does what its spec's `act` says, then prints its result.
FAKE = """
import json, os, sys, time
spec = json.loads(sys.argv[1])
if spec.get("pid_file"):
    open(spec["pid_file"], "w").write(str(os.getpid()))
while spec.get("wait_for") and not os.path.exists(spec["wait_for"]):
    time.sleep(0.05)
act = spec["act"]
if act == "sleep":
    time.sleep(spec["seconds"])
if act == "until":
    time.sleep(max(0, spec["until"] - time.time()))
if act == "fail":
    sys.exit("it broke")
if act == "no_gpu":
    print("jax sees no GPU (cpu: cpu)", file=sys.stderr)
    sys.exit(3)
if act == "silent":
    sys.exit(0)
print("RESULT " + json.dumps(dict(twice=2 * spec.get("value", 1))))
"""


@pytest.fixture
def tasks(tmp_path, monkeypatch):
    """(a task spec's maker, the keyword arguments of `pool.run` with a
    log, the record's path): the stand-in module on `PYTHONPATH`."""
    (tmp_path / "fake_task.py").write_text(FAKE)
    monkeypatch.setattr(pool, "POLL", 0.05)
    log = []

    def task(model, act="print", part="x", **extra):
        return dict(part=part, model=model, module="fake_task", act=act,
                    **extra)

    record = str(tmp_path / "record.json")
    kwargs = dict(record_path=record, work_dir=str(tmp_path / "runs"),
                  workers=1, log=log.append,
                  env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    return task, kwargs, log


def test_a_task_result_is_recorded_with_its_machine_and_skipped_again(tasks):
    task, kwargs, log = tasks
    spec = task("ok", value=21, run_backend="jax")
    assert runspec.run_key(spec) == "x|ok|jax"
    finished = pool.run([spec], **kwargs)
    assert [r["result"] for r in finished] == [dict(twice=42)]
    assert finished[0]["module"] == "fake_task"
    assert provenance.machine_kind(finished[0]["machine"]).endswith("/ JAX")
    assert records.load(kwargs["record_path"]) == finished
    log.clear()
    assert pool.run([spec], **kwargs) == [] and log == []


def test_a_failed_task_is_recorded_with_its_error_and_the_next_runs(tasks):
    task, kwargs, log = tasks
    specs = [task("broken", "fail"), task("mute", "silent"), task("ok")]
    finished = pool.run(specs, **kwargs)
    assert [runspec.run_key(r) for r in finished] == ["x|ok"]
    failed = records.failures(kwargs["record_path"])
    assert [(runspec.run_key(r), r["error"].splitlines()[-1]) for r in failed] \
        == [("x|broken", "it broke"), ("x|mute", "no RESULT line")]
    assert all(r["machine"] for r in failed)
    assert "failed x|broken (exit 1): it broke" in log
    # No later call starts a failed task again.
    log.clear()
    assert pool.run(specs, **kwargs) == [] and log == []


def test_a_task_past_its_time_limit_is_stopped_and_recorded_failed(tasks):
    task, kwargs, log = tasks
    specs = [task("slow", "sleep", seconds=600, limit_seconds=1), task("ok")]
    assert [runspec.run_key(r) for r in pool.run(specs, **kwargs)] == ["x|ok"]
    (failed,) = records.failures(kwargs["record_path"])
    assert failed["error"].endswith("did not finish within 1 s")
    assert "failed x|slow (time limit): did not finish within 1 s" in log
    log.clear()
    assert pool.run(specs, **kwargs) == [] and log == []


def test_a_backend_not_installed_is_said_once_and_its_tasks_wait(tasks):
    task, kwargs, log = tasks
    absent = [task(m, run_backend="no_such_backend") for m in ("m1", "m2")]
    # A plan asked again after each finished task says it once a call.
    specs = absent + [task("ok"), task("ok2")]
    finished = pool.run(lambda runs: specs, **dict(kwargs, workers=2))
    assert sorted(runspec.run_key(r) for r in finished) == ["x|ok", "x|ok2"]
    said = [m for m in log if "no_such_backend" in m]
    assert said == ["no_such_backend is not installed here: its 2 run(s) "
                    "wait for a call where it is"]
    assert records.failures(kwargs["record_path"]) == []
    # The next call says it again, and they still wait.
    log.clear()
    assert pool.run(specs, **kwargs) == []
    assert log == said


def test_a_task_that_finds_no_gpu_stops_the_call(tasks, tmp_path):
    task, kwargs, log = tasks
    pid_file = tmp_path / "sleeper.pid"
    specs = [task("sleeper", "sleep", seconds=600, pid_file=str(pid_file)),
             task("gpu", "no_gpu", wait_for=str(pid_file)), task("after")]
    with pytest.raises(pool.NoGPU, match=re.escape(
            "x|gpu: jax sees no GPU (cpu: cpu); it needs a GPU")):
        pool.run(specs, **dict(kwargs, workers=2))
    # The task running beside it is stopped; nothing after it starts, and
    # nothing is recorded: a machine with a GPU runs them all.
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    assert not any(m.startswith("start x|after") for m in log)
    assert records.read(kwargs["record_path"]) == {}


def test_no_task_starts_once_one_is_expected_to_end_after_the_budget(tasks):
    """The first task ends 5 s after the call starts: the next of its part
    and backend, expected to take as long, would end after the 8 s budget;
    nor does any other start after it."""
    task, kwargs, log = tasks
    specs = [task("first", "until", until=time.time() + 5), task("second"),
             task("other", part="y")]
    finished = pool.run(specs, **dict(kwargs, budget=8))
    assert [runspec.run_key(r) for r in finished] == ["x|first"]
    assert [m.split(":")[0] for m in log if m.startswith("not started")] == [
        "not started x|second"]
    assert records.failures(kwargs["record_path"]) == []


def test_a_task_running_at_the_end_of_the_budget_is_stopped_for_a_rerun(
        tasks):
    task, kwargs, log = tasks
    spec = task("long", "sleep", seconds=600)
    assert pool.run([spec], **dict(kwargs, budget=1)) == []
    assert "stopped x|long at the end of the budget" in log
    assert records.read(kwargs["record_path"]) == {}


def test_a_signal_while_a_run_starts_stops_that_run_too(
        tasks, monkeypatch):
    """SIGTERM delivered just after a run's process is created, before the
    runner holds it: it waits until the runner does, so that run is
    stopped and said too, not left running."""
    task, kwargs, log = tasks
    started = []
    real = pool.start

    def start(*args, **kw):
        started.append(real(*args, **kw))
        os.kill(os.getpid(), signal.SIGTERM)
        return started[-1]

    monkeypatch.setattr(pool, "start", start)
    with pytest.raises(pool.Stopped) as stopped:
        pool.run([task("long", "sleep", seconds=600)], **kwargs)
    left = started[0].poll() is None
    started[0].kill()
    assert stopped.value.code == 143
    assert not left  # Stopped, and reaped.
    assert log[-1] == (
        "stopped x|long: the runner got SIGTERM; run it again to resume")
    assert records.read(kwargs["record_path"]) == {}


# A runner in a process of its own: the test sends it the signal.
RUNNER = """
import json, os, sys
from bench.core import pool
spec = json.loads(sys.argv[1])
pool.POLL = 0.05
pool.run([spec], sys.argv[2], sys.argv[3], workers=1,
         log=lambda line: print(line, flush=True))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT],
                         ids=["sigterm", "sigint"])
def test_a_runner_stopped_by_a_signal_stops_its_runs_first(sig, tmp_path):
    """What a scheduler or Ctrl-C sends the runner: the run it started
    gets SIGTERM and ends before the runner exits 143 (SIGINT: 130) with
    one line per run and no traceback, SIGINT too where the runner was
    started with it ignored; nothing is recorded, so a rerun starts it
    again."""
    (tmp_path / "fake_task.py").write_text(FAKE)
    pid_file = tmp_path / "task.pid"
    spec = dict(part="x", model="long", module="fake_task", act="sleep",
                seconds=600, pid_file=str(pid_file))
    record = tmp_path / "record.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), bench.ROOT]))
    # Started as a shell starts a job in the background: SIGINT ignored,
    # which Python's own Ctrl-C handling then leaves ignored.
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(spec), str(record),
         str(tmp_path / "runs")], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        # Generous: on a loaded machine (the study's runs, the other test
        # worker's jobs) two Python starts can take many seconds.
        deadline = time.monotonic() + 300
        while not pid_file.exists() or not pid_file.read_text():
            if proc.poll() is not None or time.monotonic() >= deadline:
                proc.kill()
                pytest.fail(f"no task started: {proc.communicate()}")
            time.sleep(0.05)
        task = int(pid_file.read_text())
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
    assert "Traceback" not in err, err
    why = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    assert out.splitlines()[-1] == (
        f"stopped x|long: the runner got {why}; run it again to resume")
    with pytest.raises(ProcessLookupError):  # The task ended before it.
        os.kill(task, 0)
    assert records.read(str(record)) == {}
