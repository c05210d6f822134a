"""`RunConfig`: the checked flags of one invocation, frozen and typed;
each flag declared once, as a field.

One frozen dataclass per group, in the order of `--help`: a field per flag,
written out so that grep, an IDE and a type checker see it, with its type,
its default (the default run's) and, by `flag.declare`, its help and
rules. The group's docstring is its line in `--help` (`table.GROUPS`).
Everything else about the flags is read from these fields (`table.TABLE`):
the absl flags, the checks, the resume rules, `--help`, the table in
docs/training.md and `run_config.json`. Adding a flag is one field here
and the code that reads it (with a rule in `rules.py` where its check
reads other flags too), then the docs' table printed again (`python -m
keras_largebatch.train.config.help`); a run recorded before it resumes
with its default (`migration.upgrade`).

The driver (`run/driver.py`) holds the whole config and hands each builder
the groups it reads (`config.training`, `config.adaptive`, ...). A flag
with a grammar holds its parsed value: `adaptive.batch_schedule` is
`((epoch, batch), ...)`, not the command line's text.

The defaults are the embedded default run: AlexNet-BN at its minimum input
(67x67) on scikit-learn's digits, batch 32, LARSMixed with warmup and
polynomial decay, 6 epochs. This module imports no Keras and no backend,
so that `--help` needs neither.
"""

import dataclasses

