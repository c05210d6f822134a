"""The flags of `keras-largebatch-train`: the one table.

`TABLE` lists each flag once: its name, type, default, help, its group
(the part of `RunConfig` that holds it), the check of its value, whether
resuming a run may change it, and whether the run records it in
`run_config.json`. Everything else about the flags is read from it:

- `rules.py`: each value's check and the rules that read several
  flags together (`check`, `check_after_resume`);
- `run_config.py`: `RunConfig`, the frozen, typed config written out a
  group at a time, its defaults this table's (a test holds its fields
  against this table);
- `load.py`: the absl flags (`define_flags`), the one order of precedence
  (`resolve`: default < the recorded run < the command line) and the
  values turned into the checked `RunConfig` (`config`);
- `help.py`: `--help` and the table in docs/training.md;
- `__init__.py`: all of them under one name, as the driver imports them.

The defaults are the embedded default run: AlexNet-BN at its minimum input
(67x67) on scikit-learn's digits, batch 32, LARSMixed with warmup and
polynomial decay, 6 epochs.
"""

import dataclasses

from keras_largebatch.adaptive_batch import defaults as adaptive_defaults
from keras_largebatch.adaptive_batch import policies as adaptive_policies
from keras_largebatch.adaptive_batch import rules as adaptive_rules
from keras_largebatch.distribute import FUSION_THRESHOLD_BYTES
from keras_largebatch.distribute import HIERARCHICAL_THRESHOLD_BYTES
from keras_largebatch.train.config import batch_schedule
from keras_largebatch.train.data import registry

MODELS = ("alexnet_bn", "resnet50", "resnet50_v1_5", "resnet_cifar")
DATASETS = registry.NAMES  # One entry each in train/data/registry.py.
OPTIMIZERS = ("lars_mixed", "lars", "lamb_mixed", "lamb", "sgd")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
DISTRIBUTIONS = ("none", "multi_worker", "data_parallel")

# (valid, expected): a float's check and what it says is valid.
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


