"""Dynamic loss scaling and float32 master weights around a layer-wise rule.

The mixed-precision method of Jia et al. (2018), shared by `LARSMixed` and
`LAMBMixed`: forward and backward run in float16, then each step

```python
g = all_reduce_sum(g)                 # tf.distribute: still loss-scaled
if not all_finite(g):                 # skip: nothing is written
    loss_scale /= 2
else:
    master = rule(master, float32(g) / loss_scale)    # in float32
    w = cast(master, w.dtype)         # float16 / bfloat16 variables
```

The unscaling is folded into the rule's own pass over the gradient (the
inner optimizer multiplies by `1 / loss_scale` where it scales anyway), so
the only extra pass is the finiteness check, one read of each gradient (its
sum of squares, which LARS reuses as its gradient norms).
Where the inner optimizer clips or accumulates gradients, those need
unscaled values: the gradients are unscaled first (on torch in place, in
one pass with the check, as `torch.amp.GradScaler` does).
"""

import keras
from keras import ops

from keras_largebatch import decay
from keras_largebatch.optimizers import layerwise
from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import require

_LOW_PRECISION = ("float16", "bfloat16")


class MixedOptimizer(keras.optimizers.LossScaleOptimizer):
    """Base of `LARSMixed` and `LAMBMixed`: `inner_class(**inner_kwargs)`
    is the rule, applied to float32 masters on unscaled gradients."""

    def __init__(
        self,
        inner_class,
        inner_kwargs,
        initial_scale,
        dynamic_growth_steps,
        name,
    ):
        value = inner_kwargs.get("loss_scale_factor")
        require(
            value is None, "loss_scale_factor", value,
            "None: the loss scale is dynamic (set `initial_scale` instead)",
        )
        check_number("initial_scale", initial_scale, lambda x: x > 0, "> 0")
        check_int("dynamic_growth_steps", dynamic_growth_steps, 1)
        # An explicit inner name takes no unique name from users' optimizers.
        inner = inner_class(name=inner_class.__name__.lower(), **inner_kwargs)
        super().__init__(
            inner,
            initial_scale=float(initial_scale),
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
        )

    def build(self, var_list):
        if self.built:
            return
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
                    name=decay.variable_path(v).replace("/", "_") + "_master",
                )
        targets = [self._target(v) for v in var_list]
        self.inner_optimizer._build_for(targets, var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    def save_own_variables(self, store):
        # Keras' LossScaleOptimizer lists the inner optimizer's variables in
        # its own `variables` and saves them, and the saver stores them again
        # under `inner_optimizer/`: the momentum twice. Only the loss-scale
        # state and the masters are this optimizer's own.
        for i, variable in enumerate(self._variables):
            store[str(i)] = keras.ops.convert_to_numpy(variable)

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

    def _folds_unscaling(self):
        """Whether the inner rule may see loss-scaled gradients, with
        `1 / loss_scale` folded in: not if it clips or accumulates them."""
        inner = self.inner_optimizer
        return not (
            inner.clipnorm or inner.clipvalue or inner.global_clipnorm
            or inner.gradient_accumulation_steps
        )

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        variables = trainable_variables or self._trainable_variables
        inverse = ops.divide(1.0, self.dynamic_scale.value)
        if self._grads_unscaled:
            pass
        elif self._folds_unscaling():
            self.inner_optimizer._gradient_scale = inverse
        else:
            grads = [
                g
                if g is None or self._overwrite_variable_with_gradient(v)
                else ops.multiply(ops.cast(g, "float32"), inverse)
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
        try:
            self.inner_optimizer.apply(grads, trainable_variables=targets)
        finally:
            self.inner_optimizer._gradient_scale = None
            self.inner_optimizer._known_squared_norms = None
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

    _grads_unscaled = False

    def _common_apply(self, grads, trainable_variables=None):
        backend = keras.backend.backend()
        if backend == "torch":
            return self._torch_apply(grads, trainable_variables)
        if backend != "jax":
            return super()._common_apply(grads, trainable_variables)
        finite = self.check_finite(grads)
        if not _is_traced(finite):
            # Eager JAX: branch in Python (`ops.cond` would trace the
            # stateful branches and leak tracers).
            if bool(finite):
                self._stateful_handle_finite_grads(grads, trainable_variables)
            else:
                self.inner_optimizer._known_squared_norms = None
                self._stateful_handle_non_finite_grads()
            return
        super()._common_apply(grads, trainable_variables)

    def _torch_apply(self, grads, trainable_variables):
        from keras_largebatch.optimizers import torch_foreach

        grads = [
            None if g is None else ops.cast(g, "float32") for g in grads
        ]
        folds = self._folds_unscaling()
        if folds:
            finite = self.check_finite(grads)
        else:
            inverse = 1.0 / self.dynamic_scale.value
            finite = torch_foreach.unscale_and_check(grads, inverse)
        if not bool(finite):
            self.inner_optimizer._known_squared_norms = None
            self._stateful_handle_non_finite_grads()
            return
        self._grads_unscaled = not folds
        try:
            self._stateful_handle_finite_grads(grads, trainable_variables)
        finally:
            self._grads_unscaled = False

    def check_finite(self, grads):
        """All finite, from each gradient's sum of squares. The sums are
        kept for this step, by tensor, as the inner rule's
        `_known_squared_norms`: LARS takes its gradient norms from them
        rather than read each gradient again (on JAX, XLA would merge the
        two reads anyway; TensorFlow and torch do not)."""
        if keras.backend.backend() == "torch":
            from keras_largebatch.optimizers import torch_foreach

            finite, known = torch_foreach.check_finite(grads)
        else:
            tensors = [g for g in grads if g is not None]
            squares = [
                layerwise.squared_norm(ops.cast(g, "float32")) for g in tensors
            ]
            known = {id(g): (g, s) for g, s in zip(tensors, squares)}
            finite = (
                ops.isfinite(ops.sum(ops.stack(squares)))
                if squares else ops.convert_to_tensor(True)
            )
        self.inner_optimizer._known_squared_norms = known
        return finite

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

    def _tf_apply(self, grads, trainable_variables=None):
        grads = self.all_reduce_scaled_gradients(grads)
        # Keras' TensorFlow optimizers sum gradients across replicas in
        # `_backend_update_step`: the inner one gets sums already.
        self.inner_optimizer._all_reduce_sum_gradients = _already_reduced
        super()._tf_apply(grads, trainable_variables)

    def all_reduce_scaled_gradients(self, grads):
        """Sums loss-scaled gradients across replicas (TensorFlow).

        The order of operations of Jia et al. (2018) under `tf.distribute`:

        ```python
        g = all_reduce_sum(g_scaled)          # still times loss_scale
        g = float32(g) / loss_scale           # every replica, same values
        if not all_finite(g): skip, halve     # hence the same decision
        else: apply the inner rule to g
        ```

        The sum is taken by the strategy's cross-device ops (fusion,
        hierarchy and float16 transport of
        `keras_largebatch.distribute.MultiWorkerMirroredStrategy` apply), on
        values the loss scale keeps in float16's normal range. It runs
        before the finiteness check, so no bucket waits for a flag computed
        from every gradient, and replicas agree on an overflow without an
        extra all-reduce: an overflow anywhere makes the sum non-finite
        everywhere. The inner optimizer then applies the reduced gradients
        without reducing them again (its `_all_reduce_sum_gradients` is
        the identity). Subclasses with another inner rule inherit this
        mechanism whole, through `_tf_apply`.

        Returns `grads` unchanged outside a replica context or with one
        replica.
        """
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        reduced = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [grads[i] for i in present]
        )
        grads = list(grads)
        for i, g in zip(present, reduced):
            grads[i] = g
        return grads

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


def _already_reduced(grads_and_vars):
    return list(grads_and_vars)


def _is_traced(x):
    import jax

    return isinstance(x, jax.core.Tracer)
