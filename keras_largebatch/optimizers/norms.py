"""The L2 norms LARS, LAMB and the gradient noise scale take, by backend.

`squared_norm(x)` is `sum(x ** 2)` in one read of `x`; `norm(x)` its square
root. The torch fast paths take theirs for all tensors at once
(`torch_foreach.norms`).
"""

import functools

import keras
from keras import ops


def norm(x):
    """The L2 norm of `x`."""
    return ops.sqrt(squared_norm(x))


def squared_norm(x):
    """sum(x ** 2) in one read of `x`, by backend.

    - TensorFlow without XLA: the `L2Loss` kernel (the generic ops would
      materialise `x ** 2` first).
    - TensorFlow's XLA on a CPU compiles a reduction into a slow scalar
      loop. There the sum is the trace of `Xᵀ X` for `x` viewed as an
      `[n/8, 8]` matrix `X`, a matrix product XLA hands to its vectorised,
      threaded GEMM (a dot product of `x` with itself for sizes not
      divisible by 8); docs/benchmarks.md has the timings.
    - Otherwise the reduction: XLA on a GPU fuses it, JAX's XLA:CPU
      compiles it well, torch's fused paths have their own
      (`torch_foreach.squared_norms`).
    """
    if keras.backend.backend() != "tensorflow":
        return ops.sum(ops.square(x))
    import tensorflow as tf

    from keras_largebatch import _tf_internals

    if not _tf_internals.in_xla_context():
        return 2.0 * tf.nn.l2_loss(x)
    if _on_accelerator():
        return tf.reduce_sum(tf.square(x))
    flat = tf.reshape(x, [-1])
    size = flat.shape[0]
    if size is not None and size % 8 == 0 and size >= 4096:
        columns = tf.reshape(flat, [-1, 8])
        return tf.linalg.trace(tf.matmul(columns, columns, transpose_a=True))
    return tf.tensordot(flat, flat, 1)


@functools.cache
def _on_accelerator():
    """Whether TensorFlow has a GPU, where XLA would compile for it."""
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))
