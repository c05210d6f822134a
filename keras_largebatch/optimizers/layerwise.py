"""What LARS and LAMB share: which variables are decayed and adapted, float32
slots named from the variable's path, coupled weight decay, the per-step
values a mixed-precision wrapper hands the rule (as an argument, down to
`update_step`), and the lookup of a rule's fused backend path (the argument
checks are `keras_largebatch._shared`'s).

`decayed(w)` and `adapted(w)` are decided once, at `build`, from the Keras
variable (`keras_largebatch.decay`): kernels only, minus the variables whose
`path` matches `exclude_from_weight_decay` / `exclude_from_layer_adaptation`,
minus Keras' own `exclude_from_weight_decay(var_list=..., var_names=...)`.
"""

import dataclasses
import functools
import importlib
import sys
import types
from typing import Any
from typing import Mapping

import keras
from keras import ops

from keras_largebatch import decay
from keras_largebatch._shared import check_number


@dataclasses.dataclass(frozen=True)
class VariableRule:
    """How the layer-wise rule treats one variable, decided at `build`.

    Attributes:
        updated: a trainable float variable (others are left alone).
        decayed: gets the coupled weight decay.
        adapted: gets a layer-wise trust ratio (otherwise 1).
    """

    updated: bool
    decayed: bool
    adapted: bool


@dataclasses.dataclass(frozen=True)
class GradientStep:
    """What a mixed-precision wrapper hands the rule with one step's gradients.

    Attributes:
        inverse_scale: `1 / loss_scale` when the gradients arrive multiplied
            by the loss scale (the rule multiplies it into its own scaling of
            each gradient: no separate pass), `None` when they arrive
            unscaled.
        squared_norms: `sum(g ** 2)` of each gradient as it arrives, keyed by
            the rule's key of the variable it updates (the wrapper took them
            in its finiteness check; LARS takes its gradient norms from them
            rather than read each gradient again). A variable absent here has
            its norm computed by the rule.
        reduced: the gradients are already summed across replicas (under
            `tf.distribute`, the wrapper sums them while loss-scaled), so the
            rule does not all-reduce them again.
        counted: the rule adds 1 to its `iterations` counter after the
            step. False: the wrapper counts the step itself, outside the
            `cond` that skips non-finite steps (a `tf.distribute` strategy
            without `merge_call` cannot update that counter, whose value is
            the first replica's, inside a `cond`).
        finite: `None` when the step is known to be applied; else a 0-d
            boolean device tensor, and where it is false the rule writes
            nothing: no variable, slot or counter changes (the gradients may
            then hold infinities and NaNs). The torch wrapper's step that
            never waits for the device (`torch_mixed`) masks a skipped step
            this way, rather than read the flag on the host.
    """

    inverse_scale: Any = None
    squared_norms: Mapping = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    reduced: bool = False
    counted: bool = True
    finite: Any = None

    @property
    def unscaled(self):
        """Whether the gradients arrive unscaled."""
        return self.inverse_scale is None


PLAIN_STEP = GradientStep()
"""Unscaled gradients, no known norms, not yet summed across replicas: what
a rule assumes when Keras' own `apply` calls it."""


