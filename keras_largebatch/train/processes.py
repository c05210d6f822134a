"""Several processes: JAX's `keras.distribution` or torch's `torchrun`.

On JAX, `--distribution=data_parallel` reads Keras' own variables,

    KERAS_DISTRIBUTION_JOB_ADDRESSES   the coordinator's host:port (or every
                                       process's, comma-separated, the
                                       coordinator first)
    KERAS_DISTRIBUTION_NUM_PROCESSES   the number of processes
    KERAS_DISTRIBUTION_PROCESS_ID      this process's id, 0 the chief

and makes the call `keras.distribution.initialize` makes,
`jax.distributed.initialize`, adding the timeouts Keras does not pass:
`--collective_timeout_seconds` bounds the wait for the coordinator and the
silence after which a process counts as lost (JAX's default otherwise:
300 s and 100 s). CPU devices talk through gloo.

When a process dies, JAX's runtime ends the others by aborting them (a
C++ stack on stderr). So each process of such a job runs the command in a
child (`supervise`): the child's stderr goes to a log file, its own
one-line errors are relayed, and an abnormal end becomes one line naming
the lost process and how to resume.

On torch (Keras >= 3.16, whose `fit` wraps the model in
`DistributedDataParallel` once `torch.distributed` is initialized),
`initialize_torch` starts the default process group from `torchrun`'s
variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`): NCCL on GPUs (this process on GPU `LOCAL_RANK`), gloo on
a CPU, with `--collective_timeout_seconds` as the group's timeout. Rank 0
is the chief. `torchrun` supervises: a failed process makes it end the
others.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile

from keras_largebatch._shared import require
from keras_largebatch.train import PROG
SUPERVISED = "KERAS_LARGEBATCH_SUPERVISED"


def cluster():
    """(coordinator host:port, num_processes, process_id) from Keras'
    variables; (None, 1, 0) when they are unset. Raises `ValueError`
    naming a bad one."""
    raw = {name: os.environ.get(f"KERAS_DISTRIBUTION_{name}")
           for name in ("JOB_ADDRESSES", "NUM_PROCESSES", "PROCESS_ID")}
    if raw["NUM_PROCESSES"] in (None, "", "1") and not raw["JOB_ADDRESSES"]:
        return None, 1, 0
    numbers = {}
    for name in ("NUM_PROCESSES", "PROCESS_ID"):
        variable = f"KERAS_DISTRIBUTION_{name}"
        try:
            numbers[name] = int(raw[name])
        except (TypeError, ValueError):
            raise ValueError(
                f"`{variable}` must be an int for several processes. "
                f"Received: {variable}={raw[name]!r}") from None
    count, index = numbers["NUM_PROCESSES"], numbers["PROCESS_ID"]
    require(count >= 1, "KERAS_DISTRIBUTION_NUM_PROCESSES", count,
            "an int >= 1")
    require(0 <= index < count, "KERAS_DISTRIBUTION_PROCESS_ID", index,
            f"in [0, {count}) (KERAS_DISTRIBUTION_NUM_PROCESSES={count})")
    addresses = raw["JOB_ADDRESSES"]
    require(bool(addresses) and all(
        re.fullmatch(r"[^\s:,]+:\d+", a) for a in addresses.split(",")),
        "KERAS_DISTRIBUTION_JOB_ADDRESSES", addresses or "",
        "the coordinator's host:port (or every process's, comma-separated)")
    listed = addresses.split(",")
    require(len(listed) in (1, count), "KERAS_DISTRIBUTION_JOB_ADDRESSES",
            addresses, f"one address or {count} "
            f"(KERAS_DISTRIBUTION_NUM_PROCESSES={count})")
    return listed[0], count, index


def is_multi_process():
    try:
        return cluster()[1] > 1
    except ValueError:
        return False  # `initialize` reports it, before anything runs.


def initialize(timeout_seconds=0):
    """Joins the job of `cluster()`; returns (process index, count)."""
    coordinator, count, index = cluster()
    if count == 1:
        return 0, 1
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = int(timeout_seconds) if timeout_seconds else None
    try:
        jax.distributed.initialize(
            coordinator, count, index,
            initialization_timeout=timeout or 300,
            heartbeat_timeout_seconds=max(timeout or 100, 2))
    except Exception as e:  # The runtime's error types are internal.
        raise ValueError(join_error(timeout_seconds)) from e
    return jax.process_index(), jax.process_count()


TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torch_cluster():
    """(rank, world size, local rank) from `torchrun`'s variables; None
    when `WORLD_SIZE` is unset. Raises `ValueError` naming a bad one."""
    raw = {name: os.environ.get(name) for name in TORCHRUN}
    if raw["WORLD_SIZE"] is None:
        return None
    numbers = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        try:
            numbers[name] = int(raw[name])
        except (TypeError, ValueError):
            raise ValueError(
                f"`{name}` must be an int (torchrun sets it). "
                f"Received: {name}={raw[name]!r}") from None
    count, rank = numbers["WORLD_SIZE"], numbers["RANK"]
    require(count >= 1, "WORLD_SIZE", count, "an int >= 1")
    require(0 <= rank < count, "RANK", rank,
            f"in [0, {count}) (WORLD_SIZE={count})")
    require(bool(raw["MASTER_ADDR"]), "MASTER_ADDR", raw["MASTER_ADDR"] or "",
            "rank 0's host (torchrun sets it)")
    return rank, count, numbers["LOCAL_RANK"]


def initialize_torch(gpu, timeout_seconds=0):
    """Joins the torch process group of `torch_cluster()` (NCCL where `gpu`,
    else gloo); returns (rank, world size). A world of one process starts
    no group."""
    rank, count, local_rank = torch_cluster()
    if count == 1:
        return 0, 1
    import datetime

    import torch

    if gpu:
        torch.cuda.set_device(local_rank)  # Keras' "cuda" is this GPU.
    timeout = (datetime.timedelta(seconds=timeout_seconds)
               if timeout_seconds else None)
    try:
        torch.distributed.init_process_group(
            "nccl" if gpu else "gloo", timeout=timeout)
    except Exception as e:  # The store's error types are internal.
        raise ValueError(
            f"Process {rank} of {count} could not join the torch process "
            f"group at {os.environ['MASTER_ADDR']}:"
            f"{os.environ['MASTER_PORT']}: start every process, with "
            f"torchrun ({type(e).__name__}: {str(e)[:200]}). Received: "
            f"RANK={rank}, WORLD_SIZE={count}") from e
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def join_error(timeout_seconds=0):
    """The one line for a process that could not join its job."""
    coordinator, count, index = cluster()
    return (f"Process {index} of {count} could not join the job at the "
            f"coordinator {coordinator} within "
            f"{int(timeout_seconds) or 300} s: start every process, the "
            f"coordinator (KERAS_DISTRIBUTION_PROCESS_ID=0) listening there. "
            f"Received: KERAS_DISTRIBUTION_JOB_ADDRESSES={coordinator!r}")


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
        command = [sys.executable, "-m", "keras_largebatch.train.main",
                   *argv[1:]]
    child = subprocess.Popen(
        command,
        env=dict(os.environ, **{SUPERVISED: "1"}), stderr=subprocess.PIPE,
        text=True, errors="replace", preexec_fn=_die_with_parent)
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
    if code in (0, 2, 130):  # Its own line relayed (130: Ctrl-C).
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


def barrier(backend, process_count):
    """Returns once every process of the job has called it (at once alone):
    after each has read `model_dir`, before the chief writes there, so
    that no process takes the chief's new `run_config.json` (or a raise of
    `--epochs` it records) for a run to resume."""
    if process_count == 1:
        return
    if backend == "torch":
        import torch

        torch.distributed.barrier()
    else:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("keras_largebatch model_dir")


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
