"""Localhost multi-worker jobs under `MultiWorkerMirroredStrategy`.

Every worker is a subprocess (`workers/mw_worker.py`) with its own
`TF_CONFIG` on 127.0.0.1 ports; every job has a hard timeout and is killed
whole on failure. The worker trains a 195-parameter MLP with `LARSMixed`
for 2 epochs of 4 steps (global batch 16), then evaluates and predicts.
A TF worker's start costs seconds, so one job trains several fresh models
one after another: the 2-worker job and the single-process reference
shared by several tests (module fixtures) also train with gradient
accumulation, and the 2-worker job then with fp16 transport.
"""

import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_largebatch.distribute import localhost

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy needs the TensorFlow backend",
)

WORKER = os.path.join(os.path.dirname(__file__), "workers", "mw_worker.py")
JOB_TIMEOUT = 240
# `single` and `fit2` run what two jobs of JOB_TIMEOUT each used to.
SHARED_JOB_TIMEOUT = 2 * JOB_TIMEOUT
# Two workers reduce in another order than one process sums a batch:
# float32 round-off, ~5e-7 measured after 8 steps.
ATOL_FLOAT32 = 1e-5
# float16 transport rounds each all-reduced gradient to 11 bits: ~3e-4
# measured after 8 steps on weights of magnitude <= 1.7.
ATOL_FP16 = 2e-3


def _env():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return env


def _start(num_workers, args, tmp_path, name):
    outs = [str(tmp_path / f"{name}_{i}.npz") for i in range(num_workers)]
    procs = localhost.start(
        [[sys.executable, WORKER, json.dumps(dict(args, out=out))]
         for out in outs],
        logs=[tmp_path / f"{name}_{i}.log" for i in range(num_workers)],
        env=_env(),
    )
    return procs, outs


def _log(tmp_path, name, i):
    return (tmp_path / f"{name}_{i}.log").read_text()[-3000:]


def _wait(procs, tmp_path, name, timeout=JOB_TIMEOUT):
    for i, code in enumerate(localhost.wait(procs, timeout)):
        assert code == 0, _log(tmp_path, name, i)


def _run_job(num_workers, args, tmp_path, name, timeout=JOB_TIMEOUT):
    procs, outs = _start(num_workers, args, tmp_path, name)
    _wait(procs, tmp_path, name, timeout)
    return [dict(np.load(o)) for o in outs]


def _weights(result, prefix=""):
    return [result[f"{prefix}w{i}"] for i in range(4)]


def _assert_close(a, b, atol, prefix=""):
    for x, y in zip(_weights(a, prefix), _weights(b)):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)


def _assert_identical(results, prefix=""):
    for r in results[1:]:
        for x, y in zip(_weights(results[0], prefix), _weights(r, prefix)):
            np.testing.assert_array_equal(x, y)


