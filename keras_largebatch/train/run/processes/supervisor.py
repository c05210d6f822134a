"""Each process of a several-process JAX job runs the command in a child.

When a process dies, JAX's runtime ends the others by aborting them (a
C++ stack on stderr). So each process of such a job runs the command in a
child (`supervise`): the child's stderr goes to a log file, its own
one-line errors are relayed, and an abnormal end becomes one line naming
the lost process and how to resume. SIGINT and SIGTERM sent to the
supervisor are forwarded to the child, which runs in a session of its
own, so that a terminal's Ctrl-C reaches it once (twice would end it at
once, `run.interrupt`).
A TensorFlow collective's lost worker is named from the same runtime
message (`lost_worker_message`).
"""

import os
import re
import signal
import subprocess
import sys
import tempfile

from keras_largebatch.train import PROG
from keras_largebatch.train.run.processes.jax_cluster import cluster
from keras_largebatch.train.run.processes.jax_cluster import join_error

SUPERVISED = "KERAS_LARGEBATCH_SUPERVISED"


def supervise(argv, model_dir, timeout_seconds=0):
    """Runs this process's command again in a child, with `SUPERVISED` set;
    returns the exit code to end with."""
    _, count, index = cluster()
    log = tempfile.NamedTemporaryFile(
        "w", prefix=f"{PROG}.process{index}.", suffix=".log",
        delete=False)
    # The same program again (a console script, `python -m`, or a script
    # that configures the package first), unless `main` was handed argv.
    command = [sys.executable, *sys.orig_argv[1:]]
    if list(argv[1:]) != sys.argv[1:]:
        command = [sys.executable, "-m", "keras_largebatch.train.cli",
                   *argv[1:]]
    child = subprocess.Popen(
        command,
        env=dict(os.environ, **{SUPERVISED: "1"}), stderr=subprocess.PIPE,
        text=True, errors="replace", preexec_fn=_die_with_parent,
        start_new_session=True)
    forwarded = {s: signal.signal(s, lambda s, _: child.send_signal(s))
                 for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with log:
            for line in child.stderr:
                log.write(line)
                log.flush()
                if line.startswith(f"{PROG}:"):
                    sys.stderr.write(line)
                    sys.stderr.flush()
        code = child.wait()
    finally:
        for s, handler in forwarded.items():
            signal.signal(s, handler)
    if code in (0, 2, 130, 143):  # Its own line relayed (a signal's).
        return code
    with open(log.name, errors="replace") as f:
        text = f.read()
    if "CoordinationService/RegisterTask" in text:  # Never joined.
        print(f"{PROG}: error: {join_error(timeout_seconds)}",
              file=sys.stderr)
        return 2
    print(f"{PROG}: error: {lost_message(text, index, count, code)} "
          f"To resume, start all {count} processes again with the same "
          f"command: they continue from the last checkpoint in "
          f"{model_dir}. Log: {log.name}", file=sys.stderr)
    return 1


def lost_worker_message(error, workers, index):
    """What a TensorFlow collective's `OpError` says of the lost worker.

    The coordination service names the workers that stopped sending
    heartbeats; a peer's closed socket names no one, and then the other
    workers a message mentions (or, of two, the other one) are named.
    """
    text = str(error)
    lost = lost_processes(text) or sorted(
        set(re.findall(r"task:(\d+)", text)) - {str(index)}, key=int)
    if not lost and workers == 2:
        lost = [str(1 - index)]
    who = (f"worker {', '.join(lost)} of {workers}" if lost
           else f"a worker of {workers}")
    return (f"lost {who} during training ({type(error).__name__}: the "
            f"collective stopped); this worker ({index}) stopped.")


def lost_processes(log_text):
    """The ids in the coordination service's "stopped sending heartbeats"
    message (JAX: `1`; TensorFlow: `/job:worker/replica:0/task:1`)."""
    found = re.search(r"stopped sending heartbeats\):\s*\n?([^\n]*)",
                      log_text)
    if not found:
        return []
    return (re.findall(r"task:(\d+)", found.group(1))
            or re.findall(r"\d+", found.group(1)))


def _die_with_parent():
    """Linux: the child is killed when its supervisor dies (a `kill -9` of
    the process a scheduler started must not leave the job running)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PDEATHSIG
    except (OSError, AttributeError):
        pass


def lost_message(log_text, index, count, code):
    """What ended process `index` (exit `code`), from its runtime log."""
    lost = lost_processes(log_text)
    if lost:
        return (f"process {', '.join(lost)} of {count} was lost (no "
                f"heartbeat from it); process {index} stopped.")
    if index != 0 and re.search(r"coordination service|Socket closed",
                                log_text):
        return (f"process 0 of {count} (the coordinator) was lost; process "
                f"{index} stopped.")
    why = f"signal {-code}" if code < 0 else f"exit code {code}"
    errors = [l for l in log_text.splitlines()
              if re.match(r"\w+(Error|Exception)\b.*:", l)]
    detail = f" ({errors[-1][:200]})" if errors else ""
    return f"process {index} of {count} ended with {why}{detail}."
