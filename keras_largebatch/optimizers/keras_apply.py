"""Keras' apply loop, repeated with a `GradientStep` handed down.

`LayerwiseOptimizer.apply` takes, besides Keras' arguments, what a
mixed-precision wrapper computed for the gradients (`layerwise.GradientStep`),
and the rule's `update_step` needs it as an argument. Keras has no hook
for that, so the steps of three of its private methods run again here:

- `apply`: Keras' `BaseOptimizer.apply`;
- `apply_gradients`: `BaseOptimizer._backend_apply_gradients`;
- `tensorflow_update_step`: the TensorFlow optimizer's
  `_backend_update_step`.

Their Keras bodies are pinned by source hash per checked Keras version
(`tests/test_keras_private_api.py`): a step a new release adds fails there,
naming the function here to update.
"""

import keras
from keras import ops


def apply(optimizer, grads, trainable_variables, gradient_step):
    """Keras' `Optimizer.apply` of `grads` to `trainable_variables` (None:
    the optimizer's own), `gradient_step` handed to `update_step`."""
    if trainable_variables is None:
        trainable_variables = optimizer._trainable_variables
    variables = list(trainable_variables)
    if not optimizer.built:
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(variables)
        optimizer.built = True
    optimizer._check_variables_are_known(variables)
    with keras.name_scope(optimizer.name, caller=optimizer):
        grads, variables = optimizer._filter_empty_gradients(grads, variables)
        grads, variables = (
            optimizer._overwrite_variables_directly_with_gradients(
                grads, variables
            )
        )
        if grads:
            if optimizer.loss_scale_factor is not None:
                grads = [
                    g if g is None else g / optimizer.loss_scale_factor
                    for g in grads
                ]
            apply_gradients(optimizer, grads, variables, gradient_step)
            for variable in variables:
                if variable.constraint is not None:
                    variable.assign(variable.constraint(variable))
    if gradient_step.counted:
        optimizer._iterations.assign_add(
            1 if gradient_step.finite is None else
            ops.cast(gradient_step.finite, optimizer._iterations.dtype)
        )


def apply_gradients(optimizer, grads, variables, gradient_step):
    """Keras' `_backend_apply_gradients` with `gradient_step` handed to
    `_backend_update_step`. Accumulation (reached on TensorFlow only,
    with gradients the wrapper summed across replicas and unscaled) is
    Keras' own `cond`; the EMA overwrite is a `where`, as Keras' JAX
    optimizer does it, so that a stateless trace can run it."""
    steps = optimizer.gradient_accumulation_steps
    if steps:
        update = ops.equal((optimizer._iterations + 1) % steps, 0)
        accumulators = [
            optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
            for v in variables
        ]

        def apply_average():
            averages = [
                (g + a) / steps for g, a in zip(grads, accumulators)
            ]
            optimizer._backend_update_step(
                optimizer._clip_gradients(averages), variables,
                optimizer.learning_rate, gradient_step,
            )
            optimizer._backend_reset_gradient_accumulators()

        ops.cond(
            update,
            apply_average,
            lambda: optimizer._backend_increment_gradient_accumulators(
                grads, accumulators
            ),
        )
    else:
        optimizer._backend_update_step(
            optimizer._clip_gradients(grads), variables,
            optimizer.learning_rate, gradient_step,
        )
    if optimizer.use_ema:
        optimizer._update_model_variables_moving_average(
            optimizer._trainable_variables
        )
        if optimizer.ema_overwrite_frequency:
            overwrite = ops.equal(
                (optimizer.iterations + 1) % optimizer.ema_overwrite_frequency,
                0,
            )
            for variable, average in zip(
                optimizer._trainable_variables,
                optimizer._model_variables_moving_average,
            ):
                variable.assign(ops.where(overwrite, average, variable))


def tensorflow_update_step(optimizer, grads, variables, learning_rate, step,
                           update=None):
    """Keras' TensorFlow `_backend_update_step`, `step` handed on: the
    gradients are summed across replicas unless a wrapper summed them
    already (`step.reduced`), then each variable is updated in the
    strategy's update context, by `update(gradient, variable,
    learning_rate, step)` (default: `optimizer.update_step`; a fused path
    on TensorFlow passes its own)."""
    from keras_largebatch import _tf_internals

    update = update or optimizer.update_step

    pairs = [
        (g, v.value if isinstance(v, keras.Variable) else v)
        for g, v in zip(grads, variables)
    ]
    if not step.reduced:
        pairs = optimizer._all_reduce_sum_gradients(pairs)

    def update_all(distribution, pairs, learning_rate):
        for g, v in pairs:
            distribution.extended.update(
                v,
                lambda v, g, lr: update(g, v, lr, step),
                args=(g, learning_rate),
                group=False,
            )

    _tf_internals.maybe_merge_call(
        update_all, optimizer._distribution_strategy, pairs, learning_rate
    )
