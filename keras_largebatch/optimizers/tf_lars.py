"""The last part of the LARS update for TensorFlow float32 variables.

`ResourceApplyMomentum` with a learning rate of 1 and the scaled update as
its gradient computes exactly LARS's

    v = momentum * v + step;  w = w - v      (nesterov: w = w - (momentum * v + step))

in one kernel, in place, where the generic ops materialise four temporaries
of the variable's size. It runs in a `tf.distribute` update context too
(the velocity's handle resolves to the local replica's copy).
"""

import keras
import tensorflow as tf


def apply_step(variable, velocity, step, momentum, nesterov):
    if isinstance(variable, keras.Variable):
        variable = variable.value
    if velocity is None:
        tf.raw_ops.ResourceApplyGradientDescent(
            var=variable.handle, alpha=tf.constant(1.0), delta=step
        )
        return
    tf.raw_ops.ResourceApplyMomentum(
        var=variable.handle,
        accum=velocity.value.handle,
        lr=tf.constant(1.0),
        grad=step,
        momentum=tf.constant(momentum),
        use_nesterov=nesterov,
    )
