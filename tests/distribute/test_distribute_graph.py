"""Traced graphs: what each collective waits for.

`workers/graph_worker.py` traces (and never runs) a `LARSMixed` step under
`tf.distribute` with fusion buckets, and a hierarchical all-reduce, then
walks the data and control edges of the graph.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="keras_largebatch.distribute needs the TensorFlow backend",
)

WORKER = os.path.join(os.path.dirname(__file__), "workers", "graph_worker.py")


@pytest.fixture(scope="module")
def traced():
    proc = subprocess.run(
        [sys.executable, WORKER], capture_output=True, text=True, timeout=180,
        env=dict(os.environ, KERAS_BACKEND="tensorflow",
                 TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])


def test_first_bucket_all_reduce_waits_only_for_its_own_gradients(traced):
    # Variables k1 b1 k2 b2 k3 b3 (0..5); 256-byte buckets, last first:
    # [b3 k3 b2], [k2], [b1], [k1].
    assert [b[0] for b in traced["buckets"]] == [3, 1, 1, 1]
    buckets = [[5, 4, 3], [2], [1], [0]]
    depends = traced["depends"]
    # One all-reduce per bucket and nothing before them: no overflow flag
    # reduced from every gradient, no all-reduce inside a branch on it.
    assert len(depends) == len(buckets)
    assert depends[0] == [3, 4, 5]
    for k, bucket in enumerate(buckets):
        later = {i for b in buckets[k + 1:] for i in b}
        assert set(bucket) <= set(depends[k])
        assert not later & set(depends[k]), (k, depends[k])
