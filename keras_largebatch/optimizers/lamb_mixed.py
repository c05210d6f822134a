from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import mixed
from keras_largebatch.optimizers.lamb import LAMB


@keras_largebatch_export("keras_largebatch.LAMBMixed")
class LAMBMixed(mixed.MixedOptimizer):
    """LAMB with dynamic loss scaling and float32 master weights.

    `MixedOptimizer`'s mixed-precision step (Jia et al., 2018) with the
    `LAMB` rule on the float32 masters. Use it as
    `model.compile(optimizer=LAMBMixed(...))` under `mixed_float16`.

    Args:
        learning_rate, beta_1, beta_2, epsilon, weight_decay,
        exclude_from_weight_decay, exclude_from_layer_adaptation,
        trust_clip: As `LAMB`.
        initial_scale: Float > 0, the initial loss scale. Defaults to `2**15`.
        dynamic_growth_steps: Int >= 1. Defaults to `2000`.
        dynamic: Bool, as Keras' `LossScaleOptimizer` takes it. `True`: the
            loss scale halves on a skipped step and doubles after
            `dynamic_growth_steps` finite ones. `False`: it stays
            `initial_scale` (a fixed scale); a step with non-finite
            gradients is still skipped. Defaults to `True`.
        name: The optimizer's name. Defaults to `None`: a unique name from
            the class, `"lamb_mixed"`, `"lamb_mixed_1"`, ...
        **kwargs: Other arguments of the inner `LAMB` (`clipnorm`,
            `global_clipnorm`, `gradient_accumulation_steps`, ...), except
            `loss_scale_factor`, which raises a `ValueError`.

    References:
        - You et al., 2019, arXiv:1904.00962.
        - Micikevicius et al., 2018, "Mixed Precision Training",
          arXiv:1710.03740.
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
        initial_scale=2.0**15,
        dynamic_growth_steps=2000,
        dynamic=True,
        name=None,
        **kwargs,
    ):
        super().__init__(
            LAMB,
            dict(
                learning_rate=learning_rate,
                beta_1=beta_1,
                beta_2=beta_2,
                epsilon=epsilon,
                weight_decay=weight_decay,
                exclude_from_weight_decay=exclude_from_weight_decay,
                exclude_from_layer_adaptation=exclude_from_layer_adaptation,
                trust_clip=trust_clip,
                **kwargs,
            ),
            initial_scale,
            dynamic_growth_steps,
            dynamic,
            name,
        )
