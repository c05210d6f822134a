"""LARSMixed under tf.distribute: an overflow on one replica skips everywhere."""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="tf.distribute"
)

SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import numpy as np
    import keras
    import keras_largebatch as klb

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        var = keras.Variable(np.ones((2, 2), "float32"), name="kernel")
        opt = klb.LARSMixed(0.1, initial_scale=8.0)
        opt.build([var])

    def grads_for(ctx):
        bad = tf.equal(ctx.replica_id_in_sync_group, 1)
        return tf.where(bad, np.inf, tf.fill((2, 2), 8.0))   # replica 1: inf

    @tf.function
    def step():
        def fn():
            ctx = tf.distribute.get_replica_context()
            opt.apply([grads_for(ctx)], [var])
        strategy.run(fn)

    step()
    print("VALUE", np.asarray(var.numpy()).tolist())
    print("SCALE", float(opt.dynamic_scale.numpy()))
    """
)


def test_overflow_on_one_replica_skips_the_step_on_all():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(l.split(" ", 1) for l in out.stdout.splitlines() if " " in l)
    assert lines["VALUE"] == str([[1.0, 1.0], [1.0, 1.0]])
    assert float(lines["SCALE"]) == 4.0


SUM_SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import json
    import numpy as np
    import keras
    import keras_largebatch as klb

    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(4, 3)).astype("float32")
    # Per-replica gradients of realistic size, already divided by the
    # number of replicas as Keras does, times the loss scale 2**10.
    local = [(rng.normal(size=(4, 3)) * 1e-3).astype("float32")
             for _ in range(2)]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        var = keras.Variable(w0, name="kernel")
        opt = klb.LARSMixed(0.5, momentum=0.9, eta=0.01, weight_decay=0.1,
                            initial_scale=1024.0)
        opt.build([var])

    @tf.function
    def step():
        def fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.where(tf.equal(r, 0), local[0], local[1]) * 1024.0
            opt.apply([g], [var])
        strategy.run(fn)

    step()
    print("RESULT" + json.dumps({
        "w0": w0.tolist(), "local": [g.tolist() for g in local],
        "w": [np.asarray(v).tolist() for v in
              strategy.experimental_local_results(var.value)],
        "scale": float(opt.dynamic_scale.numpy()),
    }))
    """
)


def test_replicas_apply_lars_to_the_sum_of_their_gradients_once():
    out = subprocess.run(
        [sys.executable, "-c", SUM_SCRIPT], capture_output=True, text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")][0]
    result = json.loads(line[len("RESULT"):])
    w0 = np.asarray(result["w0"], np.float64)
    g = np.sum(np.asarray(result["local"], np.float64), axis=0)
    wd = 0.1
    trust = 0.01 * np.linalg.norm(w0) / (
        np.linalg.norm(g) + wd * np.linalg.norm(w0)
    )
    expected = w0 - 0.5 * trust * (g + wd * w0)
    for w in result["w"]:  # the same on both replicas
        np.testing.assert_allclose(w, expected, rtol=1e-5)
    # Summed twice (2 g) the step would differ by far more than that.
    doubled = w0 - 0.5 * (0.01 * np.linalg.norm(w0) / (
        2 * np.linalg.norm(g) + wd * np.linalg.norm(w0))) * (2 * g + wd * w0)
    assert not np.allclose(doubled, expected, rtol=1e-4)
    assert result["scale"] == 1024.0
