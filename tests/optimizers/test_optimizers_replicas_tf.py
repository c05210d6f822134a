"""LARSMixed under tf.distribute: an overflow on one replica skips everywhere."""

import subprocess
import sys
import textwrap

import keras
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
