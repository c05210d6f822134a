"""The choices and bounds that the flags' declarations name
(`run_config.py`), importable without Keras or a backend.

The choices of a registry are read from it (`--dataset`'s from
`train/data/registry.py`, `--adaptive_batch`'s and
`--adaptive_learning_rate`'s from the adaptive batch's `policies` and
`rules`): each imports Keras only where it runs, not at import.
"""

from keras_largebatch.adaptive_batch import policies as adaptive_policies
from keras_largebatch.adaptive_batch import rules as adaptive_rules
from keras_largebatch.train.data import registry

MODELS = ("alexnet_bn", "resnet50", "resnet50_v1_5", "resnet_cifar")
DATASETS = registry.NAMES
DATASET_HELP = registry.flag_help()
OPTIMIZERS = ("lars_mixed", "lars", "lamb_mixed", "lamb", "sgd")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
DISTRIBUTIONS = ("none", "multi_worker", "data_parallel")
ADAPTIVE_POLICIES = ("none",) + tuple(adaptive_policies.POLICIES)
ADAPTIVE_RULES = tuple(adaptive_rules.RULES)

# (valid, expected): a value's check and what it says is valid.
NONNEGATIVE = (lambda x: x >= 0, ">= 0")
POSITIVE = (lambda x: x > 0, "> 0")
UNIT = (lambda x: 0 <= x < 1, "in [0, 1)")
FRACTION = (lambda x: 0 < x <= 1, "in (0, 1]")
RESNET_DEPTH = (lambda x: x >= 8 and (x - 2) % 6 == 0,
                "6n + 2 with n >= 1 (8, 14, 20, ...)")
VERBOSITY = (lambda x: x in (0, 1, 2), "0, 1 or 2")
# One class is learnt trivially (accuracy 1.0 says nothing); 0 infers.
MAX_NUM_CLASSES = 100_000  # Why: --num_classes' help.
NUM_CLASSES = (lambda x: x != 1 and x <= MAX_NUM_CLASSES,
               f"0 (inferred) or 2 to {MAX_NUM_CLASSES:,}")
MAX_IMAGE_SIZE = 1024  # Why: --image_size's help.
IMAGE_SIZE = (lambda x: x <= MAX_IMAGE_SIZE, f"at most {MAX_IMAGE_SIZE}")
