"""The run, assembled by builders with explicit inputs and outputs.

`driver.prepare` calls them in turn, as Model Garden's `train_lib` hands a
typed config to a task, a trainer and a controller. Each takes the parts
of `config.RunConfig` it reads (`config.training`, ...), and a lone value
where it reads one flag of a part that is otherwise not its business:

    check_devices(training, precise_bn_batches, devices)
    data.load_for(data, network, seed)              -> DataSpec
    data.inputs(data, training, spec, devices, seed, precise_bn_batches,
                epoch)                              -> Inputs
    schedule(learning_rate, training, optimizer, steps_per_epoch,
             resuming)                              -> Schedule
    model(network, optimization, gradient_accumulation_steps, spec,
          schedule)                                 -> a compiled keras.Model
    check_noise_scale(optimizer, strategy, gradient_accumulation_steps)
    callbacks(runtime, adaptive, evaluation, inputs, throughput, out_dir,
              ...)                                  -> the callbacks of `fit`

`Run` is what the builders built (`placement.Devices` is where it
computes). What the run writes around `fit` is `outputs/report.py`'s.
"""

import dataclasses
import os

from keras_largebatch._shared import require
from keras_largebatch.train.run import divergence
from keras_largebatch.train.run import interrupt
from keras_largebatch.train import checkpointing
from keras_largebatch.train.outputs import callbacks as outputs
from keras_largebatch.train.recipe import models
from keras_largebatch.train.recipe import optimizers
from keras_largebatch.train.recipe import rates
from keras_largebatch.train.checkpointing import resume
from keras_largebatch.train.run.placement import Devices


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
    """Everything checked and built, nothing written yet (the settings
    stay in `config.RunConfig`, whose parts the driver hands out).

    Attributes:
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

    devices: Devices
    spec: object
    inputs: object
    schedule: Schedule
    model: object
    resuming: object
    recorded: dict
    precision: str
    initial_epoch: int


def check_devices(training, precise_bn_batches, devices):
    """Refuses a batch of `training` the replicas cannot split and precise
    BN over several processes."""
    # Each process would set statistics of its own slice of the batches.
    require(precise_bn_batches == 0 or devices.process_count == 1,
            "precise_bn_batches", precise_bn_batches,
            "0 with several processes (each would set different "
            "statistics)")
    batch, replicas = training.global_batch_size, devices.replicas
    require(batch % replicas == 0, "global_batch_size", batch,
            f"divisible by the number of replicas ({replicas})")
    accumulation = training.gradient_accumulation_steps
    require(batch % (replicas * accumulation) == 0,
            "global_batch_size", batch,
            f"divisible by the replicas ({replicas}) times "
            f"--gradient_accumulation_steps ({accumulation})")


def schedule(learning_rate, training, optimizer, steps_per_epoch,
             resuming=None):
    """The `Schedule` of `learning_rate` (`RunConfig.learning_rate`) for
    the batch and epochs of `training` and the `optimizer` (its name,
    which picks the default rule); resuming with `--epochs` raised, the
    one of a run planned for the new number of epochs."""
    lr, batch = learning_rate, training.global_batch_size
    peak = rates.peak_learning_rate(
        optimizer, lr.base_learning_rate, batch, lr.base_batch_size,
        lr.lr_scaling)
    raised = resuming is not None and resuming.raised
    # A default warmup is a fraction of the run: of the original one when
    # --epochs is raised on resume, so the steps already taken keep theirs.
    warmup = rates.warmup_epochs_for(
        optimizer, lr.lr_scaling, batch,
        resuming.epochs_before if raised else training.epochs,
        lr.warmup_epochs)

    def planned(epochs):
        # Keras calls a schedule with its step counter, which counts
        # batches, not updates, under gradient accumulation.
        return rates.schedule(peak, steps_per_epoch, epochs, warmup,
                              lr.end_learning_rate, lr.poly_power)

    learning_rate = planned(training.epochs)
    message = None
    if raised:
        message = resume.raise_message(
            resuming, planned(resuming.epochs_before), learning_rate,
            steps_per_epoch)
    return Schedule(peak, warmup, learning_rate, message)


def model(network, optimization, gradient_accumulation_steps, spec,
          schedule):
    """The model of `network` (`RunConfig.network`) for `spec`, compiled
    with the optimizer and loss of `optimization` on `schedule`, averaging
    `gradient_accumulation_steps` batches per update; call it in the
    strategy's scope."""
    built = models.build_model(
        network.model, spec.image_size, spec.num_classes,
        network.bn_momentum, spec.channels, network.resnet_depth,
        network.resnet_width)
    if network.init_weights:
        models.load_init_weights(built, network.init_weights)
    optimizer = optimizers.build_optimizer(
        optimization.optimizer, schedule.learning_rate, built,
        optimization.momentum, optimization.eta, optimization.weight_decay,
        gradient_accumulation_steps, nesterov=optimization.nesterov)
    optimizers.compile_model(built, optimizer, optimization.label_smoothing,
                         top5=spec.num_classes > 10)
    return built


