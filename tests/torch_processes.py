"""Runs a test's worker script as one process or as `torchrun` processes
(gloo on loopback), in a clean environment, bounded by a timeout."""

import os
import subprocess
import sys

TORCHRUN = ["-m", "torch.distributed.run", "--standalone"]


def run(worker, out, nproc=None, timeout=600):
    """`python [torchrun --nproc_per_node=nproc] worker out`, on the torch
    backend with one thread each; asserts that it exits 0."""
    env = dict(os.environ, KERAS_BACKEND="torch", OMP_NUM_THREADS="1",
               MASTER_ADDR="127.0.0.1")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    launcher = [] if nproc is None else [*TORCHRUN,
                                         f"--nproc_per_node={nproc}"]
    proc = subprocess.run([sys.executable, *launcher, worker, str(out)],
                          env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
