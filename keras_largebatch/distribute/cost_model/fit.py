"""Fitting alpha and beta to measured all-reduce timings."""

import json
import os
import sys
import tempfile

import numpy as np

from keras_largebatch._shared import require

from keras_largebatch.distribute import localhost


def load_timings(path):
    """Reads a JSON list of `{"bytes": n, "seconds": t, "workers": p}`.

    A dict holding that list under `"timings"` is accepted too.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"`timings` file could not be read as JSON ({e}). Received: path={path}"
        ) from None
    if isinstance(data, dict):
        data = data.get("timings")
    if not isinstance(data, list) or not all(
        isinstance(d, dict) and {"bytes", "seconds", "workers"} <= d.keys()
        for d in data
    ):
        raise ValueError(
            "`timings` must be a JSON list of objects with `bytes`, `seconds` "
            f"and `workers` (or a dict with such a list under `timings`). "
            f"Received: timings file {path}"
        )
    return data


def fit_alpha_beta(timings):
    """Least-squares `alpha`, `beta` of `ring_allreduce_time` to timings.

    Residuals are relative (each row divided by its time), so small and
    large messages weigh alike.

    Args:
        timings: Iterable of dicts with `bytes`, `seconds` and `workers`
            (>= 2), one ring all-reduce each.

    Returns:
        `(alpha, beta)` in seconds and seconds per byte.
    """
    timings = list(timings)
    rows, secs = [], []
    for t in timings:
        p, n, s = int(t["workers"]), float(t["bytes"]), float(t["seconds"])
        if p < 2 or n < 0 or not s > 0:
            raise ValueError(
                "Each timing needs `workers` >= 2, `bytes` >= 0, `seconds` "
                f"> 0. Received: timing={t}"
            )
        rows.append([2 * (p - 1) / s, 2 * (p - 1) / p * n / s])
        secs.append(1.0)
    a = np.asarray(rows, dtype=np.float64)
    if len(rows) < 2 or np.linalg.matrix_rank(a) < 2:
        raise ValueError(
            "`timings` must hold at least two distinct message sizes. "
            f"Received: timings={timings}"
        )
    (alpha, beta), *_ = np.linalg.lstsq(a, np.asarray(secs), rcond=None)
    return float(alpha), float(beta)


_WORKER = r"""
import json, sys, time
import tensorflow as tf
sizes, repeats, timeout = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout))
out = []
for n in sizes:
    x = tf.ones([n // 4], tf.float32)
    step = tf.function(lambda: strategy.run(
        lambda: tf.distribute.get_replica_context().all_reduce("SUM", x)))
    strategy.experimental_local_results(step())[0].numpy()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        strategy.experimental_local_results(step())[0].numpy()
        times.append(time.perf_counter() - t0)
    out.append({"bytes": n, "seconds": sorted(times)[len(times) // 2],
                "workers": strategy.num_replicas_in_sync})
print("TIMINGS " + json.dumps(out), flush=True)
"""


def measure_localhost(sizes=(2**12, 2**16, 2**20, 2**22), repeats=5, timeout=120):
    """Times TF ring all-reduces on a 2-worker loopback cluster.

    Each worker is a subprocess on a 127.0.0.1 port
    (`MultiWorkerMirroredStrategy` first, then one warm-up and `repeats`
    timed `all_reduce`s per size, float32); both are killed after `timeout`
    seconds. Times include the `tf.function` call, so the fitted alpha is
    TF's per-collective overhead, not the loopback latency.

    Returns:
        Worker 0's list of `{"bytes", "seconds" (median), "workers"}`.
    """
    sizes = [int(s) for s in sizes]
    require(
        len(set(sizes)) >= 2 and all(s >= 4 and s % 4 == 0 for s in sizes),
        "sizes", sizes,
        "two or more distinct byte counts, multiples of 4 (float32)",
    )
    args = [json.dumps(sizes), str(repeats), str(timeout)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    with tempfile.TemporaryDirectory() as cwd:
        logs = [os.path.join(cwd, f"worker_{i}.log") for i in range(2)]
        try:
            codes = localhost.run(
                [[sys.executable, "-c", _WORKER, *args]] * 2, timeout,
                logs=logs, env=env, cwd=cwd,
            )
        except TimeoutError:
            raise RuntimeError(
                f"localhost all-reduce workers did not finish in {timeout} s"
            ) from None
        outputs = []
        for log in logs:
            with open(log) as f:
                outputs.append(f.read())
    for code, output in zip(codes, outputs):
        if code:
            raise RuntimeError(f"localhost worker failed:\n{output[-2000:]}")
    line = [s for s in outputs[0].splitlines() if s.startswith("TIMINGS ")]
    return json.loads(line[-1][len("TIMINGS "):])
