"""The run, assembled by builders with explicit inputs and outputs.

`main.prepare` calls them in turn, as Model Garden's `train_lib` hands a
typed config to a task, a trainer and a controller:

    check_devices(config, devices)              the batch on the replicas
    data.load_for(config)                       -> DataSpec
    data.inputs(config, spec, devices, epoch)   -> Inputs (fit, precise BN)
    schedule(config, steps_per_epoch, resuming) -> Schedule
    model(config, spec, schedule, strategy)     -> a compiled keras.Model
    callbacks(run, throughput, out_dir, peer)   -> the callbacks of `fit`

`Devices` is where the run computes (`main.place`), `Run` what the
builders built. What the run writes around `fit` is `report.py`'s.
"""

import dataclasses
import os

from keras_largebatch._shared import require
from keras_largebatch.train import outputs
from keras_largebatch.train import recipe
from keras_largebatch.train import resume


@dataclasses.dataclass(frozen=True)
class Devices:
    """Where the run computes (`--distribution`).

    Attributes:
        strategy: the `MultiWorkerMirroredStrategy`, or None.
        replicas: model replicas over all workers or devices.
        chief: whether this process writes the run's outputs.
        task: this worker's (TF_CONFIG) or process's (JAX) index.
        workers: TF_CONFIG's workers (1 without one).
        process_index, process_count: this JAX process among the job's.
    """

    strategy: object = None
    replicas: int = 1
    chief: bool = True
    task: int = 0
    workers: int = 1
    process_index: int = 0
    process_count: int = 1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The learning rate of the run.

    Attributes:
        peak: the peak rate, `--lr_scaling`'s rule applied.
        warmup_epochs: `--warmup_epochs`, or the rule's fraction of the run.
        learning_rate: the Keras schedule (warmup, polynomial decay).
        raise_message: the line that says how raising `--epochs` on
            resume stretches the schedule; None when it is not raised.
    """

    peak: float
    warmup_epochs: float
    learning_rate: object
    raise_message: str = None


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything checked and built, nothing written yet.

    Attributes:
        config: the checked flags (`flags.RunConfig`).
        devices: `Devices`.
        spec: the data set (`data.DataSpec`); `spec.image_size` is the
            input size.
        inputs: `data.Inputs`, the batches of `fit` and of precise BN.
        schedule: `Schedule`.
        model: the compiled model (with its optimizer).
        resuming: `resume.Resume`, or None for a new run.
        recorded: what `run_config.json` holds (the recorded flags, the
            resolved image size and number of classes).
        precision: `--precision` resolved.
        initial_epoch: the epochs already finished in `model_dir`.
    """

    config: object
    devices: Devices
    spec: object
    inputs: object
    schedule: Schedule
    model: object
    resuming: object
    recorded: dict
    precision: str
    initial_epoch: int


def check_devices(config, devices):
    """Refuses a batch the replicas cannot split and precise BN over
    several JAX processes."""
    # Each process would set statistics of its own slice of the batches.
    require(config.precise_bn_batches == 0 or devices.process_count == 1,
            "precise_bn_batches", config.precise_bn_batches,
            "0 with several JAX processes (each would set different "
            "statistics)")
    batch, replicas = config.global_batch_size, devices.replicas
    require(batch % replicas == 0, "global_batch_size", batch,
            f"divisible by the number of replicas ({replicas})")
    require(batch % (replicas * config.gradient_accumulation_steps) == 0,
            "global_batch_size", batch,
            f"divisible by the replicas ({replicas}) times "
            f"--gradient_accumulation_steps "
            f"({config.gradient_accumulation_steps})")


def schedule(config, steps_per_epoch, resuming=None):
    """The `Schedule` of the run; resuming with `--epochs` raised, the one
    of a run planned for the new number of epochs."""
    peak = recipe.peak_learning_rate(
        config.optimizer, config.base_learning_rate,
        config.global_batch_size, config.base_batch_size, config.lr_scaling)
    raised = resuming is not None and resuming.raised
    # A default warmup is a fraction of the run: of the original one when
    # --epochs is raised on resume, so the steps already taken keep theirs.
    warmup = recipe.warmup_epochs_for(
        config.optimizer, config.lr_scaling, config.global_batch_size,
        resuming.epochs_before if raised else config.epochs,
        config.warmup_epochs)

    def planned(epochs):
        # Keras calls a schedule with its step counter, which counts
        # batches, not updates, under gradient accumulation.
        return recipe.schedule(peak, steps_per_epoch, epochs, warmup,
                               config.end_learning_rate, config.poly_power)

    learning_rate = planned(config.epochs)
    message = None
    if raised:
        message = resume.raise_message(
            resuming, planned(resuming.epochs_before), learning_rate,
            steps_per_epoch)
    return Schedule(peak, warmup, learning_rate, message)


