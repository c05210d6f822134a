"""What LARS and LAMB share: which variables are decayed and adapted, float32
slots named from the variable's path, coupled weight decay, the per-step
values a mixed-precision wrapper hands the rule, and the backend's fused
path (the argument checks are `keras_largebatch._shared`'s).

`decayed(w)` and `adapted(w)` are decided once, at `build`, from the Keras
variable (`keras_largebatch.decay`): kernels only, minus the variables whose
`path` matches `exclude_from_weight_decay` / `exclude_from_layer_adaptation`,
minus Keras' own `exclude_from_weight_decay(var_list=..., var_names=...)`.
"""

import contextlib
import dataclasses
import functools
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
    """

    inverse_scale: Any = None
    squared_norms: Mapping = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    reduced: bool = False

    @property
    def unscaled(self):
        """Whether the gradients arrive unscaled."""
        return self.inverse_scale is None


_PLAIN_STEP = GradientStep()


class _StepInProgress:
    """The `GradientStep` of a rule's `apply` in progress, for its
    `update_step`, whose Keras signature `(gradient, variable,
    learning_rate)` has no argument for it.

    Not thread-local: under `tf.distribute` the updates may run on another
    thread than `apply` (`merge_call`). Replica threads of one step may
    overlap; the last one out restores the plain step.
    """

    def __init__(self):
        self.step = _PLAIN_STEP

    @contextlib.contextmanager
    def holding(self, step):
        self.step = step
        try:
            yield
        finally:
            if self.step is step:
                self.step = _PLAIN_STEP


class LayerwiseOptimizer(keras.optimizers.Optimizer):
    """Base of `LARS` and `LAMB`; subclasses define `_build_slots` and
    `update_step`.

    `apply` takes, besides Keras' arguments, the `GradientStep` a
    mixed-precision wrapper computed for these gradients; `update_step`
    reads it as `self.gradient_step`. A backend's fused update of the whole
    step, where there is one, is looked up by `fused_update_step`.
    """

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
        self._in_progress = _StepInProgress()

    use_fused_path = True
    """Use the backend's fused update where there is one.

    Looked up through the class's ancestors, so subclasses keep it; tests
    set it to False to check the fused paths against the generic one."""

    @property
    def gradient_step(self):
        """The `GradientStep` of the `apply` in progress (a plain one, with
        unscaled gradients and no known norms, outside a wrapper's call)."""
        return self._in_progress.step

    def apply(self, grads, trainable_variables=None, gradient_step=None):
        """Keras' `apply`, given what a mixed-precision wrapper computed.

        Args:
            grads, trainable_variables: As `keras.optimizers.Optimizer.apply`.
            gradient_step: Optional `GradientStep`: the inverse loss scale
                still in `grads`, their squared norms, whether they are
                already summed across replicas. Held for this call only
                (Keras' `update_step(gradient, variable, learning_rate)` has
                no argument for it).
        """
        if gradient_step is None:
            return super().apply(grads, trainable_variables)
        with self._in_progress.holding(gradient_step):
            return super().apply(grads, trainable_variables)

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

    def known_squared_norm(self, variable):
        """`sum(g ** 2)` of `variable`'s gradient in this step, scaled like
        the gradient, as the wrapper handed it; None if it did not."""
        return self.gradient_step.squared_norms.get(self._var_key(variable))

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

    def _all_reduce_sum_gradients(self, grads_and_vars):
        # Keras' TensorFlow optimizers sum gradients across replicas here;
        # a mixed wrapper has summed them already (loss-scaled).
        if self.gradient_step.reduced:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        fused = fused_update_step(self) if self.use_fused_path else None
        if fused is None:
            super()._backend_update_step(
                grads, trainable_variables, learning_rate
            )
        else:
            fused(self, grads, trainable_variables, learning_rate)

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


def _torch_fused_modules():
    from keras_largebatch.optimizers import torch_lamb
    from keras_largebatch.optimizers import torch_lars
    from keras_largebatch.optimizers.lamb import LAMB
    from keras_largebatch.optimizers.lars import LARS

    return {LARS: torch_lars, LAMB: torch_lamb}


# Keras picks a backend's optimizer subclass by class
# (`TorchOptimizer.__new__`); here each backend maps rule classes to the
# module of their fused update, loaded on first use (it imports the
# backend's framework).
_FUSED_MODULES = {"torch": _torch_fused_modules}


@functools.cache
def _fused_modules(backend):
    return _FUSED_MODULES.get(backend, dict)()


def fused_update_step(optimizer):
    """The current backend's fused update for `optimizer`'s rule (its class
    or the nearest ancestor with one), `update_step(optimizer, grads,
    variables, learning_rate)`, or None."""
    modules = _fused_modules(keras.backend.backend())
    for cls in type(optimizer).__mro__:
        if cls in modules:
            return modules[cls].update_step
    return None


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


def _as_list(patterns):
    return None if patterns is None else list(patterns)

