"""`RunConfig`: the checked flags of one invocation, frozen and typed.

One frozen dataclass per group of `table.GROUPS`, a field per flag of the
group with its type, written out so that grep, an IDE and a type checker
see them; a test holds them against `table.TABLE` (each flag a field of
exactly one group, with its type). The defaults live in the table alone:
`RunConfig.default()` is the table's default run. The driver
(`run/driver.py`) holds the whole config and hands each builder the
groups it reads (`config.training`, `config.adaptive`, ...).

A flag with a grammar holds its parsed value: `adaptive.batch_schedule` is
`((epoch, batch), ...)`, not the command line's text.
"""

import dataclasses

from keras_largebatch.train.config.table import BY_NAME
from keras_largebatch.train.config.table import RECORDED
from keras_largebatch.train.config.table import TABLE


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data set and its input pipeline (`data.load_for`,
    `data.inputs`)."""

    dataset: str
    data_dir: str | None
    input_pipeline: str
    num_classes: int
    num_train_examples: int
    num_validation_examples: int
    image_size: int
    augment: str
    check_images: bool


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """The architecture, its batch norm and initial weights
    (`recipe.models.build_network`, `data.load_for`)."""

    model: str
    resnet_depth: int
    resnet_width: int
    bn_momentum: float
    init_weights: str | None


@dataclasses.dataclass(frozen=True)
class OptimizationConfig:
    """The optimizer and the loss (`recipe.optimizers.compile_run`)."""

    optimizer: str
    momentum: float
    nesterov: bool
    eta: float
    weight_decay: float
    label_smoothing: float


@dataclasses.dataclass(frozen=True)
class LearningRateConfig:
    """The learning-rate schedule (`recipe.rates.plan`)."""

    base_learning_rate: float
    base_batch_size: int
    lr_scaling: str
    warmup_epochs: float | None
    end_learning_rate: float
    poly_power: float


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The batch and the length of the run (`data.inputs`,
    `recipe.rates.plan`)."""

    global_batch_size: int
    epochs: int
    steps_per_epoch: int
    gradient_accumulation_steps: int


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """The gradient noise scale and the growing batch
    (`run.callbacks`)."""

    gradient_noise_scale: bool
    adaptive_batch: str
    max_global_batch_size: int
    adaptive_start_multiple: int
    adaptive_anneal_fraction: float
    adaptive_anneal_multiple: int
    noise_scale_multiple: float
    batch_schedule: tuple[tuple[int, int], ...]
    adaptive_learning_rate: str


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """Precise BN and evaluations within an epoch (`run.callbacks`,
    `evaluate`)."""

    precise_bn_batches: int
    evals_per_epoch: int


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """Where the run computes and how workers all-reduce
    (`placement.place`)."""

    fusion_threshold_bytes: int
    hierarchical_threshold_bytes: int
    compression: str
    topk_density: float
    workers_per_node: int
    collective_timeout_seconds: float
    distribution: str


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """This invocation: its folder, mode, checkpoints, seed, precision and
    logging (`driver`, `run.callbacks`)."""

    precision: str
    model_dir: str | None
    mode: str
    keep_checkpoints: int
    checkpoint_every_steps: int
    seed: int
    deterministic: bool
    verbose: int | None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The checked flags of one invocation, a frozen part per group of
    `table.GROUPS`; what the driver receives and hands out in parts."""

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
        """The default run of `TABLE` (less its required `model_dir`)."""
        return cls.of({flag.name: flag.config_default for flag in TABLE})

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
        """{name: value} of every flag, in the table's order."""
        return {flag.name: getattr(getattr(self, flag.group), flag.name)
                for flag in TABLE}

    def recorded(self):
        """{name: value} of the flags `run_config.json` records (flat, as
        before the flags had groups, so older runs still resume), each as
        the command line writes it."""
        values = self.flat()
        return {name: BY_NAME[name].show(values[name]) for name in RECORDED}
