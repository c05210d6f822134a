import keras
from keras import ops

from keras_largebatch import decay
from keras_largebatch.api_export import keras_largebatch_export


@keras_largebatch_export("keras_largebatch.LARS")
class LARS(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling (LARS) with momentum.

    For each variable `w` with gradient `g`, always in float32 arithmetic:

    ```python
    wd = weight_decay if decayed(w) else 0
    trust = eta * |w| / (|g| + wd * |w| + epsilon)  # if adapted(w), |w|, |g| > 0
    trust = 1                                       # otherwise
    u = g + wd * w
    v = momentum * v + learning_rate * trust * u
    w = w - v                # nesterov: w = w - (momentum * v + lr * trust * u)
    ```

    `decayed(w)` and `adapted(w)` hold exactly for kernels (`ndim > 1`), not
    for biases or batch-norm gamma and beta (Jia et al., 2018). Weight decay
    is coupled: it enters the trust ratio and the momentum, and is not applied
    again by the base class. Velocities are float32 whatever the variable
    dtype; for float16 variables use `LARSMixed`, which also keeps float32
    master weights.

    Args:
        learning_rate: A float, a `keras.optimizers.schedules` schedule or a
            callable; the global learning rate. Must be > 0.
        momentum: Float in [0, 1). Defaults to `0.9`.
        eta: Float > 0, the trust coefficient. Defaults to `0.001`.
        weight_decay: Float >= 0, coupled L2 decay on kernels. Defaults to
            `0.0`.
        epsilon: Float >= 0 added to the trust-ratio denominator. Defaults to
            `0.0`.
        nesterov: Bool, Nesterov momentum (needs `momentum > 0`). Defaults to
            `False`.
        exclude_from_weight_decay: Optional list of regexes; variables whose
            `variable.path` matches one are not decayed.
        exclude_from_layer_adaptation: Optional list of regexes; variables
            whose `variable.path` matches one get a trust ratio of 1.
        **kwargs: Other `keras.optimizers.Optimizer` arguments (`clipnorm`,
            `global_clipnorm`, `clipvalue`, `use_ema`, `loss_scale_factor`,
            `gradient_accumulation_steps`, `name`, ...).

    References:
        - You et al., 2017, "Large Batch Training of Convolutional Networks",
          arXiv:1708.03888.
        - Jia et al., 2018, "Highly Scalable Deep Learning Training System
          with Mixed-Precision: Training ImageNet in Four Minutes",
          arXiv:1807.11205.
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
        name="lars",
        **kwargs,
    ):
        _check_hyperparameters(
            learning_rate, momentum, eta, weight_decay, epsilon, nesterov
        )
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = float(momentum)
        self.eta = float(eta)
        self.weight_decay = float(weight_decay)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
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

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._lars_flags = {}
        self._set_lars_flags(variables, variables)
        self.momentums = []
        if self.momentum:
            self.momentums = [
                self.add_variable(
                    shape=v.shape,
                    dtype="float32",
                    initializer="zeros",
                    name=f"{v.name}_momentum",
                )
                for v in variables
            ]

    def _set_lars_flags(self, variables, sources):
        # Static per-variable (updatable, decayed, adapted), keyed like the optimizer's
        # slots: the TensorFlow backend hands `update_step` the raw
        # tf.Variable, which has no Keras `path`. `LARSMixed` points its
        # float32 masters at the model variables they stand for.
        for v, source in zip(variables, sources):
            self._lars_flags[self._var_key(v)] = (
                _is_updatable(source),
                self.is_decayed(source),
                self.is_adapted(source),
            )

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
        # Weight decay is coupled into the LARS update in `update_step`.
        return

    use_fused_path = True
    """Use the backend's fused kernels where there are some.

    torch: `torch._foreach_*` over all float32 variables; TensorFlow: one
    `ResourceApplyMomentum` per float32 variable. Chosen by backend, not by
    exact class, so subclasses keep it; tests set it to False to check the
    fused paths against the generic one."""

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() == "torch" and self.use_fused_path:
            from keras_largebatch.optimizers import torch_lars

            torch_lars.update_step(self, grads, trainable_variables, learning_rate)
        else:
            super()._backend_update_step(grads, trainable_variables, learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        updatable, decayed, adapted = self._lars_flags[self._var_key(variable)]
        if not updatable:
            return
        fused_tf = (
            self.use_fused_path
            and keras.backend.backend() == "tensorflow"
            and keras.backend.standardize_dtype(variable.dtype) == "float32"
        )
        w = ops.cast(variable, "float32")
        g = ops.cast(_densify(gradient), "float32")
        lr = ops.cast(learning_rate, "float32")
        wd = self.weight_decay if decayed else 0.0
        update = ops.add(g, ops.multiply(w, wd)) if wd else g
        if adapted:
            w_norm, g_norm = _norm(w), _norm(g)
            valid = ops.logical_and(w_norm > 0, g_norm > 0)
            denominator = g_norm + wd * w_norm + self.epsilon
            trust = ops.where(
                valid,
                self.eta * w_norm / ops.where(valid, denominator, 1.0),
                1.0,
            )
            lr = lr * trust
        step = ops.multiply(update, lr)
        velocity = None
        if self.momentum:
            velocity = self.momentums[self._get_variable_index(variable)]
        if fused_tf:
            from keras_largebatch.optimizers import tf_lars

            tf_lars.apply_step(
                variable, velocity, step, self.momentum, self.nesterov
            )
            return
        if velocity is not None:
            new_velocity = ops.add(ops.multiply(velocity, self.momentum), step)
            self.assign(velocity, new_velocity)
            if self.nesterov:
                step = ops.add(ops.multiply(new_velocity, self.momentum), step)
            else:
                step = new_velocity
        self.assign(variable, ops.cast(ops.subtract(w, step), variable.dtype))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "eta": self.eta,
                "weight_decay": self.weight_decay,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
                "exclude_from_weight_decay": (
                    self.exclude_from_weight_decay_patterns
                ),
                "exclude_from_layer_adaptation": (
                    self.exclude_from_layer_adaptation_patterns
                ),
            }
        )
        return config