class LayerwiseOptimizer(keras.optimizers.Optimizer):
    """Base of `LARS` and `LAMB`; subclasses define `_build_slots`,
    `update_step` and, where a backend has a fused update of the whole step,
    `fused_paths`.

    `apply` takes, besides Keras' arguments, the `GradientStep` a
    mixed-precision wrapper computed for these gradients, and hands it down
    as an argument to `update_step(gradient, variable, learning_rate,
    gradient_step)` (Keras' own calls leave it at `PLAIN_STEP`).
    """

    fused_paths = types.MappingProxyType({})
    """Backend name -> the module of the rule's fused update on that
    backend, whose `update_step(optimizer, grads, variables, learning_rate,
    gradient_step)` replaces the per-variable loop (on TensorFlow, it may
    run that loop through `_tensorflow_update_step` with its own update of
    one variable). Imported at `build`
    (it imports the backend's framework); inherited by subclasses, as
    Keras' `TorchOptimizer.__new__` is not."""

    def __init__(
        self,
        learning_rate,
        weight_decay,
        exclude_from_weight_decay,
        exclude_from_layer_adaptation,
        name,
        **kwargs,
    ):
        check_number(
            "learning_rate", learning_rate, lambda x: x > 0,
            "> 0 (a float, a schedule or a callable)", optional=True,
        )
        check_number("weight_decay", weight_decay, lambda x: x >= 0, ">= 0")
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.weight_decay = float(weight_decay)
        self._decay_excludes = decay.compile_patterns(
            exclude_from_weight_decay, "exclude_from_weight_decay"
        )
        self._adaptation_excludes = decay.compile_patterns(
            exclude_from_layer_adaptation, "exclude_from_layer_adaptation"
        )
        self.exclude_from_weight_decay_patterns = _as_list(
            exclude_from_weight_decay
        )
        self.exclude_from_layer_adaptation_patterns = _as_list(
            exclude_from_layer_adaptation
        )

    reads_gradient_norms = False
    """Whether `update_step` reads each gradient's norm (and so takes the
    `squared_norms` of a `GradientStep` instead of reading it again)."""

    saved_by_wrapper = False
    """Set by a mixed wrapper on its rule: the wrapper saves the rule's
    variables with its own, keyed (`checkpoint`), and the rule's own store
    stays empty so that no other optimizer reads them by position."""

    use_fused_path = True
    """Use the backend's fused update where there is one.

    Looked up through the class's ancestors, so subclasses keep it; tests
    set it to False to check the fused paths against the generic one."""

    def apply(self, grads, trainable_variables=None, gradient_step=None):
        """Keras' `apply`, given what a mixed-precision wrapper computed.

        Args:
            grads, trainable_variables: As `keras.optimizers.Optimizer.apply`.
            gradient_step: Optional `GradientStep`: the inverse loss scale
                still in `grads`, their squared norms, whether they are
                already summed across replicas. Handed down as an argument
                to `update_step`. With an inverse scale, the rule must
                neither clip nor accumulate gradients (those need unscaled
                values).
        """
        if gradient_step is None or _is_plain(gradient_step):
            return super().apply(grads, trainable_variables)
        if gradient_step.finite is not None and not masks_skipped_steps(self):
            raise ValueError(
                "A `gradient_step` with a `finite` flag needs a fused path "
                f"that masks a skipped step; {type(self).__name__} has none "
                f"on {keras.backend.backend()} with these settings (an EMA, "
                "gradient accumulation or `use_fused_path=False`). "
                f"Received: gradient_step.finite={gradient_step.finite}"
            )
        if not gradient_step.unscaled and clips_or_accumulates(self):
            raise ValueError(
                "A `gradient_step` with an `inverse_scale` needs unscaled "
                f"gradients: {type(self).__name__} clips or accumulates "
                "them. Received: gradient_step.inverse_scale="
                f"{gradient_step.inverse_scale}"
            )
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        self._check_variables_are_known(variables)
        with keras.name_scope(self.name, caller=self):
            grads, variables = self._filter_empty_gradients(grads, variables)
            grads, variables = (
                self._overwrite_variables_directly_with_gradients(
                    grads, variables
                )
            )
            if grads:
                if self.loss_scale_factor is not None:
                    grads = [
                        g if g is None else g / self.loss_scale_factor
                        for g in grads
                    ]
                self._apply_gradients(grads, variables, gradient_step)
                for variable in variables:
                    if variable.constraint is not None:
                        variable.assign(variable.constraint(variable))
        if gradient_step.counted:
            self._iterations.assign_add(
                1 if gradient_step.finite is None else
                ops.cast(gradient_step.finite, self._iterations.dtype)
            )

    def _apply_gradients(self, grads, variables, gradient_step):
        """Keras' `_backend_apply_gradients` with `gradient_step` handed to
        `_backend_update_step`. Accumulation (reached on TensorFlow only,
        with gradients the wrapper summed across replicas and unscaled) is
        Keras' own `cond`; the EMA overwrite is a `where`, as Keras' JAX
        optimizer does it, so that a stateless trace can run it."""
        steps = self.gradient_accumulation_steps
        if steps:
            update = ops.equal((self._iterations + 1) % steps, 0)
            accumulators = [
                self._accumulated_gradients[self._get_variable_index(v)]
                for v in variables
            ]

            def apply_average():
                averages = [
                    (g + a) / steps for g, a in zip(grads, accumulators)
                ]
                self._backend_update_step(
                    self._clip_gradients(averages), variables,
                    self.learning_rate, gradient_step,
                )
                self._backend_reset_gradient_accumulators()

            ops.cond(
                update,
                apply_average,
                lambda: self._backend_increment_gradient_accumulators(
                    grads, accumulators
                ),
            )
        else:
            self._backend_update_step(
                self._clip_gradients(grads), variables, self.learning_rate,
                gradient_step,
            )
        if self.use_ema:
            self._update_model_variables_moving_average(
                self._trainable_variables
            )
            if self.ema_overwrite_frequency:
                overwrite = ops.equal(
                    (self.iterations + 1) % self.ema_overwrite_frequency, 0
                )
                for variable, average in zip(
                    self._trainable_variables,
                    self._model_variables_moving_average,
                ):
                    variable.assign(ops.where(overwrite, average, variable))

    def build(self, variables):
        self._build_for(variables, variables)

    def _build_for(self, variables, sources):
        """Builds state for `variables`, which stand for the Keras `sources`
        (themselves, or the float32 masters of a mixed optimizer): rules and
        slot names come from the sources."""
        if self.built:
            return
        super().build(variables)
        # Keyed like the optimizer's slots: the TensorFlow backend hands
        # `update_step` the raw tf.Variable, which has no Keras `path`.
        self._rules = {
            self._var_key(v): VariableRule(
                updated=_is_updatable(s),
                decayed=self.is_decayed(s),
                adapted=self.is_adapted(s),
            )
            for v, s in zip(variables, sources)
        }
        self._build_slots(sources)
        fused_update_step(self)

    def _build_slots(self, sources):
        raise NotImplementedError(
            f"{type(self).__name__} must define `_build_slots`."
        )

    def add_slot(self, source, name):
        """A float32 zero slot shaped like `source`, named from its path as
        Keras names slots (`dense_1_kernel_momentum`)."""
        prefix = decay.variable_path(source).replace("/", "_")
        return self.add_variable(
            shape=source.shape,
            dtype="float32",
            initializer="zeros",
            name=f"{prefix}_{name}",
        )

    def rule_for(self, variable):
        """The `VariableRule` of a built variable."""
        return self._rules[self._var_key(variable)]

    def known_squared_norm(self, variable, gradient_step):
        """`sum(g ** 2)` of `variable`'s gradient in this step, scaled like
        the gradient, as the wrapper handed it in `gradient_step`; None if
        it did not."""
        return gradient_step.squared_norms.get(self._var_key(variable))

    def is_decayed(self, variable):
        """Whether the Keras `variable` gets weight decay."""
        return (
            self.weight_decay > 0
            and decay.is_kernel_like(variable)
            and not decay.matches_any(variable, self._decay_excludes)
            and self._use_weight_decay(variable)
        )

    def is_adapted(self, variable):
        """Whether the Keras `variable` gets a layer-wise trust ratio."""
        return decay.is_kernel_like(variable) and not decay.matches_any(
            variable, self._adaptation_excludes
        )

    def _apply_weight_decay(self, variables):
        # Weight decay is coupled into the update in `update_step`.
        return

    def _backend_update_step(
        self, grads, trainable_variables, learning_rate,
        gradient_step=PLAIN_STEP,
    ):
        fused = fused_update_step(self) if self.use_fused_path else None
        if fused is not None:
            fused(self, grads, trainable_variables, learning_rate,
                  gradient_step)
        elif keras.backend.backend() == "tensorflow":
            self._tensorflow_update_step(
                grads, trainable_variables, learning_rate, gradient_step
            )
        else:
            for g, v in zip(grads, trainable_variables):
                self.update_step(g, v, learning_rate, gradient_step)

    def _tensorflow_update_step(self, grads, variables, learning_rate, step,
                                update=None):
        """Keras' TensorFlow `_backend_update_step`, `step` handed on: the
        gradients are summed across replicas unless a wrapper summed them
        already (`step.reduced`), then each variable is updated in the
        strategy's update context, by `update(gradient, variable,
        learning_rate, step)` (default: `update_step`; a fused path on
        TensorFlow passes its own)."""
        from keras_largebatch import _tf_internals

        update = update or self.update_step

        pairs = [
            (g, v.value if isinstance(v, keras.Variable) else v)
            for g, v in zip(grads, variables)
        ]
        if not step.reduced:
            pairs = self._all_reduce_sum_gradients(pairs)

        def update_all(distribution, pairs, learning_rate):
            for g, v in pairs:
                distribution.extended.update(
                    v,
                    lambda v, g, lr: update(g, v, lr, step),
                    args=(g, learning_rate),
                    group=False,
                )

        _tf_internals.maybe_merge_call(
            update_all, self._distribution_strategy, pairs, learning_rate
        )

    def save_own_variables(self, store):
        if not self.saved_by_wrapper:
            super().save_own_variables(store)

    def load_own_variables(self, store):
        if not self.saved_by_wrapper:
            super().load_own_variables(store)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "weight_decay": self.weight_decay,
                "exclude_from_weight_decay": (
                    self.exclude_from_weight_decay_patterns
                ),
                "exclude_from_layer_adaptation": (
                    self.exclude_from_layer_adaptation_patterns
                ),
            }
        )
        return config


