"""The chain of optimizer wrappers, walked in one place.

A wrapper holds the optimizer it wraps as `inner_optimizer`, as Keras'
`LossScaleOptimizer` does:

```
NoiseScaleOptimizer -> LARSMixed (loss scale, float32 masters) -> LARS
```

The noise-scale wrapper is found in the chain
(`noise_scale.find_noise_scale_optimizer`), the loss scales are read from
it (`train.checkpointing.files.loss_scales`), and the innermost optimizer
is the rule: it decays (`decay.exclude_bias_and_norm`) and holds Keras'
gradient accumulators (`noise_scale.accumulating_optimizer`).

Pure Python: `decay` imports it below the optimizers.
"""


def chain(optimizer):
    """`optimizer` and the optimizers it wraps, outermost first (nothing
    for None)."""
    while optimizer is not None:
        yield optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)


def innermost(optimizer):
    """The last optimizer of `optimizer`'s chain (None for None)."""
    last = optimizer
    for last in chain(optimizer):
        pass
    return last
