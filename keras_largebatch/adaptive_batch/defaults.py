"""The adaptive batch's defaults, in one place: `AdaptiveBatch`'s arguments
and the command's flags (`--noise_scale_multiple`,
`--adaptive_learning_rate`, `--adaptive_start_multiple`,
`--max_global_batch_size`) read them from here.

They are the policy the study settled on for SGD (docs/large-batch-study.md
compares them, with n per arm and intervals, with fixed batches and ramps;
no verdict makes them the best of the variants tried): start
at 4 x the batch the optimizer was compiled with, follow 4 x B_simple, the
rate linear in the batch for SGD, up to 8 x the compiled batch.
`AUTO_RULE_FOR_SGD` and `AUTO_RULE_OTHERWISE` are what
`learning_rate_rule="auto"` resolves to.

`PREVIOUS` holds the defaults these replaced, with which a run of the
command recorded before them resumes (`train.config.migration.upgrade`).
"""

POLICY = "noise_scale"
NOISE_SCALE_MULTIPLE = 4.0  # c: the batch target as a multiple of B_simple
LEARNING_RATE_RULE = "auto"
AUTO_RULE_FOR_SGD = "linear"  # Keras' SGD, alone or in a LossScaleOptimizer
AUTO_RULE_OTHERWISE = "unchanged"  # LARS, LAMB, their mixed forms, Adam, ...
# The first update batch, a multiple of the compiled one (batch_size * k0),
# for the policies that grow from measurements (not a schedule).
START_MULTIPLE = 4
# The largest update batch when none is given, a multiple of the compiled
# one (batch_size * k0), for the policies that grow from measurements.
MAX_MULTIPLE = 8
# Over the last ANNEAL_FRACTION of the epochs (0: none), the batch is at
# most ANNEAL_MULTIPLE times the compiled one, for the policies that grow
# from measurements.
ANNEAL_FRACTION = 0.0
ANNEAL_MULTIPLE = 4

PREVIOUS = {"noise_scale_multiple": 1.0, "auto_rule_for_sgd": "sqrt",
            "start_multiple": 1}