# Gradient accumulation (prefixes `<optimizer>_`), in `single` and `fit2`.
ACCUMULATION = {"steps": 2, "optimizers": ["sgd", "lars_mixed", "lamb_mixed"]}
# The tests of the shared `fit2` job: its cost is timed in whichever of
# them runs first, so `slow` (`tests/run.sh --fast`) cannot come from their
# recorded seconds alone.
shared_job = pytest.mark.slow


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The same trainings in one process, no strategy, same global batch:
    the first model (evaluated), then one per optimizer with gradient
    accumulation."""
    out = str(tmp_path_factory.mktemp("single") / "single.npz")
    subprocess.run(
        [sys.executable, WORKER, json.dumps({
            "out": out, "strategy": None, "accumulation": ACCUMULATION,
        })],
        env=_env(), check=True, timeout=SHARED_JOB_TIMEOUT,
        capture_output=True,
    )
    return dict(np.load(out))


@pytest.fixture(scope="module")
def fit2(tmp_path_factory):
    """One 2-worker job: the first model in float32 (evaluated), one per
    optimizer with gradient accumulation, then one with fp16 transport."""
    args = {"strategy": {}, "accumulation": ACCUMULATION,
            "then": {"compression": "fp16"}}
    return _run_job(2, args, tmp_path_factory.mktemp("fit2"), "fit2",
                    SHARED_JOB_TIMEOUT)


@shared_job
def test_two_workers_fit_like_one_process_in_float32_and_fp16(single, fit2):
    results = fit2
    _assert_identical(results)
    _assert_identical(results, "then_")
    r = results[0]
    _assert_close(r, single, ATOL_FLOAT32)
    np.testing.assert_allclose(r["evaluate"], single["evaluate"], atol=1e-5)
    np.testing.assert_allclose(r["predict"], single["predict"], atol=1e-5)
    # All four gradients travelled in one bucket: 195 float32, then float16.
    assert [4, 780] in r["buckets"].tolist()
    assert r["paths"].tolist() == ["flat"]
    _assert_close(r, single, ATOL_FP16, prefix="then_")
    assert [4, 390] in r["then_buckets"].tolist()
    # fp16 rounding is visible: the two runs are not bit-identical.
    assert not np.array_equal(r["w1"], r["then_w1"])


@shared_job
def test_two_workers_accumulate_gradients_like_one_process(single, fit2):
    # Keras' accumulation is a `cond` whose update branch all-reduces (SGD)
    # or updates the rule (the mixed optimizers sum every micro-batch):
    # the strategy does both without `merge_call`, refused in a branch.
    results = fit2
    for name in ACCUMULATION["optimizers"]:
        prefix = f"{name}_"
        _assert_identical(results, prefix)
        for x, y in zip(_weights(results[0], prefix), _weights(single, prefix)):
            np.testing.assert_allclose(x, y, rtol=0, atol=ATOL_FLOAT32)
        # The package's fused all-reduce summed the four gradients.
        assert [4, 780] in results[0][f"{prefix}buckets"].tolist()


def test_four_workers_as_two_nodes_hierarchical_equals_flat(single, tmp_path):
    strategy = {
        "workers_per_node": 2,
        "fusion_threshold_bytes": 256,
        "hierarchical_threshold_bytes": 2**30,
    }
    args = {
        "strategy": strategy,
        "then": {"hierarchical_threshold_bytes": 0},
        "evaluate": False,
    }
    results = _run_job(4, args, tmp_path, "hier")
    r = results[0]
    assert r["paths"].tolist() == ["hierarchical"]
    assert r["then_paths"].tolist() == ["flat"]
    # 256-byte buckets, last layer first: [b2, k2] 204 B, [b1] 64 B, [k1].
    log = r["buckets"].tolist()
    i = log.index([2, 204])
    assert log[i : i + 3] == [[2, 204], [1, 64], [1, 512]]
    _assert_identical(results)
    _assert_identical(results, "then_")
    _assert_close(r, single, ATOL_FLOAT32)
    for x, y in zip(_weights(r), _weights(r, "then_")):
        np.testing.assert_allclose(x, y, rtol=0, atol=ATOL_FLOAT32)


def test_killed_worker_fails_the_job_and_restart_resumes_from_backup(
    single, tmp_path
):
    backup = str(tmp_path / "backup")
    args = {"strategy": {}, "timeout": 10, "backup_dir": backup,
            "evaluate": False}
    procs, outs = _start(
        2, dict(args, stop_after_epoch=0, stop_how="hang", stop_task=1),
        tmp_path, "killed",
    )
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not os.path.exists(outs[1] + ".ready"):
            assert time.monotonic() < deadline, _log(tmp_path, "killed", 1)
            assert procs[0].poll() is None, _log(tmp_path, "killed", 0)
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        procs[0].wait(timeout=90)
        elapsed = time.monotonic() - killed_at
    finally:
        localhost.kill(procs)
    log = _log(tmp_path, "killed", 0)
    assert procs[0].returncode != 0
    # Collective timeout 10 s (plus the coordination service's heartbeat).
    assert elapsed < 90
    assert "UnavailableError" in log or "DeadlineExceededError" in log, log

    resumed = _run_job(2, args, tmp_path, "resumed")
    for r in resumed:
        assert r["epochs"].tolist() == [1]
        _assert_close(r, single, ATOL_FLOAT32)


FP16_WORKER = os.path.join(os.path.dirname(__file__), "workers", "fp16_worker.py")
EIGHT_WORKER_TIMEOUT = 480


def test_eight_workers_fp16_update_within_0_15_percent_of_float32(tmp_path):
    outs = [str(tmp_path / f"fp16_{i}.npz") for i in range(8)]
    procs = localhost.start(
        [[sys.executable, FP16_WORKER, out] for out in outs],
        logs=[tmp_path / f"fp16_{i}.log" for i in range(8)], env=_env(),
    )
    _wait(procs, tmp_path, "fp16", EIGHT_WORKER_TIMEOUT)
    results = [dict(np.load(o)) for o in outs]
    r = results[0]
    names = sorted(k[len("w0_"):] for k in r if k.startswith("w0_"))
    for other in results[1:]:
        for k in names:
            np.testing.assert_array_equal(other[f"fp16_{k}"], r[f"fp16_{k}"])
    u32 = np.concatenate([
        (r[f"f32_{k}"].astype(np.float64) - r[f"w0_{k}"]).ravel()
        for k in names
    ])
    u16 = np.concatenate([
        (r[f"fp16_{k}"].astype(np.float64) - r[f"w0_{k}"]).ravel()
        for k in names
    ])
    assert np.linalg.norm(u32) > 0
    difference = np.linalg.norm(u16 - u32) / np.linalg.norm(u32)
    print(f"8 workers: fp16 vs float32 update differ by {difference:.4%}")
    assert difference <= 0.0015, difference
    # The 676 gradient elements travelled in one bucket, in float16 the
    # second time; the other reductions (scalars, Keras' first batch) in
    # float32 both times.
    assert [4, 2704] in r["buckets_f32"].tolist()
    assert [4, 1352] in r["buckets_fp16"].tolist()
    others = [b for b in r["buckets_f32"].tolist() if b != [4, 2704]]
    assert [b for b in r["buckets_fp16"].tolist() if b != [4, 1352]] == others
