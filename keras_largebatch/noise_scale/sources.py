"""Where the gradients that measure the noise scale come from.

The estimator compares gradients of two batch sizes from one step: the
replicas of a TensorFlow `tf.distribute` strategy (each replica's gradient
and the reduced one), else Keras' gradient accumulation (each micro-batch
gradient and their average), which the innermost optimizer of a chain of
wrappers holds.
"""

import keras

from keras_largebatch._shared import require
from keras_largebatch._wrappers import innermost


def accumulating_optimizer(optimizer):
    """The optimizer that holds Keras' accumulators and micro-batch counter:
    the innermost of a chain of wrappers (`NoiseScaleOptimizer`,
    `LossScaleOptimizer`, `LARSMixed`, `LAMBMixed`), which is handed
    unscaled gradients."""
    return innermost(optimizer)


def check_measurable(optimizer, strategy=None):
    """Which source measures the noise scale: `"replicas"` or
    `"accumulation"`.

    It needs two batch sizes from one step: several replicas of a
    TensorFlow `tf.distribute` `strategy` (each replica's gradient and the
    reduced one), else gradient accumulation with
    `gradient_accumulation_steps = k >= 2` on `optimizer` (or on its inner
    optimizer; each micro-batch gradient and their average). Under JAX's
    `keras.distribution.DataParallel` the gradient is already global:
    accumulation is the source there.

    Raises:
        ValueError: with neither.
    """
    if _replicas(strategy) > 1:
        return "replicas"
    k = accumulating_optimizer(optimizer).gradient_accumulation_steps
    require(k is not None and k >= 2, "gradient_accumulation_steps", k,
            "an int >= 2 to measure the gradient noise scale (it compares "
            "micro-batch gradients with their average), or train on several "
            "replicas of a TensorFlow strategy")
    return "accumulation"


def replica_count():
    """The replicas of the step being traced: those of the TensorFlow
    replica context, else 1."""
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


def _replicas(strategy):
    if keras.backend.backend() != "tensorflow":
        return 1
    return getattr(strategy, "num_replicas_in_sync", 1)
