"""Signals the moment a run cannot wait for its step's end: Ctrl-C while
the command starts (Keras and the backend imported, nothing written yet)
ends it with one line and exit code 130, no traceback; a second SIGTERM,
or the first in a run that cannot save within an epoch, ends it at once
with its line and 143. A process of a job stops where the job agrees,
with the job's signal, and torch processes agree through an all-reduce.
(SIGTERM's save at the step: test_kill_points.py; a job of several
processes stopped by SIGTERM: test_train_step_checkpoints.py.)
"""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from keras_largebatch.distribute import localhost
from keras_largebatch.train import PROG


@pytest.mark.backend_independent
def test_ctrl_c_while_the_command_imports_exits_130_in_one_line(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_largebatch.train.cli",
         f"--model_dir={tmp_path / 'run'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # Importing Keras and its backend takes longer.
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith(PROG)]
    assert len(ours) == 1 and "interrupted (Ctrl-C)" in ours[0], err[-3000:]
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.backend_independent
@pytest.mark.parametrize("saves, signals", [(True, 2), (False, 1)],
                         ids=["second_signal", "nothing_to_save"])
def test_sigterm_ends_the_run_at_once_where_it_is_not_to_wait_for_the_step(
        saves, signals, tmp_path):
    """While `fit` trains, a first SIGTERM waits for the step's end where
    the run saves there; a second one ends the process there and then, and
    so does the first where the run has nothing to save there (no
    `StepCheckpoints`)."""
    script = (
        "import os, signal, time\n"
        "from keras_largebatch.train.run import interrupt\n"
        f"with interrupt.handled({str(tmp_path)!r}):\n"
        "    # As `fit` begins, with a `StepCheckpoints` to save, or none.\n"
        f"    interrupt.StopOnInterrupt({'object()' if saves else None})"
        ".on_train_begin()\n"
        f"    for _ in range({signals - 1}):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    print('goes on', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert proc.stdout == "goes on\n"
    ours = [line for line in proc.stderr.splitlines()
            if line.startswith(PROG)]
    assert ours == [
        f"{PROG}: stopped by SIGTERM before the first checkpoint: nothing "
        "can be resumed; running the same command starts the run over"]


class _Job:
    """An agreement (`processes.agreement`) that stops its job at call
    `at` for a SIGTERM another process received; it records the calls."""

    polls = True

    def __init__(self, at, calls):
        self.at, self.calls = at, calls

    def stop_at(self, step, received):
        self.calls.append(("stop_at", step, list(received)))
        return signal.SIGTERM if step == self.at else None

    def barrier(self):
        self.calls.append("barrier")

    def close(self):
        self.calls.append("close")


class _Steps:
    """A `StepCheckpoints` at an update boundary after each batch, the last
    of the epoch at batch `last`."""

    def __init__(self, last, calls):
        self.last, self.calls, self.batch = last, calls, None

    def at_update_boundary(self):
        return True

    def save_now(self):
        self.calls.append("save")
        return self.batch != self.last


@pytest.mark.backend_independent
@pytest.mark.parametrize("last", [5, 2], ids=["within_epoch", "last_step"])
def test_a_process_with_no_signal_stops_where_its_job_agrees(last, tmp_path):
    """A process of a job asks at every update boundary and epoch end; at
    the call the job agrees on, it saves, waits for the others and stops
    (after the epoch's end where that is its last step), with the exit
    code of the job's signal; then it leaves the job."""
    from keras_largebatch.train.run import interrupt

    calls = []
    steps = _Steps(last, calls)
    stop = interrupt.StopOnInterrupt(steps, _Job(3, calls))
    with interrupt.handled(str(tmp_path)):
        stop.on_train_begin()
        for batch in range(2):
            steps.batch = batch
            stop.on_train_batch_end(batch)
        steps.batch = 2
        with pytest.raises(KeyboardInterrupt):
            stop.on_train_batch_end(2)
            stop.on_epoch_end(0)
    asked = [("stop_at", n, []) for n in (1, 2, 3)]
    assert calls == [*asked, "save", "barrier"]
    assert interrupt.exit_code() == 143
    assert interrupt.message(str(tmp_path)).startswith("stopped by SIGTERM")
    interrupt.close()
    assert calls[-1] == "close"


_TORCH_RANK = """
import signal
import torch.distributed as dist
dist.init_process_group("gloo")
from keras_largebatch.train.run.processes.agreement import TorchFlags
flags = TorchFlags()
rank = dist.get_rank()
said = []
for step in range(1, 6):
    received = [signal.SIGTERM] if rank == 1 and step >= 3 else []
    said.append(flags.stop_at(step, received))
flags.barrier()
print([None if s is None else int(s) for s in said])
"""


@pytest.mark.multi_process
@pytest.mark.backend_independent(home="torch")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed")
def test_torch_processes_agree_on_the_step_a_signal_to_one_stops(tmp_path):
    """Two gloo processes on loopback: rank 1 has SIGTERM from call 3; the
    all-reduce stops both there, rank 0 with rank 1's signal."""
    port = localhost.free_ports(1)[0]
    procs = []
    for rank in range(2):
        env = dict(os.environ, KERAS_BACKEND="torch", RANK=str(rank),
                   WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _TORCH_RANK], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        done = [p.communicate(timeout=120) for p in procs]
    finally:
        localhost.kill(procs)
    for proc, (out, err) in zip(procs, done):
        assert proc.returncode == 0, err[-3000:]
        assert out.splitlines()[-1] == "[None, None, 15, 15, 15]", out
