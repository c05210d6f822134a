"""Growing the batch during `fit`: more micro-batches per update as the
gradient noise grows.

The update batch is `batch_size * k`: `fit` runs micro-batches of
`batch_size` examples (all replicas together) and the optimizer accumulates
k of them per update (Keras' `gradient_accumulation_steps`). `AdaptiveBatch`
raises k by powers of 2 at epoch starts, and lowers it to a cap over the
last epochs if asked (`anneal_fraction`):

```python
k = policy.accumulation_steps(inputs)    # e.g. noise_scale: near c * B_simple
k = max(k, k_now, start_multiple * k0)      # never shrinks; no schedule:
k = min(k, max_batch_size / batch_size)      #   from start_multiple up
if annealing:                                # the last anneal_fraction of
    k = min(k, anneal_multiple * k0)         #   the epochs: at most this
rate = rule.factor(k / k0, B_simple / B0) * compiled_rate
```

Where each part lives:

- `policies.py`: the policies, one registered `Policy` entry each
  (`POLICIES`);
- `rules.py`: the learning-rate rules, one registered `Rule` entry each
  (`RULES`);
- `defaults.py`: the defaults of the callback and of the command's flags;
- `batches.py`: the batches it may take (`batch_size * k0 * 2**j`) and
  the checks of its settings, shared by the callback and the flags;
- `in_effect.py`: the batch in effect (k, the rate factor, a pending
  switch), put into effect on the optimizer and saved as the
  `NoiseScaleOptimizer`'s state;
- `callback.py`: `AdaptiveBatch`, which asks the policy at each epoch's
  start and applies the change;
- `ScaledLearningRate` is in `keras_largebatch.schedules`.

A new policy or rule is one class in `policies.py` or `rules.py`,
decorated with `register`: the callback's arguments, the command's
`--adaptive_batch` and `--adaptive_learning_rate` choices and the
closed-form tests take it from there.

References:
    - Smith, Kindermans, Ying & Le, 2018, "Don't Decay the Learning Rate,
      Increase the Batch Size", arXiv:1711.00489.
    - McCandlish et al., 2018, "An Empirical Model of Large-Batch
      Training", arXiv:1812.06162.
    - Johnson, Agrawal, Gu & Guestrin, 2020, "AdaScale SGD: A User-Friendly
      Algorithm for Distributed Training", arXiv:2007.05105.
"""

import importlib

# Imported on first use, so that the registries and defaults (`policies`,
# `rules`, `defaults`: the command's flags read them) need no Keras.
_PUBLIC = {
    "AdaptiveBatch": "keras_largebatch.adaptive_batch.callback",
    "POLICIES": "keras_largebatch.adaptive_batch.policies",
    "RULES": "keras_largebatch.adaptive_batch.rules",
    "ScaledLearningRate": "keras_largebatch.schedules",
}


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AdaptiveBatch", "POLICIES", "RULES", "ScaledLearningRate"]