# The parts of `RunConfig`, in order, and who reads each.
GROUPS = {
    "data": "The data set and its input pipeline (`data.load_for`, "
            "`data.inputs`).",
    "network": "The architecture, its batch norm and initial weights "
               "(`recipe.models.build_network`, `data.load_for`).",
    "optimization": "The optimizer and the loss "
                    "(`recipe.optimizers.compile_run`).",
    "learning_rate": "The learning-rate schedule (`recipe.rates.plan`).",
    "training": "The batch and the length of the run (`data.inputs`, "
                "`recipe.rates.plan`).",
    "adaptive": "The gradient noise scale and the growing batch "
                "(`run.callbacks`).",
    "evaluation": "Precise BN and evaluations within an epoch "
                  "(`run.callbacks`, `evaluate`).",
    "placement": "Where the run computes and how workers all-reduce "
                 "(`placement.place`).",
    "runtime": "This invocation: its folder, mode, checkpoints, seed, "
               "precision and logging (`driver`, `run.callbacks`).",
}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag of the command.

    Attributes:
        name, kind, default, help: as absl's `DEFINE_<kind>` takes them.
        group: the `GROUPS` entry (the `RunConfig` part) it belongs to.
        values: the choices of an `enum`.
        minimum: an `integer`'s smallest value.
        valid: `(predicate, expected)` for other values (None passes).
        free: resuming a run may change it (it changes neither the model,
            the data, the schedule nor the optimizer).
        raise_only: resuming a run may raise it (see
            `checkpointing/resume.py`).
        recorded: written to `run_config.json` and checked on resume.
        grammar: for a `string` whose value is typed, the module that
            parses it once (`TYPE`, `parse(name, text)`, `show(value)`).
    """

    name: str
    kind: str
    default: object
    help: str
    group: str
    values: tuple = ()
    minimum: int = None
    valid: tuple = None
    free: bool = False
    raise_only: bool = False
    recorded: bool = True
    grammar: object = None

    @property
    def type(self):
        """The type of its `RunConfig` field (None allowed if the default)."""
        if self.grammar is not None:
            return self.grammar.TYPE
        kind = {"integer": int, "float": float, "boolean": bool}.get(
            self.kind, str)
        return kind if self.default is not None else kind | None

    @property
    def config_default(self):
        """Its default as its `RunConfig` field holds it."""
        return self.parse(self.default)

    def parse(self, value):
        """`value` (absl's, or `run_config.json`'s) as `RunConfig` holds
        it: typed by its `grammar`, if any."""
        if self.grammar is None or value is None:
            return value
        return self.grammar.parse(self.name, value)

    def show(self, value):
        """`value` as the command line writes it (`run_config.json`)."""
        return value if self.grammar is None else self.grammar.show(value)


TABLE = (
    Flag('model', 'enum', MODELS[0],
        "Architecture; resnet_cifar is He et al.'s CIFAR ResNet "
        '(--resnet_depth, --resnet_width), for CPU-scale studies.',
         group='network', values=MODELS),
    Flag('resnet_depth', 'integer', 20,
        'resnet_cifar: depth 6n + 2 (8, 14, 20, ...).',
         group='network', valid=RESNET_DEPTH),
    Flag('resnet_width', 'integer', 16,
        'resnet_cifar: channels of the first stage.',
         group='network', minimum=1),
    Flag('dataset', 'enum', 'digits',
        registry.flag_help(),
         group='data', values=DATASETS),
    Flag('data_dir', 'string', None,
        'Data for directory and tfrecord.',
         group='data'),
    Flag('input_pipeline', 'enum', 'auto',
        'grain: Grain and NumPy, no TensorFlow (in-memory data sets, class '
        'folders); tf_data: tf.data (every data set; needs TensorFlow). '
        'auto: tf_data on the TensorFlow backend and for tfrecord, grain '
        'elsewhere.',
         group='data', values=('auto', 'tf_data', 'grain')),
    Flag('num_classes', 'integer', 0,
        'Classes for tfrecord (default 1000) and synthetic (default 10), at '
        f'least 2 and at most {MAX_NUM_CLASSES:,}; inferred elsewhere. The '
        "cap, over 4x ImageNet-21k's 21,841, is checked before anything is "
        "allocated: ResNet-50's head at 100,000 classes is 205M weights, "
        '2.5 GB with its gradient and momentum in float32.',
         group='data', minimum=0, valid=NUM_CLASSES),
    Flag('num_train_examples', 'integer', 0,
        'tfrecord: training examples (steps per epoch); 0: from index.json '
        'in --data_dir (python -m keras_largebatch.train.data.imagenet DIR '
        "writes it) or ImageNet's 1,281,167. Nothing is counted at start.",
         group='data', minimum=0),
    Flag('num_validation_examples', 'integer', 0,
        "tfrecord: validation examples; 0: index.json or ImageNet's 50,000.",
         group='data', minimum=0),
    Flag('image_size', 'integer', 0,
        f'Square input size, at most {MAX_IMAGE_SIZE}; 0 means 67 for '
        'alexnet_bn (its minimum), 32 for resnet50, and the data set\'s own '
        f'size for resnet_cifar. The cap, over 4x ImageNet\'s 224, is '
        'checked before anything is allocated: a batch of 32 images of '
        '5000x5000x3 is 9.6 GB in float32, the 512 synthetic images 154 GB.',
         group='data', minimum=0, valid=IMAGE_SIZE),
    Flag('global_batch_size', 'integer', 32,
        'Batch over all replicas.',
         group='training', minimum=1),
    Flag('base_learning_rate', 'float', 0.0,
        'Rate at --base_batch_size, scaled by --lr_scaling to the global '
        'batch; 0 means 0.1 for sgd, 2.0 for lars and lars_mixed, 0.002 for '
        'lamb and lamb_mixed. Not used by --lr_scaling=mlperf.',
         group='learning_rate', valid=NONNEGATIVE),
    Flag('base_batch_size', 'integer', 256,
        'Batch of the base rate.',
         group='learning_rate', minimum=1),
    Flag('lr_scaling', 'enum', 'auto',
        "The peak rate: mlperf is MLPerf's LARS table by global batch (10 "
        'below 16K, 25 below 32K, 31.2 above; 10 * sqrt(batch / 4096) below '
        '4096); linear (Goyal et al.) and sqrt scale --base_learning_rate; '
        'none uses it as the peak. auto: mlperf for lars and lars_mixed, '
        'linear for sgd, sqrt for lamb and lamb_mixed.',
         group='learning_rate',
         values=('auto', 'mlperf', 'linear', 'sqrt', 'none')),
    Flag('warmup_epochs', 'float', None,
        "Linear warmup length; default: the rule's fraction of --epochs "
        '(mlperf: 5/42 below a global batch of 32K, 25/90 above; linear: '
        '5/90).',
         group='learning_rate', valid=NONNEGATIVE),
    Flag('end_learning_rate', 'float', 0.0001,
        'Rate after decay.',
         group='learning_rate'),
    Flag('poly_power', 'float', 2.0,
        'Power of the polynomial decay.',
         group='learning_rate'),
    Flag('epochs', 'integer', 6,
        'Training epochs.',
         group='training', minimum=1, raise_only=True),
    Flag('steps_per_epoch', 'integer', 0,
        'Limit steps per epoch (0: whole data set).',
         group='training', minimum=0),
    Flag('gradient_accumulation_steps', 'integer', 1,
        'Batches of --global_batch_size / N whose gradients are averaged '
        'before each update: a large batch on a small machine (batch norm '
        'then sees each batch of global / N, as on a cluster each replica '
        'does).',
         group='training', minimum=1),
    Flag('optimizer', 'enum', 'lars_mixed',
        'Optimizer.',
         group='optimization', values=OPTIMIZERS),
    Flag('momentum', 'float', 0.9,
        'Momentum.',
         group='optimization'),
    Flag('nesterov', 'boolean', False,
        'Nesterov momentum (Sutskever et al. 2013) for sgd, lars and '
        'lars_mixed; needs --momentum > 0.',
         group='optimization'),
    Flag('eta', 'float', 0.001,
        'LARS trust coefficient.',
         group='optimization', valid=POSITIVE),
    Flag('weight_decay', 'float', 0.0005,
        'L2 decay on kernels (never biases or BN).',
         group='optimization', valid=NONNEGATIVE),
    Flag('precision', 'enum', 'auto',
        'auto: mixed_float16 on a GPU, float32 on a CPU.',
         group='runtime', values=PRECISIONS),
    Flag('label_smoothing', 'float', 0.0,
        'Label smoothing.',
         group='optimization', valid=UNIT),
    Flag('bn_momentum', 'float', 0.9,
        "Batch-norm moving-average momentum (0.9 as in MLPerf's ResNet; "
        "Keras' 0.99 lags behind in runs of a few hundred steps).",
         group='network', valid=UNIT),
    Flag('precise_bn_batches', 'integer', 0,
        "Before each evaluation (and in --mode=eval), set batch norm's "
        'statistics to their average over this many training batches (Goyal '
        "et al.'s precise BN); 0: the moving averages. Not with "
        '--distribution=multi_worker.',
         group='evaluation', minimum=0, free=True),
    Flag('evals_per_epoch', 'integer', 1,
        'Evaluate on the validation set this many times an epoch, evenly '
        "spaced in its batches (the last is the epoch's own); above 1, each "
        'evaluation goes to model_dir/evals.csv with the updates taken so '
        'far, to read the updates to a target accuracy within an epoch.',
         group='evaluation', minimum=1, free=True),
    Flag('gradient_noise_scale', 'boolean', False,
        'Log the gradient noise scale B_simple (McCandlish et al.) each '
        'epoch and say at the end what it means for the batch; needs '
        '--gradient_accumulation_steps >= 2 or several replicas. Measures '
        'every 8th update (every update with --adaptive_batch).',
         group='adaptive'),
    Flag('adaptive_batch', 'enum', 'none',
        'Grow the batch during training (keras_largebatch.AdaptiveBatch) by '
        'accumulating more micro-batches of --global_batch_size / '
        '--gradient_accumulation_steps per update: noise_scale follows the '
        'gradient noise scale B_simple, schedule follows '
        '--batch_schedule; up to --max_global_batch_size.',
         group='adaptive',
         values=('none',) + tuple(adaptive_policies.POLICIES)),
    Flag('max_global_batch_size', 'integer', 0,
        'The largest batch --adaptive_batch may grow to, a multiple of the '
        'micro-batch; 0: the largest of --batch_schedule, or '
        f'{adaptive_defaults.MAX_MULTIPLE} x --global_batch_size for '
        'noise_scale.',
         group='adaptive', minimum=0),
    Flag('adaptive_start_multiple', 'integer', 0,
        'With --adaptive_batch=noise_scale: the smallest batch from the '
        'first epoch, as a multiple (a power of 2) of --global_batch_size, '
        'the rate scaled by --adaptive_learning_rate; 0: '
        f'{adaptive_defaults.START_MULTIPLE} for noise_scale, 1 otherwise.',
         group='adaptive', minimum=0),
    Flag('adaptive_anneal_fraction', 'float',
         adaptive_defaults.ANNEAL_FRACTION,
        'With --adaptive_batch=noise_scale: over this last share of the '
        'epochs (fraction x epochs of them, a half rounded up), the batch '
        'is at most --adaptive_anneal_multiple x --global_batch_size, the '
        'rate scaled back by --adaptive_learning_rate, so that the end of '
        'the decay takes the updates of a smaller batch; 0: none.',
         group='adaptive', valid=UNIT),
    Flag('adaptive_anneal_multiple', 'integer',
         adaptive_defaults.ANNEAL_MULTIPLE,
        'With --adaptive_anneal_fraction: the largest batch at the end of '
        'training, as a multiple (a power of 2) of --global_batch_size.',
         group='adaptive', minimum=1),
    Flag('noise_scale_multiple', 'float',
         adaptive_defaults.NOISE_SCALE_MULTIPLE,
        'With --adaptive_batch=noise_scale: the batch follows this multiple '
        'of B_simple (1: the balanced point of McCandlish et al., twice the '
        'fewest updates and twice the fewest examples; above 1, fewer '
        'updates; the default 4 is the multiple the study settled on, no '
        'verdict makes it the best of those tried; how it compares with '
        'fixed batches, with n and intervals: docs/large-batch-study.md).',
         group='adaptive', valid=POSITIVE),
    Flag('batch_schedule', 'string', '',
        'With --adaptive_batch=schedule: EPOCH:BATCH,... (epochs counted '
        'from 0, increasing; each batch --global_batch_size times a power '
        "of 2), Smith et al.'s schedule.",
         group='adaptive', grammar=batch_schedule),
    Flag('adaptive_learning_rate', 'enum',
         adaptive_defaults.LEARNING_RATE_RULE,
        'How the rate follows the batch under --adaptive_batch, as a factor '
        'on the schedule: sqrt (of the batch over the starting one), '
        "unchanged (Smith et al.), adascale (AdaScale's gain), linear. "
        f'auto: {adaptive_defaults.AUTO_RULE_FOR_SGD} for sgd, '
        f'{adaptive_defaults.AUTO_RULE_OTHERWISE} for lars, lars_mixed, '
        'lamb and lamb_mixed.',
         group='adaptive', values=tuple(adaptive_rules.RULES)),
    Flag('augment', 'enum', 'auto',
        'auto: light (shift/zoom, no flip) for digit data sets, crop_flip '
        'for photos.',
         group='data', values=('auto', 'none', 'light', 'crop_flip')),
    Flag('model_dir', 'string', None,
        'Outputs and checkpoints.',
         group='runtime', free=True, recorded=False),
    Flag('mode', 'enum', 'train',
        'eval: evaluate the latest checkpoint in --model_dir on the '
        "validation set and write eval.json; flags not given are the run's.",
         group='runtime', values=('train', 'eval'), free=True),
    Flag('keep_checkpoints', 'integer', 2,
        'Epoch checkpoints kept in model_dir/checkpoints, the final model '
        '(epoch_NNN.keras, also model_dir/final.keras) counting as the '
        'newest; 0 keeps none, and final.keras is still written.',
         group='runtime', minimum=0, free=True),
    Flag('checkpoint_every_steps', 'integer', 0,
        'Also checkpoint within each epoch every N updates (optimizer '
        'steps), with the data position, into model_dir/backup: a killed run '
        'started again with the same command resumes there and loses at '
        'most N updates (0: only at epoch ends).',
         group='runtime', minimum=0, free=True, recorded=False),
    Flag('init_weights', 'string', None,
        "A .weights.h5 or .keras (e.g. another run's final.keras) of the "
        'same architecture; the classifier is skipped when the number of '
        'classes differs (fine-tuning).',
         group='network'),
    Flag('fusion_threshold_bytes', 'integer', FUSION_THRESHOLD_BYTES,
        'multi_worker: capacity of a gradient fusion bucket (0: one all- '
        'reduce per tensor).',
         group='placement', minimum=0, free=True),
    Flag('hierarchical_threshold_bytes', 'integer', HIERARCHICAL_THRESHOLD_BYTES,
        'multi_worker: buckets smaller than this go hierarchical when the '
        'job spans several nodes (0: never).',
         group='placement', minimum=0, free=True),
    Flag('compression', 'enum', 'none',
        'multi_worker: fp16 sends float32 gradients as float16 (best with '
        'lars_mixed, whose gradients travel loss-scaled); topk sends the '
        '--topk_density largest entries of each bucket with error feedback '
        '(for slow networks; see docs/distributed.md).',
         group='placement', values=('none', 'fp16', 'topk')),
    Flag('topk_density', 'float', 0.01,
        'multi_worker, --compression=topk: fraction of each gradient bucket '
        'a worker sends, in (0, 1]; the rest is kept as a residual '
        '(checkpointed per worker under backup/topk_residuals).',
         group='placement', valid=FRACTION),
    Flag('workers_per_node', 'integer', 0,
        'multi_worker: consecutive tasks per node (0: tasks sharing a '
        'host).',
         group='placement', minimum=0, free=True),
    Flag('collective_timeout_seconds', 'float', 0.0,
        'Several processes (multi_worker, data_parallel): a collective or '
        'the join waiting longer fails the job (0: no limit).',
         group='placement', valid=NONNEGATIVE, free=True),
    Flag('distribution', 'enum', 'none',
        'multi_worker: keras_largebatch.distribute with TF_CONFIG '
        '(TensorFlow); data_parallel: keras.distribution over local devices '
        '(JAX), or under torchrun DistributedDataParallel, one device per '
        'process (torch, Keras >= 3.16).',
         group='placement', values=DISTRIBUTIONS, free=True),
    Flag('seed', 'integer', 0,
        'Seed for splits, init, data order, augmentation and dropout: the '
        'same seed and flags give the same weights (see --deterministic).',
         group='runtime', minimum=0),
    Flag('deterministic', 'boolean', False,
        'TensorFlow backend: tf.config.experimental.enable_op_determinism() '
        '(slower kernels), needed for bit-identical runs there. JAX and '
        'torch on a CPU are deterministic without it.',
         group='runtime', free=True),
    Flag('verbose', 'integer', None,
        'Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per '
        'epoch; default: 1 on a terminal, 2 when stdout is not one.',
         group='runtime', valid=VERBOSITY, free=True),
    Flag('check_images', 'boolean', True,
        'Decode every image of a directory data set before training, so a '
        'corrupt file fails fast.',
         group='data', free=True),
)


BY_NAME = {flag.name: flag for flag in TABLE}
RECORDED = tuple(flag.name for flag in TABLE if flag.recorded)
FREE = tuple(flag.name for flag in TABLE if flag.free)
RAISABLE = tuple(flag.name for flag in TABLE if flag.raise_only)
