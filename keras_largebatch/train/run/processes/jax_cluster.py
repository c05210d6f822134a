"""Several JAX processes: `keras.distribution`'s variables.

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
300 s and 100 s). CPU devices talk through gloo. JAX's preemption notifier
takes SIGTERM over with a C handler of its own; `initialize` puts Python's
back (`run.interrupt`'s; `agreement.JaxPreemption` tells the job).
"""

import os
import re

from keras_largebatch._shared import require
from keras_largebatch.train.run.processes import int_variables
from keras_largebatch.train.run.processes import python_sigterm


def cluster():
    """(coordinator host:port, num_processes, process_id) from Keras'
    variables; (None, 1, 0) when they are unset. Raises `ValueError`
    naming a bad one."""
    raw = {name: os.environ.get(f"KERAS_DISTRIBUTION_{name}")
           for name in ("JOB_ADDRESSES", "NUM_PROCESSES", "PROCESS_ID")}
    if raw["NUM_PROCESSES"] in (None, "", "1") and not raw["JOB_ADDRESSES"]:
        return None, 1, 0
    numbers = int_variables(
        ("KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID"),
        "for several processes")
    count = numbers["KERAS_DISTRIBUTION_NUM_PROCESSES"]
    index = numbers["KERAS_DISTRIBUTION_PROCESS_ID"]
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
    """Joins the job of `cluster()`, Python's SIGTERM handler kept;
    returns (process index, count)."""
    coordinator, count, index = cluster()
    if count == 1:
        return 0, 1
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = int(timeout_seconds) if timeout_seconds else None
    try:
        with python_sigterm():
            jax.distributed.initialize(
                coordinator, count, index,
                initialization_timeout=timeout or 300,
                heartbeat_timeout_seconds=max(timeout or 100, 2))
    except Exception as e:  # The runtime's error types are internal.
        raise ValueError(join_error(timeout_seconds)) from e
    return jax.process_index(), jax.process_count()


def join_error(timeout_seconds=0):
    """The one line for a process that could not join its job."""
    coordinator, count, index = cluster()
    return (f"Process {index} of {count} could not join the job at the "
            f"coordinator {coordinator} within "
            f"{int(timeout_seconds) or 300} s: start every process, the "
            f"coordinator (KERAS_DISTRIBUTION_PROCESS_ID=0) listening there. "
            f"Received: KERAS_DISTRIBUTION_JOB_ADDRESSES={coordinator!r}")
