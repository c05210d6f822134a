"""`MixedOptimizer`: dynamic loss scaling and float32 master weights around a
layer-wise rule, the base of `LARSMixed` and `LAMBMixed` (its torch branches
are `torch_mixed`'s)."""

import keras
from keras import ops

from keras_largebatch import decay
from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch.optimizers import checkpoint
from keras_largebatch.optimizers import layerwise
from keras_largebatch.optimizers.norms import squared_norm

_LOW_PRECISION = ("float16", "bfloat16")


class MixedOptimizer(keras.optimizers.LossScaleOptimizer):
    """Dynamic loss scaling and float32 master weights around a layer-wise
    rule: the mixed-precision step of Jia et al. (2018), shared by
    `LARSMixed` and `LAMBMixed` (`inner_class(**inner_kwargs)` is the rule).

    Forward and backward run in float16 on a loss multiplied by the loss
    scale (Keras' trainers scale it: a subclass of
    `keras.optimizers.LossScaleOptimizer`, so `model.compile` keeps it under
    `mixed_float16`); then each step

    ```python
    g = all_reduce_sum(g)                 # tf.distribute: still loss-scaled
    if not all_finite(g):                 # skip: nothing is written
        loss_scale /= 2                   # dynamic=True
    else:
        g = float32(g) / loss_scale       # folded into the rule where it can be
        master = rule(master, g)          # the layer-wise rule, in float32
        w = cast(master, w.dtype)         # float16 / bfloat16 variables
        # dynamic=True: loss_scale *= 2 after `dynamic_growth_steps` such steps
    ```

    The finiteness check reads each gradient once, as its sum of squares.
    The rule then gets the gradients still loss-scaled, with a
    `layerwise.GradientStep` holding `1 / loss_scale` (which it multiplies
    into its own scaling of each gradient) and those sums (LARS's gradient
    norms), so the check is the only extra pass. Where the rule clips or
    accumulates gradients, those need unscaled values: the gradients are
    unscaled first (on torch in place, in one pass with the check, as
    `torch.amp.GradScaler` does; `torch_mixed`). On torch the skip is a
    mask on the device rather than a branch on the host, where the rule can
    mask (`torch_mixed`). With `dynamic=False` the scale stays
    `initial_scale`, and a non-finite step is still skipped.

    Under `mixed_float16` the model's variables are float32 and are their
    own masters. Under the `float16` policy each float16 (or bfloat16)
    variable gets a float32 master copy in this optimizer's state; an
    update smaller than float16's resolution accumulates there instead of
    being rounded away. A master whose variable was changed outside the
    optimizer (`set_weights`, `load_weights`) is re-synchronised on the next
    step. Under a `tf.distribute` strategy the gradients are summed across
    replicas while still multiplied by the loss scale, then every replica
    unscales and checks the same sum (`all_reduce_scaled_gradients`).

    Of Keras' `LossScaleOptimizer` it keeps the constructor, the loss-scale
    state (`dynamic_scale`, `step_counter`), `scale_loss` and the
    properties, and overrides public methods only: `build`, `apply`,
    `stateless_apply`, `check_finite`, saving and the config. Its
    checkpoint is one store keyed by its layout, `mixed_state`
    (`checkpoint`).
    """

    def __init__(
        self,
        inner_class,
        inner_kwargs,
        initial_scale,
        dynamic_growth_steps,
        dynamic,
        name,
    ):
        value = inner_kwargs.get("loss_scale_factor")
        require(
            value is None, "loss_scale_factor", value,
            "None: the loss scale is dynamic (set `initial_scale` instead)",
        )
        check_number("initial_scale", initial_scale, lambda x: x > 0, "> 0")
        check_int("dynamic_growth_steps", dynamic_growth_steps, 1)
        require(isinstance(dynamic, bool), "dynamic", dynamic, "a bool")
        # An explicit inner name takes no unique name from users' optimizers.
        inner = inner_class(name=inner_class.__name__.lower(), **inner_kwargs)
        inner.saved_by_wrapper = True
        super().__init__(
            inner,
            initial_scale=float(initial_scale),
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
        )
        self.dynamic = dynamic
        # The checkpoint's one store (`checkpoint`): saving finds it here.
        setattr(self, checkpoint.ATTRIBUTE, checkpoint.OptimizerState(self))

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
        """Writes nothing: the whole state goes to `mixed_state`, keyed by
        its layout (`checkpoint`), where no other optimizer reads it."""

    def load_own_variables(self, store):
        """Reads nothing: `mixed_state` loads the whole state where its
        layout matches, and otherwise skips it with Keras' warning."""

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list, var_names)

    def _target(self, variable):
        return self._masters.get(self._var_key(variable), variable)

    def _folds_unscaling(self):
        """Whether the inner rule may see loss-scaled gradients, with
        `1 / loss_scale` folded in: not if it clips or accumulates them."""
        return not layerwise.clips_or_accumulates(self.inner_optimizer)

    def apply(self, grads, trainable_variables=None):
        """One step: the rule on the masters if every gradient is finite,
        else no update and half the loss scale."""
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = list(trainable_variables or self._trainable_variables)
        backend = keras.backend.backend()
        if backend == "tensorflow":
            self._apply_tensorflow(grads, variables)
        elif backend == "torch":
            from keras_largebatch.optimizers import torch_mixed

            torch_mixed.apply(self, grads, variables)
        else:
            finite, squares = self._finite_and_squares(grads)
            if _is_traced(finite):
                ops.cond(
                    finite,
                    lambda: self._apply_finite(grads, variables, squares),
                    self._skip,
                )
            elif bool(finite):  # Eager: the tracing `cond` would leak.
                self._apply_finite(grads, variables, squares)
            else:
                self._skip()

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        """`apply` as a pure function of the state (JAX's trainer)."""
        if not self.built:
            raise ValueError(
                f"To call `stateless_apply`, {type(self).__name__} must be "
                "built (i.e. its variables must have been created). You can "
                "build it via `optimizer.build(trainable_variables)`."
            )
        finite, squares = self._finite_and_squares(grads)
        mapping = list(zip(self._trainable_variables, trainable_variables))
        mapping += list(zip(self.variables, optimizer_variables))

        def stateless(step):
            with keras.StatelessScope(state_mapping=mapping) as scope:
                step()
            return (
                [scope.get_current_value(v) for v in self._trainable_variables],
                [scope.get_current_value(v) for v in self.variables],
            )

        return ops.cond(
            finite,
            lambda: stateless(lambda: self._apply_finite(
                grads, self._trainable_variables, squares
            )),
            lambda: stateless(self._skip),
        )

    def _apply_tensorflow(self, grads, variables):
        import tensorflow as tf

        from keras_largebatch import _tf_internals

        if tf.distribute.in_cross_replica_context():
            raise ValueError("apply() must be called in a replica context.")
        grads = self.all_reduce_scaled_gradients(grads)
        if _tf_internals.strategy_supports_no_merge_call():
            # The rule's step counter holds the first replica's value, which
            # such a strategy updates by `merge_call`, refused in a `cond`:
            # it counts a finite step here, after the `cond`.
            finite, squares = self._finite_and_squares(grads)
            ops.cond(
                finite,
                lambda: self._apply_finite(
                    grads, variables, squares, counted=False
                ),
                self._skip,
            )
            counter = self.inner_optimizer._iterations
            counter.assign_add(ops.cast(finite, counter.dtype))
            return

        def cross_replica(distribution, grads, variables):
            # The rule's update calls `merge_call`, which a `cond` branch
            # may do only from the cross-replica context. Every replica
            # checks the same reduced sums: the first one's answer holds.
            finite, squares = distribution.extended.call_for_each_replica(
                self._finite_and_squares, args=(grads,)
            )
            finite = distribution.experimental_local_results(finite)[0]
            ops.cond(
                finite,
                lambda: distribution.extended.call_for_each_replica(
                    self._apply_finite, args=(grads, variables, squares)
                ),
                self._skip,
            )

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(grads, variables)
        )

    def _finite_and_squares(self, grads):
        """`(finite, squares)`: whether every gradient is finite, and each
        one's `sum(float32(g) ** 2)` (None for a missing gradient), from
        one read of each. LARS takes its gradient norms from the squares
        rather than read each gradient again (on JAX, XLA would merge the
        two reads anyway; TensorFlow and torch do not)."""
        if keras.backend.backend() == "torch":
            from keras_largebatch.optimizers import torch_mixed

            return torch_mixed.check_finite(grads)
        squares = [
            None if g is None else squared_norm(ops.cast(g, "float32"))
            for g in grads
        ]
        present = [s for s in squares if s is not None]
        finite = (
            ops.isfinite(ops.sum(ops.stack(present)))
            if present else ops.convert_to_tensor(True)
        )
        return finite, squares

    def check_finite(self, grads):
        """Whether every gradient is finite, from each one's sum of
        squares."""
        return self._finite_and_squares(grads)[0]

    def _apply_finite(self, grads, variables, squares=None, unscaled=False,
                      counted=True, finite=None):
        """The rule on the masters of `variables`, then the scale doubles
        after `dynamic_growth_steps` finite steps.

        `squares` are the squared norms `_finite_and_squares` returned;
        `unscaled` says the gradients were unscaled in place already;
        `counted=False` leaves the rule's step counter to the caller. The
        rule's `GradientStep` holds `1 / loss_scale` and the squared norms
        where it takes loss-scaled gradients; where it clips or accumulates
        them, they are unscaled here first (unless `unscaled`). `finite`:
        None, or the step's flag as a device tensor, which the rule masks
        its update with (`layerwise.masks_skipped_steps`, torch only); where
        it is false, this is `_skip`.
        """
        targets = [self._target(v) for v in variables]
        inverse, norms = None, {}
        if not unscaled:
            inverse = ops.divide(1.0, self.dynamic_scale.value)
            if self._folds_unscaling():
                # `_var_key` is the rule's key of a variable too.
                norms = {
                    self._var_key(t): s
                    for t, s in zip(targets, squares or ())
                    if s is not None
                }
            else:
                grads = [
                    g if g is None or _overwrites_with_gradient(v)
                    else ops.multiply(ops.cast(g, "float32"), inverse)
                    for g, v in zip(grads, variables)
                ]
                inverse = None
        step = layerwise.GradientStep(
            inverse_scale=inverse,
            squared_norms=norms,
            # Under tf.distribute the loss-scaled gradients were summed first.
            reduced=keras.backend.backend() == "tensorflow",
            counted=counted,
            finite=finite,
        )
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
        self.inner_optimizer.apply(grads, targets, gradient_step=step)
        for v, master in zip(variables, targets):
            if master is not v:
                v.assign(ops.cast(master, v.dtype))
        if not self.dynamic:
            return
        if finite is not None:
            from keras_largebatch.optimizers import torch_mixed

            torch_mixed.update_scale(self, finite)
            return
        # No cond: branches that assign cannot be traced statelessly (JAX).
        counter, scale = self.step_counter.value, self.dynamic_scale.value
        grow = ops.equal(counter, self.dynamic_growth_steps - 1)
        self.dynamic_scale.assign(ops.where(grow, scale * 2.0, scale))
        self.step_counter.assign(
            ops.where(grow, ops.zeros_like(counter), counter + 1)
        )

    def _skip(self):
        """No update: half the loss scale (if `dynamic`), and the growth
        count restarts."""
        if not self.dynamic:
            return
        self.step_counter.assign(0)
        self.dynamic_scale.assign(ops.multiply(self.dynamic_scale, 0.5))

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
        everywhere. The rule then applies the sums as they are (its
        `GradientStep` says `reduced`).

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
            dynamic=self.dynamic,
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


def _overwrites_with_gradient(variable):
    """Keras' `overwrite_with_gradient` variables (float8 scales) take the
    gradient as their new value: it is not unscaled."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


def _is_traced(x):
    if keras.backend.backend() != "jax":
        return False
    import jax

    return isinstance(x, jax.core.Tracer)
