from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import mixed
from keras_largebatch.optimizers.lars import LARS


@keras_largebatch_export("keras_largebatch.LARSMixed")
class LARSMixed(mixed.MixedOptimizer):
    """LARS with dynamic loss scaling and float32 master weights.

    The mixed-precision method of Jia et al. (2018): forward and backward run
    in float16, then each step

    ```python
    g = all_reduce_sum(g)                 # tf.distribute: still loss-scaled
    if not all_finite(g):                 # skip: nothing is written
        loss_scale /= 2
    else:
        g = float32(g) / loss_scale       # folded into the LARS pass
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
    after `dynamic_growth_steps` finite steps. Under a `tf.distribute`
    strategy the gradients are summed across replicas while still
    multiplied by the loss scale, then every replica unscales and checks
    the same sum (`all_reduce_scaled_gradients`).

    Args:
        learning_rate, momentum, eta, weight_decay, epsilon, nesterov,
        exclude_from_weight_decay, exclude_from_layer_adaptation: As `LARS`.
        initial_scale: Float > 0, the initial loss scale. Defaults to `2**15`.
        dynamic_growth_steps: Int >= 1. Defaults to `2000`.
        dynamic: Bool, as Keras' `LossScaleOptimizer` takes it. `True`: the
            loss scale halves on a skipped step and doubles after
            `dynamic_growth_steps` finite ones. `False`: it stays
            `initial_scale` (a fixed scale); a step with non-finite
            gradients is still skipped. Defaults to `True`.
        name: The optimizer's name. Defaults to `None`: a unique name from
            the class, `"lars_mixed"`, `"lars_mixed_1"`, ...
        **kwargs: Other arguments of the inner `LARS` (`clipnorm`,
            `global_clipnorm`, `gradient_accumulation_steps`, ...), except
            `loss_scale_factor`: the loss scale is this optimizer's
            (`initial_scale`, `dynamic`), and a fixed factor raises a
            `ValueError` (Keras' `LossScaleOptimizer` would silently drop
            it).

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
        dynamic=True,
        name=None,
        **kwargs,
    ):
        super().__init__(
            LARS,
            dict(
                learning_rate=learning_rate,
                momentum=momentum,
                eta=eta,
                weight_decay=weight_decay,
                epsilon=epsilon,
                nesterov=nesterov,
                exclude_from_weight_decay=exclude_from_weight_decay,
                exclude_from_layer_adaptation=exclude_from_layer_adaptation,
                **kwargs,
            ),
            initial_scale,
            dynamic_growth_steps,
            dynamic,
            name,
        )
