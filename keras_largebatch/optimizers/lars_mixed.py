import keras
from keras import ops

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers.lars import LARS

_LOW_PRECISION = ("float16", "bfloat16")


@keras_largebatch_export("keras_largebatch.LARSMixed")
class LARSMixed(keras.optimizers.LossScaleOptimizer):
    """LARS with dynamic loss scaling and float32 master weights.

    The mixed-precision method of Jia et al. (2018): forward and backward run
    in float16, then each step

    ```python
    g = float32(g) / loss_scale          # unscale in float32
    if not all_finite(g):                 # skip: nothing is written
        loss_scale /= 2
    else:
        master = LARS(master, g)          # the LARS rule, in float32
        w = cast(master, w.dtype)         # float16 / bfloat16 variables
    ```

    Under `mixed_float16` the model's variables are float32 and are their
    own masters. Under the `float16` policy each float16 variable gets a
    float32 master copy in this optimizer's state; an update smaller than
    float16's resolution accumulates there instead of being rounded away.
    If a model variable is changed outside the optimizer (`set_weights`,
    `load_weights`), its master is re-synchronised on the next step.

    A subclass of `keras.optimizers.LossScaleOptimizer`, so
    `model.compile(optimizer=LARSMixed(...))` under `mixed_float16` keeps it
    as it is and Keras' trainers scale the loss. The loss scale doubles
    after `dynamic_growth_steps` finite steps.

    Args:
        learning_rate, momentum, eta, weight_decay, epsilon, nesterov,
        exclude_from_weight_decay, exclude_from_layer_adaptation: As `LARS`.
        initial_scale: Float > 0, the initial loss scale. Defaults to `2**15`.
        dynamic_growth_steps: Int >= 1. Defaults to `2000`.
        name: The optimizer's name. Defaults to `"lars_mixed"`.
        **kwargs: Other arguments of the inner `LARS` (`clipnorm`,
            `global_clipnorm`, `gradient_accumulation_steps`, ...).

    References:
        - Jia et al., 2018, arXiv:1807.11205.
        - Micikevicius et al., 2018, "Mixed Precision Training",
          arXiv:1710.03740.
    """

    def __init__(
        self,
        learning_rate,
        momentum=0.9,
        eta=0.001,
        weight_decay=0.0,
        epsilon=0.0,
        nesterov=False,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        initial_scale=2.0**15,
        dynamic_growth_steps=2000,
        name="lars_mixed",
        **kwargs,
    ):
        number = isinstance(initial_scale, (int, float)) and not isinstance(
            initial_scale, bool
        )
        if not number or not initial_scale > 0:
            raise ValueError(
                "`initial_scale` must be a float > 0. "
                f"Received: initial_scale={initial_scale}"
            )
        if (
            not isinstance(dynamic_growth_steps, int)
            or isinstance(dynamic_growth_steps, bool)
            or dynamic_growth_steps < 1
        ):
            raise ValueError(
                "`dynamic_growth_steps` must be an int >= 1. "
                f"Received: dynamic_growth_steps={dynamic_growth_steps}"
            )
        inner = LARS(
            learning_rate,
            momentum=momentum,
            eta=eta,
            weight_decay=weight_decay,
            epsilon=epsilon,
            nesterov=nesterov,
            exclude_from_weight_decay=exclude_from_weight_decay,
            exclude_from_layer_adaptation=exclude_from_layer_adaptation,
            **kwargs,
        )
        super().__init__(
            inner,
            initial_scale=float(initial_scale),
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
        )

    def build(self, var_list):
        self.step_counter = self.add_variable(
            shape=(), dtype="int", initializer="zeros", aggregation="none",
            name="step_counter",
        )
        self.dynamic_scale = self.add_variable(
            shape=(), dtype="float32",
            initializer=keras.initializers.Constant(self.initial_scale),
            aggregation="none", name="dynamic_scale",
        )
        self._masters = {}
        for v in var_list:
            if keras.backend.standardize_dtype(v.dtype) in _LOW_PRECISION:
                self._masters[self._var_key(v)] = self.add_variable(
                    shape=v.shape,
                    dtype="float32",
                    initializer=_copy_of(v),
                    name=f"{v.name}_master",
                )
        targets = [self._target(v) for v in var_list]
        self.inner_optimizer.build(targets)
        self.inner_optimizer._set_lars_flags(targets, var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    def save_own_variables(self, store):
        # Keras' LossScaleOptimizer lists the inner optimizer's variables in
        # its own `variables` and saves them, and the saver stores them again
        # under `inner_optimizer/`: the momentum twice. Only the loss-scale
        # state and the masters are this optimizer's own.
        for i, variable in enumerate(self._variables):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store):
        # Files written before the fix hold the inner variables here too,
        # after this optimizer's own: those are read from `inner_optimizer/`.
        if len(store.keys()) not in (
            len(self._variables), len(self.variables)
        ):
            return super().load_own_variables(store)  # Warns and skips.
        for i, variable in enumerate(self._variables):
            variable.assign(store[str(i)])

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list, var_names)

    def _target(self, variable):
        return self._masters.get(self._var_key(variable), variable)

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        variables = trainable_variables or self._trainable_variables
        scale = self.dynamic_scale
        unscaled = [
            g
            if g is None or self._overwrite_variable_with_gradient(v)
            else ops.divide(ops.cast(g, "float32"), scale)
            for g, v in zip(grads, variables)
        ]
        targets = [self._target(v) for v in variables]
        for v, master in zip(variables, targets):
            if master is not v:
                # Re-sync a master whose variable was set from outside.
                m, w = master.value, v.value
                master.assign(
                    ops.where(
                        ops.equal(ops.cast(m, w.dtype), w),
                        m,
                        ops.cast(w, "float32"),
                    )
                )
        self.inner_optimizer.apply(unscaled, trainable_variables=targets)
        for v, master in zip(variables, targets):
            if master is not v:
                v.assign(ops.cast(master, v.dtype))
        # Grow the scale after `dynamic_growth_steps` finite steps. No cond:
        # branches that assign cannot be traced statelessly (JAX).
        counter, scale = self.step_counter.value, self.dynamic_scale.value
        grow = ops.equal(counter, self.dynamic_growth_steps - 1)
        self.dynamic_scale.assign(ops.where(grow, scale * 2.0, scale))
        self.step_counter.assign(
            ops.where(grow, ops.zeros_like(counter), counter + 1)
        )

    def check_finite(self, grads):
        if keras.backend.backend() == "torch":
            from keras_largebatch.optimizers import torch_lars

            return torch_lars.all_finite(grads)
        finite = super().check_finite(grads)
        if keras.backend.backend() == "tensorflow":
            finite = _agree_across_replicas(finite)
        return finite

    def _common_apply(self, grads, trainable_variables=None):
        if keras.backend.backend() != "jax":
            return super()._common_apply(grads, trainable_variables)
        finite = self.check_finite(grads)
        if not _is_traced(finite):
            # Eager JAX: branch in Python (`ops.cond` would trace the
            # stateful branches and leak tracers).
            if bool(finite):
                self._stateful_handle_finite_grads(grads, trainable_variables)
            else:
                self._stateful_handle_non_finite_grads()
            return
        super()._common_apply(grads, trainable_variables)

    def _stateless_handle_finite_grads(
        self, optimizer_variables, grads, trainable_variables
    ):
        mapping = list(zip(self._trainable_variables, trainable_variables))
        mapping += list(zip(self.variables, optimizer_variables))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self._stateful_handle_finite_grads(grads, None)
        return (
            [scope.get_current_value(v) for v in self._trainable_variables],
            [scope.get_current_value(v) for v in self.variables],
        )

    def get_config(self):
        config = self.inner_optimizer.get_config()
        config.update(
            name=self.name,
            initial_scale=self.initial_scale,
            dynamic_growth_steps=self.dynamic_growth_steps,
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = keras.saving.deserialize_keras_object(
                config["learning_rate"], custom_objects=custom_objects
            )
        return cls(**config)


def _copy_of(variable):
    def initializer(shape, dtype=None):
        return ops.cast(variable.value, "float32")

    return initializer


def _agree_across_replicas(finite):
    # Under tf.distribute the gradients reach `apply` before their
    # all-reduce: a replica whose local gradients overflowed would skip the
    # step (and its all-reduce) while the others wait in it. All replicas
    # take the same decision: finite only if finite everywhere.
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return finite
    overflowed = context.all_reduce(
        tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, "float32")
    )
    return overflowed == 0


def _is_traced(x):
    import jax

    return isinstance(x, jax.core.Tracer)
