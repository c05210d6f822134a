"""Localhost clusters: start workers on 127.0.0.1, wait, kill on timeout.

The one launcher of the package: the multi-worker tests, `bench/micro/allreduce.py`
and the cost model's `measure_localhost` all start their workers with
`start` and bound them with `wait` (or `run`, which does both). Each worker
gets its own `TF_CONFIG` (`{"cluster": {"worker": [...]}, "task": ...}`) on
loopback ports; nothing listens beyond 127.0.0.1. Importable without
TensorFlow.
"""

import json
import os
import socket
import subprocess
import time


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (bound, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start(commands, logs=None, env=None, cwd=None):
    """Starts one worker per command on a fresh loopback cluster.

    Args:
        commands: one argv list per worker; worker `i` is task `i`.
        logs: `None` (inherit stdout/stderr) or one file path per worker,
            receiving its stdout and stderr.
        env: base environment (default `os.environ`); `TF_CONFIG` is set
            per worker on top of it.
        cwd: working directory of every worker.

    Returns:
        The list of `subprocess.Popen`s, in task order.
    """
    ports = free_ports(len(commands))
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for index, command in enumerate(commands):
            worker_env = dict(os.environ if env is None else env)
            worker_env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            )
            if logs is None:
                procs.append(subprocess.Popen(command, env=worker_env, cwd=cwd))
                continue
            with open(logs[index], "w") as log:
                procs.append(subprocess.Popen(
                    command, env=worker_env, cwd=cwd, stdout=log,
                    stderr=subprocess.STDOUT,
                ))
    except BaseException:
        kill(procs)
        raise
    return procs


def kill(procs):
    """Kills every worker still running and reaps them all."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def wait(procs, timeout):
    """Waits until every worker exits or one fails; then kills the rest.

    Returns:
        The return codes, in task order (a worker killed because another
        failed first reads -9).

    Raises:
        TimeoutError: when the workers are still running after `timeout`
            seconds (they are killed first).
    """
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"localhost workers did not finish in {timeout} s"
                )
            time.sleep(0.1)
    finally:
        kill(procs)
    return [p.returncode for p in procs]


def run(commands, timeout, logs=None, env=None, cwd=None):
    """`start`s the workers, then `wait`s for them; returns the codes."""
    return wait(start(commands, logs=logs, env=env, cwd=cwd), timeout)
