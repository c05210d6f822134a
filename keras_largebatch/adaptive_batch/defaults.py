"""The adaptive batch's defaults, in one place: `AdaptiveBatch`'s arguments
and the command's flags (`--noise_scale_multiple`, `--adaptive_learning_rate`)
read them from here.

`AUTO_RULE_FOR_SGD` and `AUTO_RULE_OTHERWISE` are what
`learning_rate_rule="auto"` resolves to: the rules that kept the most
accuracy for the fewest updates in docs/large-batch-study.md's comparison
("Growing the batch").
"""

POLICY = "noise_scale"
NOISE_SCALE_MULTIPLE = 1.0  # c: the batch target as a multiple of B_simple
LEARNING_RATE_RULE = "auto"
AUTO_RULE_FOR_SGD = "sqrt"  # Keras' SGD, alone or in a LossScaleOptimizer
AUTO_RULE_OTHERWISE = "unchanged"  # LARS, LAMB, their mixed forms, Adam, ...