def check_noise_scale(optimizer, strategy, gradient_accumulation_steps):
    """`--gradient_noise_scale`: refuses an `optimizer` and `strategy`
    that take one batch size per step."""
    from keras_largebatch import noise_scale

    try:
        noise_scale.check_measurable(optimizer, strategy)
    except ValueError:
        raise ValueError(
            "`gradient_noise_scale` needs two batch sizes in one "
            "step: --gradient_accumulation_steps >= 2 or several "
            "replicas (--distribution=multi_worker). Received: "
            "gradient_noise_scale=True, gradient_accumulation_steps="
            f"{gradient_accumulation_steps}") from None


def callbacks(runtime, adaptive, evaluation, inputs, throughput, out_dir,
              *, gradient_accumulation_steps, compression="none",
              strategy=None, peer=False, start=None):
    """The callbacks of `fit`, in the order they see each epoch's logs.

    `runtime`, `adaptive` and `evaluation` are those parts of
    `config.RunConfig`; of the others it reads
    `gradient_accumulation_steps` (the micro-batches per update, unless
    the batch grows) and `compression` (top-k residuals, under
    `strategy`). `inputs` is `data.Inputs`. `divergence.StopOnDivergence`
    comes first (a run whose weights turned non-finite stops before any
    callback saves them), then `throughput` (it adds `images_per_sec` to
    the logs the rest see); precise BN before the logs and checkpoints,
    so they see its statistics. A `peer` (a JAX
    process other than the chief) saves its backup into `out_dir` and
    restores from the chief's, and writes no logs or checkpoints.
    `start` (a `checkpointing.restore.Start`, chosen from the chief's
    backup) is the checkpoint this run resumes from, if it does: the
    epoch backup or one within an epoch.
    """
    backup = os.path.join(out_dir, "backup")
    within_epoch = start.position if start is not None else None
    growing = _adaptive_batch(adaptive, inputs.step_batch)
    found = [
        # First: it raises on non-finite weights before anything saves them.
        divergence.StopOnDivergence(within_epoch),
        interrupt.StopOnInterrupt(),  # A swallowed Ctrl-C stops the run.
        throughput,
        outputs.EpochScalars(),  # learning_rate, loss_scale
        # The adaptive batch first: its wrapper (every update measured)
        # is the one the noise-scale logs then read.
        *growing,
        *_noise_scale(adaptive, inputs.step_batch),
        checkpointing.Backup(os.path.join(runtime.model_dir, "backup")
                             if peer else backup, backup, start),
        # After the backup: restores over it, and saves after it.
        *_step_checkpoints(runtime.checkpoint_every_steps, backup, inputs,
                           within_epoch, growing, strategy),
        *_residual_checkpoints(compression, strategy, backup),
        outputs.step_randomness(runtime.seed, within_epoch),
        *_precise_bn(evaluation.precise_bn_batches, inputs),
    ]
    if not peer:
        found += _logs(runtime.keep_checkpoints, out_dir)
    # Every JAX process evaluates (it is collective); the chief writes.
    found += _within_epoch_evals(
        evaluation.evals_per_epoch, gradient_accumulation_steps,
        inputs.validation, throughput, None if peer else out_dir, found)
    return [c for c in found if c is not None]


