"""Signals the moment a run cannot wait for its step's end: Ctrl-C while
the command starts (Keras and the backend imported, nothing written yet)
ends it with one line and exit code 130, no traceback; a second SIGTERM,
or the first in a run that cannot save within an epoch, ends it at once
with its line and 143. (SIGTERM's save at the step: test_kill_points.py.)
"""

import os
import signal
import subprocess
import sys
import time

import pytest

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
                         ids=["second_signal", "several_processes"])
def test_sigterm_ends_the_run_at_once_where_it_is_not_to_wait_for_the_step(
        saves, signals, tmp_path):
    """While `fit` trains, a first SIGTERM waits for the step's end where
    the run saves there; a second one ends the process there and then, and
    so does the first where the run cannot save (several processes)."""
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
