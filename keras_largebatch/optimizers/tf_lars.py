"""The LARS update for the TensorFlow backend (`LARS.fused_paths`).

Keras' TensorFlow update (`keras_apply.tensorflow_update_step`:
the gradients summed across replicas, each variable updated in the
strategy's update context) with the last part of each float32 variable's
update in one kernel: `ResourceApplyMomentum` with a learning rate of 1 and
the scaled update `step = lr * trust * (g + wd * w)` as its gradient
computes exactly LARS's

    v = momentum * v + step;  w = w - v      (nesterov: w = w - (momentum * v + step))

in place, where the generic ops materialise four temporaries of the
variable's size. It runs in a `tf.distribute` update context too (the
velocity's handle resolves to the local replica's copy). Variables of other
dtypes take the generic `LARS.update_step`.
"""

import functools

import keras
import tensorflow as tf

from keras_largebatch.optimizers import keras_apply


def update_step(optimizer, grads, variables, learning_rate, gradient_step):
    """`LARS.update_step` for every variable of the step, `optimizer` a
    `LARS`, `gradient_step` the `layerwise.GradientStep` it would get."""
    keras_apply.tensorflow_update_step(
        optimizer, grads, variables, learning_rate, gradient_step,
        update=functools.partial(_update_variable, optimizer),
    )


def _update_variable(optimizer, gradient, variable, learning_rate,
                     gradient_step):
    float32 = keras.backend.standardize_dtype(variable.dtype) == "float32"
    if not float32 or not optimizer.rule_for(variable).updated:
        optimizer.update_step(gradient, variable, learning_rate, gradient_step)
        return
    _, step = optimizer.scaled_update(
        gradient, variable, learning_rate, gradient_step
    )
    velocity = None
    if optimizer.momentum:
        velocity = optimizer.momentums[optimizer._get_variable_index(variable)]
    apply_step(variable, velocity, step, optimizer.momentum, optimizer.nesterov)


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
