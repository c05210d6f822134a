"""`RunConfig`: the checked flags of one invocation, frozen and typed.

One frozen dataclass per group of `flag_table.GROUPS`, a field per flag of
the group with its type and default, written out so that grep, an IDE
and a type checker see them; a test holds them against `flag_table.TABLE`
(each flag a field of exactly one group, with its type and default). The
driver (`main.py`) holds the whole config and hands each builder the
groups it reads (`config.training`, `config.adaptive`, ...).

A flag with a grammar holds its parsed value: `adaptive.batch_schedule` is
`((epoch, batch), ...)`, not the command line's text.
"""

import dataclasses

from keras_largebatch.adaptive_batch import defaults as adaptive_defaults
from keras_largebatch.distribute import FUSION_THRESHOLD_BYTES
from keras_largebatch.distribute import HIERARCHICAL_THRESHOLD_BYTES
from keras_largebatch.train.flag_table import BY_NAME
from keras_largebatch.train.flag_table import RECORDED
from keras_largebatch.train.flag_table import TABLE


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data set and its input pipeline (`data.load_for`,
    `data.inputs`)."""

    dataset: str = "digits"
    data_dir: str | None = None
    input_pipeline: str = "auto"
    num_classes: int = 0
    num_train_examples: int = 0
    num_validation_examples: int = 0
    image_size: int = 0
    augment: str = "auto"
    check_images: bool = True


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """The architecture, its batch norm and initial weights
    (`builders.model`, `data.load_for`)."""

    model: str = "alexnet_bn"
    resnet_depth: int = 20
    resnet_width: int = 16
    bn_momentum: float = 0.9
    init_weights: str | None = None


@dataclasses.dataclass(frozen=True)
class OptimizationConfig:
    """The optimizer and the loss (`builders.model`)."""

    optimizer: str = "lars_mixed"
    momentum: float = 0.9
    nesterov: bool = False
    eta: float = 0.001
    weight_decay: float = 0.0005
    label_smoothing: float = 0.0


@dataclasses.dataclass(frozen=True)
class LearningRateConfig:
    """The learning-rate schedule (`builders.schedule`)."""

    base_learning_rate: float = 0.0
    base_batch_size: int = 256
    lr_scaling: str = "auto"
    warmup_epochs: float | None = None
    end_learning_rate: float = 0.0001
    poly_power: float = 2.0


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The batch and the length of the run (`data.inputs`,
    `builders.schedule`, `builders.check_devices`)."""

    global_batch_size: int = 32
    epochs: int = 6
    steps_per_epoch: int = 0
    gradient_accumulation_steps: int = 1


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """The gradient noise scale and the growing batch
    (`builders.callbacks`)."""

    gradient_noise_scale: bool = False
    adaptive_batch: str = "none"
    max_global_batch_size: int = 0
    adaptive_start_multiple: int = 0
    adaptive_anneal_fraction: float = adaptive_defaults.ANNEAL_FRACTION
    adaptive_anneal_multiple: int = adaptive_defaults.ANNEAL_MULTIPLE
    noise_scale_multiple: float = adaptive_defaults.NOISE_SCALE_MULTIPLE
    batch_schedule: tuple[tuple[int, int], ...] = ()
    adaptive_learning_rate: str = adaptive_defaults.LEARNING_RATE_RULE


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """Precise BN and evaluations within an epoch (`builders.callbacks`,
    `evaluate`)."""

    precise_bn_batches: int = 0
    evals_per_epoch: int = 1


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """Where the run computes and how workers all-reduce
    (`placement.place`)."""

    fusion_threshold_bytes: int = FUSION_THRESHOLD_BYTES
    hierarchical_threshold_bytes: int = HIERARCHICAL_THRESHOLD_BYTES
    compression: str = "none"
    topk_density: float = 0.01
    workers_per_node: int = 0
    collective_timeout_seconds: float = 0.0
    distribution: str = "none"


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """This invocation: its folder, mode, checkpoints, seed, precision and
    logging (`main`, `builders.callbacks`)."""

    precision: str = "auto"
    model_dir: str | None = None
    mode: str = "train"
    keep_checkpoints: int = 2
    checkpoint_every_steps: int = 0
    seed: int = 0
    deterministic: bool = False
    verbose: int | None = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The checked flags of one invocation, a frozen part per group of
    `flag_table.GROUPS`; what the driver receives and hands out in parts
    (`RunConfig()` is the default run, less its required `model_dir`)."""

    data: DataConfig = DataConfig()
    network: NetworkConfig = NetworkConfig()
    optimization: OptimizationConfig = OptimizationConfig()
    learning_rate: LearningRateConfig = LearningRateConfig()
    training: TrainingConfig = TrainingConfig()
    adaptive: AdaptiveConfig = AdaptiveConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    placement: PlacementConfig = PlacementConfig()
    runtime: RuntimeConfig = RuntimeConfig()

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