from keras_largebatch.adaptive_batch import defaults as adaptive_defaults
from keras_largebatch.distribute import FUSION_THRESHOLD_BYTES
from keras_largebatch.distribute import HIERARCHICAL_THRESHOLD_BYTES
from keras_largebatch.train.config import batch_schedule
from keras_largebatch.train.config import choices
from keras_largebatch.train.config.flag import Flag
from keras_largebatch.train.config.flag import declare


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data set and its input pipeline (`data.load_for`,
    `data.inputs`)."""

    dataset: str = declare(
        'digits',
        choices.DATASET_HELP,
        values=choices.DATASETS)
    data_dir: str | None = declare(
        None,
        'Data for directory and tfrecord.')
    input_pipeline: str = declare(
        'auto',
        'grain: Grain and NumPy, no TensorFlow (in-memory data sets, class '
        'folders); tf_data: tf.data (every data set; needs TensorFlow). '
        'auto: tf_data on the TensorFlow backend and for tfrecord, grain '
        'elsewhere.',
        values=('auto', 'tf_data', 'grain'))
    num_classes: int = declare(
        0,
        'Classes for tfrecord (default 1000) and synthetic (default 10), at '
        f'least 2 and at most {choices.MAX_NUM_CLASSES:,}; inferred '
        'elsewhere. The '
        "cap, over 4x ImageNet-21k's 21,841, is checked before anything is "
        "allocated: ResNet-50's head at 100,000 classes is 205M weights, "
        '2.5 GB with its gradient and momentum in float32.',
        minimum=0, valid=choices.NUM_CLASSES)
    num_train_examples: int = declare(
        0,
        'tfrecord: training examples (steps per epoch); 0: from index.json '
        'in --data_dir (python -m keras_largebatch.train.data.imagenet DIR '
        "writes it) or ImageNet's 1,281,167. Nothing is counted at start.",
        minimum=0)
    num_validation_examples: int = declare(
        0,
        "tfrecord: validation examples; 0: index.json or ImageNet's 50,000.",
        minimum=0)
    image_size: int = declare(
        0,
        f'Square input size, at most {choices.MAX_IMAGE_SIZE}; 0 means 67 for '
        'alexnet_bn (its minimum), 32 for resnet50, and the data set\'s own '
        f'size for resnet_cifar. The cap, over 4x ImageNet\'s 224, is '
        'checked before anything is allocated: a batch of 32 images of '
        '5000x5000x3 is 9.6 GB in float32, the 512 synthetic images 154 GB.',
        minimum=0, valid=choices.IMAGE_SIZE)
    augment: str = declare(
        'auto',
        'auto: light (shift/zoom, no flip) for digit data sets, crop_flip '
        'for photos.',
        values=('auto', 'none', 'light', 'crop_flip'))
    check_images: bool = declare(
        True,
        'Decode every image of a directory data set before training, so a '
        'corrupt file fails fast.',
        free=True)


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """The architecture, its batch norm and initial weights
    (`recipe.models.build_network`, `data.load_for`)."""

    model: str = declare(
        choices.MODELS[0],
        "Architecture; resnet_cifar is He et al.'s CIFAR ResNet "
        '(--resnet_depth, --resnet_width), for CPU-scale studies.',
        values=choices.MODELS)
    resnet_depth: int = declare(
        20,
        'resnet_cifar: depth 6n + 2 (8, 14, 20, ...).',
        valid=choices.RESNET_DEPTH)
    resnet_width: int = declare(
        16,
        'resnet_cifar: channels of the first stage.',
        minimum=1)
    bn_momentum: float = declare(
        0.9,
        "Batch-norm moving-average momentum (0.9 as in MLPerf's ResNet; "
        "Keras' 0.99 lags behind in runs of a few hundred steps).",
        valid=choices.UNIT)
    init_weights: str | None = declare(
        None,
        "A .weights.h5 or .keras (e.g. another run's final.keras) of the "
        'same architecture; the classifier is skipped when the number of '
        'classes differs (fine-tuning).')
    zero_init_residual: bool = declare(
        False,
        'resnet50 and resnet50_v1_5: start the last batch norm of each '
        'residual block at gamma 0, so that each block begins as the '
        "identity (Goyal et al.'s large-batch ImageNet recipe, "
        'arXiv:1706.02677).')


@dataclasses.dataclass(frozen=True)
class OptimizationConfig:
    """The optimizer and the loss (`recipe.optimizers.compile_run`)."""

    optimizer: str = declare(
        'lars_mixed',
        'Optimizer.',
        values=choices.OPTIMIZERS)
    momentum: float = declare(
        0.9,
        'Momentum.')
    nesterov: bool = declare(
        False,
        'Nesterov momentum (Sutskever et al. 2013) for sgd, lars and '
        'lars_mixed; needs --momentum > 0.')
    eta: float = declare(
        0.001,
        'LARS trust coefficient.',
        valid=choices.POSITIVE)
    weight_decay: float = declare(
        0.0005,
        'L2 decay on kernels (never biases or BN).',
        valid=choices.NONNEGATIVE)
    label_smoothing: float = declare(
        0.0,
        'Label smoothing.',
        valid=choices.UNIT)


@dataclasses.dataclass(frozen=True)
class LearningRateConfig:
    """The learning-rate schedule (`recipe.rates.plan`)."""

    base_learning_rate: float = declare(
        0.0,
        'Rate at --base_batch_size, scaled by --lr_scaling to the global '
        'batch; 0 means 0.1 for sgd, 2.0 for lars and lars_mixed, 0.002 for '
        'lamb and lamb_mixed. Not used by --lr_scaling=mlperf.',
        valid=choices.NONNEGATIVE)
    base_batch_size: int = declare(
        256,
        'Batch of the base rate.',
        minimum=1)
    lr_scaling: str = declare(
        'auto',
        "The peak rate: mlperf is MLPerf's LARS table by global batch (10 "
        'below 16K, 25 below 32K, 31.2 above; 10 * sqrt(batch / 4096) below '
        '4096); linear (Goyal et al.) and sqrt scale --base_learning_rate; '
        'none uses it as the peak. auto: mlperf for lars and lars_mixed, '
        'linear for sgd, sqrt for lamb and lamb_mixed.',
        values=('auto', 'mlperf', 'linear', 'sqrt', 'none'))
    warmup_epochs: float | None = declare(
        None,
        "Linear warmup length; default: the rule's fraction of --epochs "
        '(mlperf: 5/42 below a global batch of 32K, 25/90 above; linear: '
        '5/90).',
        valid=choices.NONNEGATIVE)
    end_learning_rate: float = declare(
        0.0001,
        'Rate after decay.')
    poly_power: float = declare(
        2.0,
        'Power of the polynomial decay.')


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The batch and the length of the run (`data.inputs`,
    `recipe.rates.plan`)."""

    global_batch_size: int = declare(
        32,
        'Batch over all replicas.',
        minimum=1)
    epochs: int = declare(
        6,
        'Training epochs.',
        minimum=1, raise_only=True)
    steps_per_epoch: int = declare(
        0,
        'Limit steps per epoch (0: whole data set).',
        minimum=0)
    gradient_accumulation_steps: int = declare(
        1,
        'Batches of --global_batch_size / N whose gradients are averaged '
        'before each update: a large batch on a small machine (batch norm '
        'then sees each batch of global / N, as on a cluster each replica '
        'does).',
        minimum=1)


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """The gradient noise scale and the growing batch
    (`run.callbacks`)."""

    gradient_noise_scale: bool = declare(
        False,
        'Log the gradient noise scale B_simple (McCandlish et al.) each '
        'epoch and say at the end what it means for the batch; needs '
        '--gradient_accumulation_steps >= 2 or several replicas. Measures '
        'every 8th update (every update with --adaptive_batch).')
    adaptive_batch: str = declare(
        'none',
        'Grow the batch during training (keras_largebatch.AdaptiveBatch) by '
        'accumulating more micro-batches of --global_batch_size / '
        '--gradient_accumulation_steps per update: noise_scale follows the '
        'gradient noise scale B_simple, schedule follows '
        '--batch_schedule; up to --max_global_batch_size.',
        values=choices.ADAPTIVE_POLICIES)
    max_global_batch_size: int = declare(
        0,
        'The largest batch --adaptive_batch may grow to, a multiple of the '
        'micro-batch; 0: the largest of --batch_schedule, or '
        f'{adaptive_defaults.MAX_MULTIPLE} x --global_batch_size for '
        'noise_scale.',
        minimum=0)
    adaptive_start_multiple: int = declare(
        0,
        'With --adaptive_batch=noise_scale: the smallest batch from the '
        'first epoch, as a multiple (a power of 2) of --global_batch_size, '
        'the rate scaled by --adaptive_learning_rate; 0: '
        f'{adaptive_defaults.START_MULTIPLE} for noise_scale, 1 otherwise.',
        minimum=0)
    adaptive_anneal_fraction: float = declare(
        adaptive_defaults.ANNEAL_FRACTION,
        'With --adaptive_batch=noise_scale: over this last share of the '
        'epochs (fraction x epochs of them, a half rounded up), the batch '
        'is at most --adaptive_anneal_multiple x --global_batch_size, the '
        'rate scaled back by --adaptive_learning_rate, so that the end of '
        'the decay takes the updates of a smaller batch; 0: none.',
        valid=choices.UNIT)
    adaptive_anneal_multiple: int = declare(
        adaptive_defaults.ANNEAL_MULTIPLE,
        'With --adaptive_anneal_fraction: the largest batch at the end of '
        'training, as a multiple (a power of 2) of --global_batch_size.',
        minimum=1)
    noise_scale_multiple: float = declare(
        adaptive_defaults.NOISE_SCALE_MULTIPLE,
        'With --adaptive_batch=noise_scale: the batch follows this multiple '
        'of B_simple (1: the balanced point of McCandlish et al., twice the '
        'fewest updates and twice the fewest examples; above 1, fewer '
        'updates; the default 4 is the multiple the study settled on, no '
        'verdict makes it the best of those tried; how it compares with '
        'fixed batches, with n and intervals: docs/large-batch-study.md).',
        valid=choices.POSITIVE)
    batch_schedule: tuple[tuple[int, int], ...] = declare(
        (),
        'With --adaptive_batch=schedule: EPOCH:BATCH,... (epochs counted '
        'from 0, increasing; each batch --global_batch_size times a power '
        "of 2), Smith et al.'s schedule.",
        grammar=batch_schedule)
    adaptive_learning_rate: str = declare(
        adaptive_defaults.LEARNING_RATE_RULE,
        'How the rate follows the batch under --adaptive_batch, as a factor '
        'on the schedule: sqrt (of the batch over the starting one), '
        "unchanged (Smith et al.), adascale (AdaScale's gain), linear. "
        f'auto: {adaptive_defaults.AUTO_RULE_FOR_SGD} for sgd, '
        f'{adaptive_defaults.AUTO_RULE_OTHERWISE} for lars, lars_mixed, '
        'lamb and lamb_mixed.',
        values=choices.ADAPTIVE_RULES)


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """Precise BN and evaluations within an epoch (`run.callbacks`,
    `evaluate`)."""

    precise_bn_batches: int = declare(
        0,
        "Before each evaluation (and in --mode=eval), set batch norm's "
        'statistics to their average over this many training batches (Goyal '
        "et al.'s precise BN); 0: the moving averages. Not with "
        '--distribution=multi_worker.',
        minimum=0, free=True)
    evals_per_epoch: int = declare(
        1,
        'Evaluate on the validation set this many times an epoch, evenly '
        "spaced in its batches (the last is the epoch's own); above 1, each "
        'evaluation goes to model_dir/evals.csv with the updates taken so '
        'far, to read the updates to a target accuracy within an epoch.',
        minimum=1, free=True)


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """Where the run computes and how workers all-reduce
    (`placement.place`)."""

    fusion_threshold_bytes: int = declare(
        FUSION_THRESHOLD_BYTES,
        'multi_worker: capacity of a gradient fusion bucket (0: one all- '
        'reduce per tensor).',
        minimum=0, free=True)
    hierarchical_threshold_bytes: int = declare(
        HIERARCHICAL_THRESHOLD_BYTES,
        'multi_worker: buckets smaller than this go hierarchical when the '
        'job spans several nodes (0: never).',
        minimum=0, free=True)
    compression: str = declare(
        'none',
        'multi_worker: fp16 sends float32 gradients as float16 (best with '
        'lars_mixed, whose gradients travel loss-scaled); topk sends the '
        '--topk_density largest entries of each bucket with error feedback '
        '(for slow networks; see docs/distributed.md).',
        values=('none', 'fp16', 'topk'))
    topk_density: float = declare(
        0.01,
        'multi_worker, --compression=topk: fraction of each gradient bucket '
        'a worker sends, in (0, 1]; the rest is kept as a residual '
        '(checkpointed per worker under backup/topk_residuals).',
        valid=choices.FRACTION)
    workers_per_node: int = declare(
        0,
        'multi_worker: consecutive tasks per node (0: tasks sharing a '
        'host).',
        minimum=0, free=True)
    collective_timeout_seconds: float = declare(
        0.0,
        'Several processes (multi_worker, data_parallel): a collective or '
        'the join waiting longer fails the job (0: no limit).',
        valid=choices.NONNEGATIVE, free=True)
    distribution: str = declare(
        'none',
        'multi_worker: keras_largebatch.distribute with TF_CONFIG '
        '(TensorFlow); data_parallel: keras.distribution over local devices '
        '(JAX), or under torchrun DistributedDataParallel, one device per '
        'process (torch, Keras >= 3.16).',
        values=choices.DISTRIBUTIONS, free=True)


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """This invocation: its folder, mode, checkpoints, seed, precision and
    logging (`driver`, `run.callbacks`)."""

    precision: str = declare(
        'auto',
        'auto: mixed_float16 on a GPU, float32 on a CPU.',
        values=choices.PRECISIONS)
    model_dir: str | None = declare(
        None,
        'Outputs and checkpoints.',
        free=True, recorded=False)
    mode: str = declare(
        'train',
        'eval: evaluate the latest checkpoint in --model_dir on the '
        "validation set and write eval.json; flags not given are the run's.",
        values=('train', 'eval'), free=True)
    keep_checkpoints: int = declare(
        2,
        'Epoch checkpoints kept in model_dir/checkpoints, the final model '
        '(epoch_NNN.keras, also model_dir/final.keras) counting as the '
        'newest; 0 keeps none, and final.keras is still written.',
        minimum=0, free=True)
    checkpoint_every_steps: int = declare(
        0,
        'Also checkpoint within each epoch every N updates (optimizer '
        'steps), with the data position, into model_dir/backup: a killed run '
        'started again with the same command resumes there and loses at '
        'most N updates (0: only at epoch ends).',
        minimum=0, free=True, recorded=False)
    seed: int = declare(
        0,
        'Seed for splits, init, data order, augmentation and dropout: the '
        'same seed and flags give the same weights (see --deterministic).',
        minimum=0)
    deterministic: bool = declare(
        False,
        'TensorFlow backend: tf.config.experimental.enable_op_determinism() '
        '(slower kernels), needed for bit-identical runs there. JAX and '
        'torch on a CPU are deterministic without it.',
        free=True)
    verbose: int | None = declare(
        None,
        'Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per '
        'epoch; default: 1 on a terminal, 2 when stdout is not one.',
        valid=choices.VERBOSITY, free=True)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The checked flags of one invocation, a frozen part per group; what
    the driver receives and hands out in parts."""

    data: DataConfig
    network: NetworkConfig
    optimization: OptimizationConfig
    learning_rate: LearningRateConfig
    training: TrainingConfig
    adaptive: AdaptiveConfig
    evaluation: EvaluationConfig
    placement: PlacementConfig
    runtime: RuntimeConfig

    @classmethod
    def default(cls):
        """The default run (less its required `model_dir`)."""
        return cls(**{part.name: part.type()
                      for part in dataclasses.fields(cls)})

    @classmethod
    def of(cls, values):
        """The `RunConfig` of `values` ({flag: value as held}, every
        flag), each value in its flag's group; unchecked."""
        return cls(**{
            part.name: part.type(**{field.name: values[field.name]
                                    for field in dataclasses.fields(
                                        part.type)})
            for part in dataclasses.fields(cls)})

    def flat(self):
        """{name: value} of every flag, group by group."""
        return {flag.name: value for flag, value in self._flags()}

    def recorded(self):
        """{name: value} of the flags `run_config.json` records (flat, as
        before the flags had groups, so older runs still resume), each as
        the command line writes it."""
        return {flag.name: flag.show(value) for flag, value in self._flags()
                if flag.recorded}

    def _flags(self):
        """`(Flag, value)` of every flag, group by group."""
        for part in dataclasses.fields(self):
            held = getattr(self, part.name)
            for field in dataclasses.fields(held):
                yield Flag.of(field, part.name), getattr(held, field.name)