def _norm(x):
    return ops.sqrt(ops.sum(ops.square(x)))


def _is_updatable(variable):
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return variable.trainable and keras.backend.is_float_dtype(dtype)


def _densify(gradient):
    # TensorFlow gives `IndexedSlices` for `Embedding` lookups; the trust
    # ratio needs the norm of the full gradient, so make it dense.
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if isinstance(gradient, tf.IndexedSlices):
            return tf.convert_to_tensor(gradient)
    return gradient


def _as_list(patterns):
    return None if patterns is None else list(patterns)


def _check_hyperparameters(
    learning_rate, momentum, eta, weight_decay, epsilon, nesterov
):
    def number(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if number(learning_rate) and not learning_rate > 0:
        raise ValueError(
            "`learning_rate` must be > 0 (a float, a schedule or a callable). "
            f"Received: learning_rate={learning_rate}"
        )
    if not number(momentum) or not 0 <= momentum < 1:
        raise ValueError(
            f"`momentum` must be a float in [0, 1). Received: momentum={momentum}"
        )
    if not number(eta) or not eta > 0:
        raise ValueError(f"`eta` must be a float > 0. Received: eta={eta}")
    if not number(weight_decay) or not weight_decay >= 0:
        raise ValueError(
            "`weight_decay` must be a float >= 0. "
            f"Received: weight_decay={weight_decay}"
        )
    if not number(epsilon) or not epsilon >= 0:
        raise ValueError(
            f"`epsilon` must be a float >= 0. Received: epsilon={epsilon}"
        )
    if nesterov and not momentum > 0:
        raise ValueError(
            "`nesterov` needs `momentum` > 0. "
            f"Received: nesterov={nesterov}, momentum={momentum}"
        )
