"""The float16 wire at 64 and 1,024 replicas, against float64.

Each replica holds what Keras hands `LARSMixed` under `mixed_float16`: its
gradient divided by the number of replicas `n` (`scale_loss_for_distribution`)
and multiplied by the loss scale, in float32. The test puts it on the wire
the way `FusedCollectiveAllReduce` does (`wire_format`, `native.pack`), sums
the `n` wires in float16 in ring order (each step rounds to float16, as the
ring's float16 kernels do), unpacks and unscales in float32 as `LARSMixed`
does, and compares with the float64 mean gradient.
"""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="keras_largebatch.distribute needs the TensorFlow backend",
)

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    from keras_largebatch.distribute import all_reduce
    from keras_largebatch.distribute import compression
    from keras_largebatch.distribute import native

LOSS_SCALE = 2.0**15  # LARSMixed's default initial scale
SIZE = 4096


def local_gradients(n, seed=0):
    """Per-replica gradients, log-uniform in 1e-7..1e-2, random signs."""
    rng = np.random.default_rng(seed)
    magnitude = 10.0 ** rng.uniform(-7, -2, size=(n, SIZE))
    return (magnitude * rng.choice([-1.0, 1.0], size=(n, SIZE))).astype(
        np.float32
    )


def ring_sum_float16(wires):
    total = wires[0].astype(np.float16)
    for w in wires[1:]:
        total = (total.astype(np.float32) + w.astype(np.float32)).astype(
            np.float16
        )
    return total


def relative_error(x, reference):
    return np.linalg.norm(x - reference) / np.linalg.norm(reference)


def reduce_on_the_fp16_wire(g_local):
    n = g_local.shape[0]
    held = tf.constant(g_local * np.float32(LOSS_SCALE / n))  # float32
    wire_dtype, prescale, postscale = all_reduce.wire_format(
        tf.float32, 1, tf.distribute.ReduceOp.SUM, n,
        compression.FP16Compressor,
    )
    wires = native.pack([held], dtype=wire_dtype, scale=prescale)
    wires = wires.numpy().reshape(n, SIZE)
    total = ring_sum_float16(wires)
    (summed,) = native.unpack(
        tf.constant(total), [(SIZE,)], tf.float32, scale=postscale
    )
    unscaled = summed / tf.constant(LOSS_SCALE, tf.float32)
    return held.numpy(), wires, unscaled.numpy()


@pytest.mark.parametrize("n, bound", [(64, 0.005), (1024, 0.01)])
def test_loss_scaled_fp16_wire_sums_within_1_percent_at_1024_replicas(
    n, bound
):
    g_local = local_gradients(n)
    held, wires, reduced = reduce_on_the_fp16_wire(g_local)
    # What one replica puts on the wire: its float32 value cast to float16,
    # no division by n beyond Keras' own.
    np.testing.assert_array_equal(wires[3], held[3].astype(np.float16))
    reference = g_local.astype(np.float64).sum(axis=0) / n
    error = relative_error(reduced.astype(np.float64), reference)
    assert error <= bound, error


def test_unscaled_wire_divided_by_n_again_flushes_1024_replicas_to_zero():
    # The arithmetic the wire must avoid (g / n**2, no loss scale): the same
    # measure on it gives ~100%, so the bound above can fail.
    n = 1024
    g_local = local_gradients(n)
    wires = (g_local / np.float32(n * n)).astype(np.float16)
    reduced = ring_sum_float16(wires).astype(np.float64) * n
    reference = g_local.astype(np.float64).sum(axis=0) / n
    assert relative_error(reduced, reference) > 0.5