def fused_update_step(optimizer):
    """The current backend's fused update for `optimizer`'s rule, as its
    class (or the nearest ancestor) declares it in `fused_paths`,
    `update_step(optimizer, grads, variables, learning_rate,
    gradient_step)`, or None."""
    module = _fused_module(optimizer)
    return None if module is None else module.update_step


def masks_skipped_steps(optimizer):
    """Whether `optimizer.apply` takes a `GradientStep` whose `finite` is a
    device flag: its fused path masks a skipped step (the module says so in
    `MASKS_SKIPPED_STEPS`), and nothing Keras' `apply` adds around the rule
    writes then (an EMA, gradient accumulation)."""
    module = _fused_module(optimizer) if optimizer.use_fused_path else None
    return bool(
        getattr(module, "MASKS_SKIPPED_STEPS", False)
        and not optimizer.use_ema
        and not optimizer.gradient_accumulation_steps
    )


def _fused_module(optimizer):
    name = type(optimizer).fused_paths.get(keras.backend.backend())
    if name is None:
        return None
    # `torch.compile` traces a lookup in `sys.modules`, not an import:
    # `build` imports the module, outside any compiled step.
    module = sys.modules.get(name)
    if module is None:
        module = importlib.import_module(name)
    return module


def norm(x):
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


def trust_ratio(numerator, denominator, valid):
    """numerator / denominator where `valid`, else 1 (no NaN either way)."""
    return ops.where(
        valid, numerator / ops.where(valid, denominator, 1.0), 1.0
    )


def densify(gradient):
    # TensorFlow gives `IndexedSlices` for `Embedding` lookups; the trust
    # ratio needs the norm of the full gradient, so make it dense.
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if isinstance(gradient, tf.IndexedSlices):
            return tf.convert_to_tensor(gradient)
    return gradient


def _is_updatable(variable):
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return variable.trainable and keras.backend.is_float_dtype(dtype)


def _is_plain(step):
    return (step.unscaled and not step.squared_norms and not step.reduced
            and step.counted and step.finite is None)


def clips_or_accumulates(optimizer):
    """Whether `optimizer` clips or accumulates gradients (which then must
    arrive unscaled)."""
    return bool(
        optimizer.clipnorm or optimizer.clipvalue or optimizer.global_clipnorm
        or optimizer.gradient_accumulation_steps
    )


def _as_list(patterns):
    return None if patterns is None else list(patterns)

