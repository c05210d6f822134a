"""The learning-rate rules of `AdaptiveBatch`: how the rate follows k.

One entry per rule: a `Rule` subclass registered with `register`, whose
name is the `learning_rate_rule=` argument (and a choice of
`--adaptive_learning_rate`), whose docstring says the factor and whose
`factor` computes it, as a factor on the compiled rate or schedule, with
`S = k / k0`. `AdaptiveBatch` and the command's flags read `RULES` and
nothing else.

References:
    - Smith, Kindermans, Ying & Le, 2018, arXiv:1711.00489.
    - Johnson, Agrawal, Gu & Guestrin, 2020, "AdaScale SGD",
      arXiv:2007.05105.
"""

import math

from keras_largebatch._shared import registrar
from keras_largebatch.adaptive_batch import defaults

RULES = {}
"""Name -> the registered `Rule`, in registration order."""


class Rule:
    """A learning-rate rule of `AdaptiveBatch`.

    Attributes:
        name: the `learning_rate_rule=` argument that picks it.
        reads_noise_scale: its factor reads B_simple from the statistics.
    """

    name = None
    reads_noise_scale = False

    def resolve(self, optimizer):
        """The rule that applies to `optimizer` (the accumulating one):
        this one, but for `"auto"`."""
        return self

    def factor(self, scale, noise_ratio):
        """The factor on the compiled rate at `scale = k / k0`;
        `noise_ratio = B_simple / (batch_size * k0)` (NaN unless
        `reads_noise_scale`, or before it is measured)."""
        raise NotImplementedError(type(self).__name__)


# Adds an instance of a `Rule` subclass to `RULES`.
register = registrar(RULES, Rule)


@register
class Auto(Rule):
    """`defaults.AUTO_RULE_FOR_SGD` (`"linear"`) for Keras' `SGD`,
    `defaults.AUTO_RULE_OTHERWISE` (`"unchanged"`) for every other
    optimizer (LARS, LAMB and their mixed forms, Adam, ...), whose steps
    are normalised by the gradient's size, which falls as the batch
    grows."""

    name = "auto"

    def resolve(self, optimizer):
        import keras  # Here: the command's flags read `RULES` without it.

        if isinstance(optimizer, keras.optimizers.SGD):
            return RULES[defaults.AUTO_RULE_FOR_SGD]
        return RULES[defaults.AUTO_RULE_OTHERWISE]


@register
class Unchanged(Rule):
    """1: the growing batch replaces part of the decay (Smith et al.)."""

    name = "unchanged"

    def factor(self, scale, noise_ratio):
        return 1.0


@register
class AdaScale(Rule):
    """AdaScale's gain, from the statistics at the change:

    ```python
    r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2)   # sigma^2 = tr(Sigma) / B0
      = (B_simple/B0 + 1) / (B_simple/(S B0) + 1)  # mu^2 = |G|^2
    ```

    with `B0 = batch_size * k0`; `S` while B_simple is not measurable
    (noise dominates).
    """

    name = "adascale"
    reads_noise_scale = True

    def factor(self, scale, noise_ratio):
        if not (math.isfinite(noise_ratio) and noise_ratio > 0):
            return scale
        return (noise_ratio + 1) / (noise_ratio / scale + 1)


@register
class Linear(Rule):
    """`S`."""

    name = "linear"

    def factor(self, scale, noise_ratio):
        return scale


@register
class Sqrt(Rule):
    """`sqrt(S)`."""

    name = "sqrt"

    def factor(self, scale, noise_ratio):
        return math.sqrt(scale)
