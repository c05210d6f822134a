import keras
from keras import ops

from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import layerwise
from keras_largebatch.optimizers import norms


@keras_largebatch_export("keras_largebatch.LAMB")
class LAMB(layerwise.LayerwiseOptimizer):
    """Layer-wise Adaptive Moments for Batch training (LAMB).

    For each variable `w` with gradient `g`, at step `t = 1, 2, ...`, always
    in float32 arithmetic:

    ```python
    wd = weight_decay if decayed(w) else 0
    m = beta_1 * m + (1 - beta_1) * g
    v = beta_2 * v + (1 - beta_2) * g**2
    m_hat = m / (1 - beta_1**t)
    v_hat = v / (1 - beta_2**t)
    r = m_hat / (sqrt(v_hat) + epsilon) + wd * w
    trust = |w| / |r|          # if adapted(w), |w|, |r| > 0
    trust = 1                  # otherwise
    trust = min(trust, 1)      # only with trust_clip
    w = w - learning_rate * trust * r
    ```

    `decayed(w)` and `adapted(w)` are LARS's: kernels (`ndim > 1`), minus
    the variables whose `variable.path` matches an exclusion regex, minus
    those given to Keras' `exclude_from_weight_decay`. Weight decay is
    coupled (inside the trust ratio), as in the paper; Keras' `Lamb` equals
    this rule only with `weight_decay=0` and for adapted variables. Moments
    are float32 whatever the variable dtype, named from the variable's path
    (`dense_1_kernel_momentum`, `dense_1_kernel_velocity`); for float16
    variables use `LAMBMixed`, which also keeps float32 master weights.

    Args:
        learning_rate: A float, a `keras.optimizers.schedules` schedule or a
            callable; the global learning rate. Must be > 0.
        beta_1: Float in [0, 1), the first moment's decay. Defaults to `0.9`.
        beta_2: Float in [0, 1), the second moment's decay. Defaults to
            `0.999`.
        epsilon: Float > 0 added to `sqrt(v_hat)`. Defaults to `1e-6`.
        weight_decay: Float >= 0, coupled decay on kernels. Defaults to
            `0.0`.
        exclude_from_weight_decay: Optional list of regexes; variables whose
            `variable.path` matches one are not decayed.
        exclude_from_layer_adaptation: Optional list of regexes; variables
            whose `variable.path` matches one get a trust ratio of 1.
        trust_clip: Bool; clip the trust ratio at 1 (LARC-style clipping).
            Defaults to `False`.
        name: The optimizer's name. Defaults to `None`: a unique name from
            the class, `"lamb"`, `"lamb_1"`, ...
        **kwargs: Other `keras.optimizers.Optimizer` arguments (`clipnorm`,
            `global_clipnorm`, `clipvalue`, `use_ema`, `loss_scale_factor`,
            `gradient_accumulation_steps`, ...).

    References:
        - You et al., 2019, "Large Batch Optimization for Deep Learning:
          Training BERT in 76 minutes", arXiv:1904.00962.
    """

    def __init__(
        self,
        learning_rate,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        weight_decay=0.0,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        trust_clip=False,
        name=None,
        **kwargs,
    ):
        check_number("beta_1", beta_1, lambda x: 0 <= x < 1, "in [0, 1)")
        check_number("beta_2", beta_2, lambda x: 0 <= x < 1, "in [0, 1)")
        check_number("epsilon", epsilon, lambda x: x > 0, "> 0")
        require(isinstance(trust_clip, bool), "trust_clip", trust_clip, "a bool")
        super().__init__(
            learning_rate,
            weight_decay,
            exclude_from_weight_decay,
            exclude_from_layer_adaptation,
            name=name,
            **kwargs,
        )
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.trust_clip = trust_clip

    def _build_slots(self, sources):
        self.momentums = [self.add_slot(s, "momentum") for s in sources]
        self.velocities = [self.add_slot(s, "velocity") for s in sources]

    def bias_corrections(self):
        """(1 - beta_1**t, 1 - beta_2**t) for this step, in float32."""
        t = ops.cast(self.iterations + 1, "float32")
        return 1.0 - ops.power(self.beta_1, t), 1.0 - ops.power(self.beta_2, t)

    fused_paths = {"torch": "keras_largebatch.optimizers.torch_lamb"}

    def update_step(
        self, gradient, variable, learning_rate,
        gradient_step=layerwise.PLAIN_STEP,
    ):
        rule = self.rule_for(variable)
        if not rule.updated:
            return
        w = ops.cast(variable, "float32")
        g = ops.cast(layerwise.densify(gradient), "float32")
        lr = ops.cast(learning_rate, "float32")
        index = self._get_variable_index(variable)
        m, v = self.momentums[index], self.velocities[index]
        if not gradient_step.unscaled:
            g = ops.multiply(g, gradient_step.inverse_scale)
        # In place, as Keras' Adam: m += (1 - beta_1) * (g - m), and so v.
        self.assign_add(m, ops.multiply(ops.subtract(g, m), 1.0 - self.beta_1))
        self.assign_add(
            v, ops.multiply(ops.subtract(ops.square(g), v), 1.0 - self.beta_2)
        )
        # r = (m / c1) / (sqrt(v / c2) + eps)
        #   = m * (sqrt(c2) / c1) / (sqrt(v) + eps * sqrt(c2)),
        # the bias corrections on scalars rather than on whole tensors.
        correction_1, correction_2 = self.bias_corrections()
        root_2 = ops.sqrt(correction_2)
        r = ops.divide(
            ops.multiply(m, root_2 / correction_1),
            ops.add(ops.sqrt(v), self.epsilon * root_2),
        )
        if rule.decayed:
            r = ops.add(r, ops.multiply(w, self.weight_decay))
        if rule.adapted:
            w_norm, r_norm = norms.norm(w), norms.norm(r)
            valid = ops.logical_and(w_norm > 0, r_norm > 0)
            trust = layerwise.trust_ratio(w_norm, r_norm, valid)
            if self.trust_clip:
                trust = ops.minimum(trust, 1.0)
            lr = lr * trust
        if keras.backend.standardize_dtype(variable.dtype) == "float32":
            self.assign_sub(variable, ops.multiply(r, lr))
        else:
            self.assign(
                variable, ops.cast(ops.subtract(w, r * lr), variable.dtype)
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "trust_clip": self.trust_clip,
            }
        )
        return config
