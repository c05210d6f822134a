"""What LARS and LAMB share: which variables are decayed and adapted, float32
slots named from the variable's path, coupled weight decay, the per-step
values a mixed-precision wrapper hands the rule (as an argument, down to
`update_step`), and the lookup of a rule's fused backend path (the argument
checks are `keras_largebatch._shared`'s, the norms `norms`', the copy of
Keras' apply loop that hands the step down `keras_apply`'s).

`decayed(w)` and `adapted(w)` are decided once, at `build`, from the Keras
variable (`keras_largebatch.decay`): kernels only, minus the variables whose
`path` matches `exclude_from_weight_decay` / `exclude_from_layer_adaptation`,
minus Keras' own `exclude_from_weight_decay(var_list=..., var_names=...)`.
"""

import dataclasses
import importlib
import re
import sys
import types
from typing import Any
from typing import Mapping

import keras
from keras import ops

from keras_largebatch import decay
from keras_largebatch._shared import check_number
from keras_largebatch.optimizers import keras_apply
# Importable from here as before the norms moved to `norms`.
from keras_largebatch.optimizers.norms import norm  # noqa: F401
from keras_largebatch.optimizers.norms import squared_norm  # noqa: F401


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
    run that loop through `keras_apply.tensorflow_update_step` with its own
    update of one variable). Imported at `build`
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
        """Keras' `apply`, given what a mixed-precision wrapper computed
        (Keras' steps, repeated in `keras_apply.apply`).

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
        keras_apply.apply(self, grads, trainable_variables, gradient_step)

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
            and self._var_key(variable) not in self._keras_excluded_keys
            and not any(p.search(variable.name)
                        for p in self._keras_excluded_names)
        )

    _keras_excluded_keys = frozenset()
    _keras_excluded_names = ()

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Keras' `exclude_from_weight_decay`, whose choice `is_decayed`
        reads from here: Keras 3.16 records it per variable key at `build`,
        and a mixed optimizer builds this rule on float32 masters, whose
        keys are not the model variables' that `var_list` names."""
        super().exclude_from_weight_decay(var_list, var_names)
        self._keras_excluded_keys = frozenset(
            self._var_key(v) for v in var_list or ()
        )
        self._keras_excluded_names = tuple(
            re.compile(name) for name in var_names or ()
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
            keras_apply.tensorflow_update_step(
                self, grads, trainable_variables, learning_rate, gradient_step
            )
        else:
            for g, v in zip(grads, trainable_variables):
                self.update_step(g, v, learning_rate, gradient_step)

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

