from keras import ops

from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import layerwise
from keras_largebatch.optimizers import norms


@keras_largebatch_export("keras_largebatch.LARS")
class LARS(layerwise.LayerwiseOptimizer):
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
            `gradient_accumulation_steps`, ...).
        name: The optimizer's name. Defaults to `None`: a unique name from
            the class, `"lars"`, `"lars_1"`, ... as Keras names `"sgd"`.

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
        name=None,
        **kwargs,
    ):
        check_number("momentum", momentum, lambda x: 0 <= x < 1, "in [0, 1)")
        check_number("eta", eta, lambda x: x > 0, "> 0")
        check_number("epsilon", epsilon, lambda x: x >= 0, ">= 0")
        require(
            not nesterov or momentum > 0, "nesterov", nesterov,
            f"False when `momentum` is 0 (momentum={momentum})",
        )
        super().__init__(
            learning_rate,
            weight_decay,
            exclude_from_weight_decay,
            exclude_from_layer_adaptation,
            name=name,
            **kwargs,
        )
        self.momentum = float(momentum)
        self.eta = float(eta)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)

    def _build_slots(self, sources):
        self.momentums = []
        if self.momentum:
            self.momentums = [self.add_slot(s, "momentum") for s in sources]

    fused_paths = {
        "torch": "keras_largebatch.optimizers.torch_lars",
        "tensorflow": "keras_largebatch.optimizers.tf_lars",
    }
    reads_gradient_norms = True

    def update_step(
        self, gradient, variable, learning_rate,
        gradient_step=layerwise.PLAIN_STEP,
    ):
        if not self.rule_for(variable).updated:
            return
        w, step = self.scaled_update(
            gradient, variable, learning_rate, gradient_step
        )
        if self.momentum:
            velocity = self.momentums[self._get_variable_index(variable)]
            new_velocity = ops.add(ops.multiply(velocity, self.momentum), step)
            self.assign(velocity, new_velocity)
            if self.nesterov:
                step = ops.add(ops.multiply(new_velocity, self.momentum), step)
            else:
                step = new_velocity
        self.assign(variable, ops.cast(ops.subtract(w, step), variable.dtype))

    def scaled_update(self, gradient, variable, learning_rate, gradient_step):
        """`(w, step)`: the variable in float32 and
        `lr * trust * (g + wd * w)`, its update before momentum."""
        rule = self.rule_for(variable)
        w = ops.cast(variable, "float32")
        g = ops.cast(layerwise.densify(gradient), "float32")
        lr = ops.cast(learning_rate, "float32")
        wd = self.weight_decay if rule.decayed else 0.0
        g_scale = gradient_step.inverse_scale  # None: g is unscaled
        if rule.adapted:
            w_norm = norms.norm(w)
            known = self.known_squared_norm(variable, gradient_step)
            g_norm = norms.norm(g) if known is None else ops.sqrt(known)
            if g_scale is not None:
                g_norm = g_norm * g_scale
            valid = ops.logical_and(w_norm > 0, g_norm > 0)
            denominator = g_norm + wd * w_norm + self.epsilon
            lr = lr * layerwise.trust_ratio(self.eta * w_norm, denominator, valid)
        # step = lr * (g + wd * w)
        step = ops.multiply(g, lr if g_scale is None else lr * g_scale)
        if wd:
            step = ops.add(step, ops.multiply(w, lr * wd))
        return w, step

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "eta": self.eta,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
            }
        )
        return config

