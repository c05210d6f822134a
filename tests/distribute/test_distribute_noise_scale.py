"""The gradient noise scale from two replicas (TensorFlow) and from
gradient accumulation agree, on the regression of `regression_problem.py`.

Two localhost workers (`workers/gns_worker.py`) under
`keras_largebatch.distribute.MultiWorkerMirroredStrategy`, global batch
128, against one process accumulating two micro-batches of 64: the same
seed gives the same batches, so the two sources see the same gradients.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.distribute import localhost

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="the replica source needs a tf.distribute strategy",
)

WORKER = os.path.join(os.path.dirname(__file__), "workers", "gns_worker.py")
JOB_TIMEOUT = 300
B_SIMPLE = 129.0  # ((d + 1)|e|^2 + d sigma^2) / |e|^2, d = 64, |e| = sigma = 1


def _env():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return env


OPTIMIZERS = ["sgd", "lars_mixed"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The job of two replicas and the one process accumulating, each
    measuring every optimizer of `OPTIMIZERS` in turn (one start a
    process): the folder of their JSON files."""
    folder = tmp_path_factory.mktemp("gns")
    outs = [str(folder / f"replica_{i}_{{optimizer}}.json") for i in range(2)]
    procs = localhost.start(
        [[sys.executable, WORKER,
          json.dumps(dict(out=o, optimizers=OPTIMIZERS, batch_size=128))]
         for o in outs],
        logs=[folder / f"replica_{i}.log" for i in range(2)], env=_env())
    for i, code in enumerate(localhost.wait(procs, JOB_TIMEOUT)):
        assert code == 0, (folder / f"replica_{i}.log").read_text()[-3000:]
    subprocess.run(
        [sys.executable, WORKER, json.dumps(dict(
            out=str(folder / "single_{optimizer}.json"), optimizers=OPTIMIZERS,
            batch_size=64, accumulation=2))],
        env=_env(), check=True, timeout=JOB_TIMEOUT, capture_output=True)
    return folder


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_two_replicas_measure_what_accumulation_measures(optimizer, measured):
    replicas = [json.load(open(measured / f"replica_{i}_{optimizer}.json"))
                for i in range(2)]
    accumulation = json.load(open(measured / f"single_{optimizer}.json"))
    assert [r["source"] for r in replicas] == ["replicas", "replicas"]
    assert accumulation["source"] == "accumulation"
    assert replicas[0] == replicas[1]
    for name in ("gradient_noise_scale", "gns_grad_sq_norm", "gns_trace_cov"):
        # Same batches, summed in another order: float32 round-off only.
        np.testing.assert_allclose(replicas[0][name], accumulation[name],
                                   rtol=1e-4)
    np.testing.assert_allclose(replicas[0]["gradient_noise_scale"][-1],
                               B_SIMPLE, rtol=0.1)
