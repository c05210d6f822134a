"""AdaptiveBatch on two TensorFlow workers takes the batch trajectory of
one process: the same `global_batch_size` each epoch, and each change at
the same micro-batch on both workers.

Two localhost workers (`workers/adaptive_worker.py`) under
`keras_largebatch.distribute.MultiWorkerMirroredStrategy` measure the
noise scale from their two replicas; one process measures it from its two
accumulated micro-batches. Both start at 2 micro-batches of 32 examples
on the regression of `regression_problem.py` (B_simple = 129), 127
micro-batches an epoch, so that a change waits for an aligned micro-batch.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

from keras_largebatch.distribute import localhost

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="a tf.distribute strategy",
)

WORKER = os.path.join(os.path.dirname(__file__), "workers",
                      "adaptive_worker.py")
JOB_TIMEOUT = 180
B_SIMPLE = 129.0
POLICIES = ("noise_scale", "schedule")


def _env():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return env


def _args(out):
    return json.dumps(dict(out=out, policies=POLICIES, batch_size=32))


def test_two_workers_grow_the_batch_at_the_updates_one_process_does(
        tmp_path):
    outs = [str(tmp_path / f"worker_{i}.json") for i in range(2)]
    procs = localhost.start(
        [[sys.executable, WORKER, _args(o)] for o in outs],
        logs=[tmp_path / f"worker_{i}.log" for i in range(2)], env=_env())
    for i, code in enumerate(localhost.wait(procs, JOB_TIMEOUT)):
        assert code == 0, (tmp_path / f"worker_{i}.log").read_text()[-3000:]
    single = str(tmp_path / "single.json")
    subprocess.run([sys.executable, WORKER, _args(single)], env=_env(),
                   check=True, timeout=JOB_TIMEOUT, capture_output=True)
    workers = [json.load(open(o)) for o in outs]
    one = json.load(open(single))
    assert workers[0] == workers[1]  # decided from reduced values
    for policy in POLICIES:
        job, alone = workers[0][policy], one[policy]
        assert (job["source"], alone["source"]) == ("replicas",
                                                    "accumulation")
        assert job["global_batch_size"] == alone["global_batch_size"]
        assert job["updates"] == alone["updates"]
        # The k in effect at every micro-batch: the same switch points.
        assert job["ks"] == alone["ks"]
    assert one["schedule"]["global_batch_size"] == [64, 128, 256]
    grown = one["noise_scale"]["global_batch_size"]
    assert grown[0] == 64 and B_SIMPLE / 2 <= grown[1] <= 2 * B_SIMPLE
    # Epoch 1 starts at micro-batch 127: k = 4 waits for 128.
    assert one["schedule"]["ks"][127:129] == [2, 4]
