from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import mixed
from keras_largebatch.optimizers.lars import LARS


@keras_largebatch_export("keras_largebatch.LARSMixed")
class LARSMixed(mixed.MixedOptimizer):
    """LARS with dynamic loss scaling and float32 master weights.

    `MixedOptimizer`'s mixed-precision step (Jia et al., 2018) with the
    `LARS` rule on the float32 masters; unless it clips or accumulates
    gradients, LARS takes its gradient norms from the finiteness check and
    `1 / loss_scale` folded into its update. Use it as
    `model.compile(optimizer=LARSMixed(...))` under `mixed_float16`.

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
