"""Every TensorFlow internal of `keras_largebatch._tf_internals` against
the installed TensorFlow, and that no other module of the package reaches
TensorFlow's private API.

The strategy, cross-device-ops and launcher internals run in
`workers/tf_internals_worker.py` (a one-task localhost cluster with two
logical CPUs, which must be set before TensorFlow starts); the rest here.
A failure names the internal and the TensorFlow versions it was checked on.
"""

import json
import os
import pathlib
import re
import sys

import keras
import pytest

from keras_largebatch.distribute import localhost

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="keras_largebatch._tf_internals needs the TensorFlow backend",
)

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    from keras_largebatch import _tf_internals

WORKER = os.path.join(
    os.path.dirname(__file__), "workers", "tf_internals_worker.py"
)
PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_largebatch"


def _message(internal, seen):
    return (
        f"TensorFlow internal `{internal}` does not behave as "
        f"keras_largebatch._tf_internals expects on TensorFlow "
        f"{tf.__version__} (checked on "
        f"{', '.join(_tf_internals.TENSORFLOW_VERSIONS_CHECKED)}). Seen: {seen}"
    )


@pytest.fixture(scope="module")
def worker_checks(tmp_path_factory):
    log = tmp_path_factory.mktemp("tf_internals") / "worker.log"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    codes = localhost.run([[sys.executable, WORKER]], 240, logs=[log], env=env)
    text = log.read_text()
    assert codes == [0], text[-3000:]
    line = [x for x in text.splitlines() if x.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])


WORKER_CHECKS = [
    "replace_cross_device_ops",
    "cluster_spec",
    "task_id",
    "collective_key_base",
    "CollectiveAllReduce properties",
    "_all_reduce / batch_reduce_implementation hook",
    "launchers are TensorFlow's too",
    "_all_reduce_per_replica_values hook (graph)",
    "_all_reduce_per_replica_values hook (eager)",
    "tf_all_reduce (int32, by TensorFlow's reduction)",
    "batch_reduce_implementation hook",
    "reduce_without_merge_call (the package's strategy)",
    "_all_reduce without merge_call (in a cond; variable aggregation)",
    "Launcher.gather (_all_gather)",
    "Launcher.broadcast (_next_instance_key, _options, _device, "
    "_group_key, _group_size)",
    "Launcher.broadcast of bfloat16",
    "Launcher.for_subgroup (CollectiveKeys)",
]


@pytest.mark.parametrize("internal", WORKER_CHECKS)
def test_strategy_and_collective_internals_work(worker_checks, internal):
    ok, seen = worker_checks[internal]
    assert ok, _message(internal, seen)


def test_in_xla_context_is_true_only_when_tracing_for_xla():
    seen = {}

    def probe(name):
        seen[name] = _tf_internals.in_xla_context()
        return tf.constant(0.0)

    probe("eager")
    tf.function(lambda: probe("tf.function"))()
    tf.function(lambda: probe("jit_compile"), jit_compile=True)()
    want = {"eager": False, "tf.function": False, "jit_compile": True}
    assert seen == want, _message("GraphOrParentsInXlaContext", seen)


def test_strategy_supports_no_merge_call_answers_inside_a_strategy():
    outside = _tf_internals.strategy_supports_no_merge_call()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        inside = _tf_internals.strategy_supports_no_merge_call()
        expected = not strategy.extended._use_merge_call()
    # No strategy: nothing to merge, so `True`.
    assert (outside, inside) == (True, expected), _message(
        "tf.__internal__.distribute.strategy_supports_no_merge_call",
        (outside, inside),
    )


def test_maybe_merge_call_runs_in_the_cross_replica_context():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    seen = []

    def merged(distribution, value):
        seen.append((distribution is strategy,
                     tf.distribute.in_cross_replica_context(), value))

    def replica_fn():
        _tf_internals.maybe_merge_call(merged, strategy, 3)

    strategy.run(replica_fn)
    assert seen == [(True, True, 3)], _message(
        "tf.__internal__.distribute.interim.maybe_merge_call", seen
    )


def test_local_variable_is_not_mirrored_under_a_strategy_scope():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variable = _tf_internals.local_variable(tf.zeros([3]), "residual")
        mirrored = tf.Variable(tf.zeros([3]))
    assert isinstance(mirrored, tf.distribute.DistributedValues)
    seen = (type(variable).__name__, variable.trainable)
    assert not isinstance(variable, tf.distribute.DistributedValues) and (
        not variable.trainable
    ), _message("ResourceVariable", seen)


# TensorFlow's private names that the package uses (`_tf_internals`).
_PRIVATE = re.compile(
    r"tensorflow\.python|tf\.__internal__|\.extended\._\w+"
    r"|\.(_cross_device_ops|_cluster_spec|_communication_options"
    r"|_collective_keys|_id_in_cluster|_inferred_cross_device_ops"
    r"|_collective_key_base|_all_gather|_next_instance_key|_options"
    r"|_device|_devices|_group_key|_group_size|_launchers|_lock"
    r"|_canonicalize_devices|_all_devices_match|_all_reduce"
    r"|_all_reduce_per_replica_values|_get_cross_device_ops)\b"
    r"|def (_all_reduce|_all_reduce_per_replica_values"
    r"|batch_reduce_implementation)\("
)


def test_only_tf_internals_reaches_private_tensorflow():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_tf_internals.py" and path.parent == PACKAGE:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _PRIVATE.search(line.split("#")[0]):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line}")
    assert not found, (
        "TensorFlow's private API outside keras_largebatch/_tf_internals.py:"
        "\n" + "\n".join(found)
    )
