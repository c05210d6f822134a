"""What LARS and LAMB share: which variables are decayed and adapted, float32
slots named from the variable's path, coupled weight decay and the
backend's fused path (the argument checks are `keras_largebatch._shared`'s).

`decayed(w)` and `adapted(w)` are decided once, at `build`, from the Keras
variable (`keras_largebatch.decay`): kernels only, minus the variables whose
`path` matches `exclude_from_weight_decay` / `exclude_from_layer_adaptation`,
minus Keras' own `exclude_from_weight_decay(var_list=..., var_names=...)`.
"""

import functools

import keras
from keras import ops

from keras_largebatch import decay
from keras_largebatch._shared import check_number


class LayerwiseOptimizer(keras.optimizers.Optimizer):
    """Base of `LARS` and `LAMB`; subclasses define `_build_slots` and
    `update_step`, and may name a fused torch module in `_torch_module`."""

    _torch_module = None

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

    _gradient_scale = None
    """Set by the mixed optimizers for one step: `1 / loss_scale`, which
    `update_step` folds into its own multiplications by the gradient."""

    _known_squared_norms = None
    """Set by the mixed optimizers for one step: the gradients' squared
    norms from the finiteness check, `{id(g): (g, sum(g ** 2))}` (LARS
    reuses them as its gradient norms instead of reading each gradient
    again); read with `known_squared_norm`."""

    use_fused_path = True
    """Use the backend's fused kernels where there are some.

    Chosen by backend, not by exact class, so subclasses keep it; tests set
    it to False to check the fused paths against the generic one."""

    def build(self, variables):
        self._build_for(variables, variables)

    def _build_for(self, variables, sources):
        """Builds state for `variables`, which stand for the Keras `sources`
        (themselves, or the float32 masters of a mixed optimizer): flags and
        slot names come from the sources."""
        if self.built:
            return
        super().build(variables)
        # Keyed like the optimizer's slots: the TensorFlow backend hands
        # `update_step` the raw tf.Variable, which has no Keras `path`.
        self._flags = {
            self._var_key(v): (
                _is_updatable(s), self.is_decayed(s), self.is_adapted(s)
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

    def flags(self, variable):
        """(updatable, decayed, adapted) of a built variable."""
        return self._flags[self._var_key(variable)]

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

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        torch = keras.backend.backend() == "torch"
        if torch and self.use_fused_path and self._torch_module:
            import importlib

            module = importlib.import_module(self._torch_module)
            module.update_step(self, grads, trainable_variables, learning_rate)
        else:
            super()._backend_update_step(
                grads, trainable_variables, learning_rate
            )

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


def known_squared_norm(known, tensor):
    """The squared norm the finiteness check took of this very tensor (the
    entry holds the tensor, so its id cannot be reused), else None."""
    entry = (known or {}).get(id(tensor))
    return entry[1] if entry is not None and entry[0] is tensor else None


def norm(x):
    return ops.sqrt(squared_norm(x))


def squared_norm(x):
    """sum(x ** 2) in one read of `x`, by backend.

    - TensorFlow without XLA: the `L2Loss` kernel (the generic ops would
      materialise `x ** 2` first).
    - TensorFlow's XLA on a CPU compiles a reduction into a slow scalar
      loop (ResNet-50's 214 gradients: 83 ms, against 12 ms for `L2Loss`).
      There the sum is the trace of `Xᵀ X` for `x` viewed as an `[n/8, 8]`
      matrix `X`, a matrix product XLA hands to its vectorised, threaded
      GEMM (16 ms; a dot product of `x` with itself, used for sizes not
      divisible by 8, 26 ms).
    - Otherwise the reduction: XLA on a GPU fuses it, JAX's XLA:CPU
      compiles it well, torch's fused paths have their own
      (`torch_foreach.squared_norms`).
    """
    if keras.backend.backend() != "tensorflow":
        return ops.sum(ops.square(x))
    import tensorflow as tf

    if not _in_xla_context():
        return 2.0 * tf.nn.l2_loss(x)
    if _on_accelerator():
        return tf.reduce_sum(tf.square(x))
    flat = tf.reshape(x, [-1])
    size = flat.shape[0]
    if size is not None and size % 8 == 0 and size >= 4096:
        columns = tf.reshape(flat, [-1, 8])
        return tf.linalg.trace(tf.matmul(columns, columns, transpose_a=True))
    return tf.tensordot(flat, flat, 1)


def _in_xla_context():
    """Whether TensorFlow is tracing for XLA (`jit_compile=True`)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    graph = tf.compat.v1.get_default_graph()
    return control_flow_util.GraphOrParentsInXlaContext(graph)


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