def model(config, spec, schedule, strategy=None):
    """The model of `--model` for `spec`, initialized from
    `--init_weights`, compiled with the optimizer of `--optimizer` on
    `schedule`; call it in the strategy's scope."""
    built = recipe.build_model(
        config.model, spec.image_size, spec.num_classes, config.bn_momentum,
        spec.channels, config.resnet_depth, config.resnet_width)
    if config.init_weights:
        recipe.load_init_weights(built, config.init_weights)
    optimizer = recipe.build_optimizer(
        config.optimizer, schedule.learning_rate, built, config.momentum,
        config.eta, config.weight_decay, config.gradient_accumulation_steps)
    recipe.compile_model(built, optimizer, config.label_smoothing,
                         top5=spec.num_classes > 10)
    if config.gradient_noise_scale:
        _check_noise_scale(config, optimizer, strategy)
    return built


def _check_noise_scale(config, optimizer, strategy):
    from keras_largebatch import noise_scale

    try:
        noise_scale.check_measurable(optimizer, strategy)
    except ValueError:
        raise ValueError(
            "`gradient_noise_scale` needs two batch sizes in one "
            "step: --gradient_accumulation_steps >= 2 or several "
            "replicas (--distribution=multi_worker). Received: "
            "gradient_noise_scale=True, gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps}") from None


def callbacks(run, throughput, out_dir, peer=False):
    """The callbacks of `fit`, in the order they see each epoch's logs.

    `throughput` comes first (it adds `images_per_sec` to the logs the
    rest see); precise BN before the logs and checkpoints, so they see
    its statistics. A `peer` (a JAX process other than the chief) saves
    its backup into `out_dir` and restores from the chief's, and writes
    no logs or checkpoints.
    """
    config = run.config
    backup = os.path.join(out_dir, "backup")
    found = [
        throughput,
        outputs.EpochScalars(),  # learning_rate, loss_scale
        # The adaptive batch first: its wrapper (every update measured)
        # is the one the noise-scale logs then read.
        *_adaptive_batch(config, run.inputs.step_batch),
        *_noise_scale(config, run.inputs.step_batch),
        outputs.Backup(os.path.join(config.model_dir, "backup")
                       if peer else backup, backup),
        *_residual_checkpoints(config, run.devices.strategy, backup),
        resume.step_randomness(config.seed),
        *_precise_bn(config, run.inputs),
    ]
    if not peer:
        found += _logs(config, out_dir)
    return [c for c in found if c is not None]


def _noise_scale(config, step_batch):
    if not config.gradient_noise_scale:
        return []
    from keras_largebatch.noise_scale import GradientNoiseScale

    return [GradientNoiseScale(step_batch)]


def _adaptive_batch(config, step_batch):
    """`--adaptive_batch`: the callback that grows the batch from
    `step_batch` (one micro-batch, all replicas) times
    `--gradient_accumulation_steps`; its state is the optimizer's, so the
    backup resumes it at the batch it had."""
    if config.adaptive_batch == "none":
        return []
    from keras_largebatch.adaptive_batch import AdaptiveBatch
    from keras_largebatch.train import flags

    schedule = flags.batch_schedule(config) or None
    return [AdaptiveBatch(
        step_batch, max_batch_size=config.max_global_batch_size or None,
        policy=config.adaptive_batch, c=config.noise_scale_multiple,
        schedule=schedule,
        learning_rate_rule=config.adaptive_learning_rate)]


def _residual_checkpoints(config, strategy, backup_dir):
    """Under `--compression=topk`, the callback that saves and restores this
    worker's error-feedback residuals at each epoch's end, beside the
    backup (`Backup` resumes from the same epoch)."""
    if config.compression != "topk" or strategy is None:
        return []
    from keras_largebatch.distribute import sparse

    return [sparse.residual_checkpoint_callback(
        strategy, os.path.join(backup_dir, "topk_residuals"))]


def _precise_bn(config, inputs):
    if not config.precise_bn_batches:
        return []
    from keras_largebatch.precise_bn import PreciseBatchNorm

    return [PreciseBatchNorm(inputs.precise_bn_batches,
                             config.precise_bn_batches)]


def _logs(config, out_dir):
    """history.csv, the epoch checkpoints and TensorBoard (None without
    a writer)."""
    import keras

    from keras_largebatch.train import checkpoints

    return [
        keras.callbacks.CSVLogger(
            os.path.join(out_dir, "history.csv"), append=True),
        checkpoints.EpochCheckpoints(
            os.path.join(out_dir, "checkpoints"), config.keep_checkpoints),
        outputs.tensorboard(os.path.join(out_dir, "tensorboard")),
    ]