def _within_epoch_evals(per_epoch, accumulation_steps, validation,
                        throughput, out_dir, found):
    """`--evals_per_epoch` (`per_epoch`) above 1: the evaluations within
    each epoch, with the micro-batches per update read from the adaptive
    batch when it grows, else `accumulation_steps`; `out_dir` None:
    evaluate, write nothing (a JAX peer)."""
    if per_epoch == 1:
        return []
    # By the class: the property itself needs the model, not set yet.
    grown = [c for c in found if hasattr(type(c), "accumulation_steps")]
    accumulation = (lambda: grown[0].accumulation_steps) if grown else (
        lambda: accumulation_steps)
    return [outputs.WithinEpochEvals(
        validation, per_epoch,
        out_dir and os.path.join(out_dir, "evals.csv"), accumulation,
        throughput)]


def _step_checkpoints(every, backup_dir, inputs, within_epoch, growing,
                      strategy):
    """`--checkpoint_every_steps` (`every`), or a run resuming
    `within_epoch`: the callback that saves and restores within epochs."""
    if not every and within_epoch is None:
        return []
    data = inputs.train if hasattr(inputs.train, "state_at") else None
    return [checkpointing.StepCheckpoints(
        every, backup_dir, inputs.steps_per_epoch, within_epoch, data,
        growing[0] if growing else None, strategy)]


def _noise_scale(adaptive, step_batch):
    if not adaptive.gradient_noise_scale:
        return []
    from keras_largebatch.noise_scale import GradientNoiseScale

    return [GradientNoiseScale(step_batch)]


def _adaptive_batch(adaptive, step_batch):
    """`--adaptive_batch`: the callback that grows the batch from
    `step_batch` (one micro-batch, all replicas) times
    `--gradient_accumulation_steps`; its state is the optimizer's, so the
    backup resumes it at the batch it had."""
    if adaptive.adaptive_batch == "none":
        return []
    from keras_largebatch.adaptive_batch import AdaptiveBatch

    schedule = adaptive.batch_schedule or None
    return [AdaptiveBatch(
        step_batch, max_batch_size=adaptive.max_global_batch_size or None,
        policy=adaptive.adaptive_batch, c=adaptive.noise_scale_multiple,
        schedule=schedule,
        learning_rate_rule=adaptive.adaptive_learning_rate,
        start_multiple=adaptive.adaptive_start_multiple or None,
        anneal_fraction=(None if schedule
                         else adaptive.adaptive_anneal_fraction),
        anneal_multiple=adaptive.adaptive_anneal_multiple)]


def _residual_checkpoints(compression, strategy, backup_dir):
    """Under `--compression=topk`, the callback that saves and restores this
    worker's error-feedback residuals at each epoch's end, beside the
    backup (`Backup` resumes from the same epoch)."""
    if compression != "topk" or strategy is None:
        return []
    from keras_largebatch.distribute import sparse

    return [sparse.residual_checkpoint_callback(
        strategy, os.path.join(backup_dir, "topk_residuals"))]


def _precise_bn(count, inputs):
    if not count:
        return []
    from keras_largebatch.precise_bn import PreciseBatchNorm

    return [PreciseBatchNorm(inputs.precise_bn_batches, count)]


def _logs(keep_checkpoints, out_dir):
    """history.csv, the epoch checkpoints (`keep_checkpoints` kept) and
    TensorBoard (None without a writer)."""
    import keras

    return [
        keras.callbacks.CSVLogger(
            os.path.join(out_dir, "history.csv"), append=True),
        checkpointing.EpochCheckpoints(
            os.path.join(out_dir, "checkpoints"), keep_checkpoints),
        outputs.tensorboard(os.path.join(out_dir, "tensorboard")),
    ]
