"""The callbacks of `fit`, in the order they see each epoch's logs
(`callbacks`), each built from the config parts it reads: the divergence
check, throughput, the adaptive batch, the noise scale, the checkpoints
within epochs, precise BN, the logs, the evaluations within an epoch, the
epoch backup and the stop on a signal. The callback classes live with
their concept (`outputs.callbacks`, `checkpointing`, `divergence`,
`interrupt`, and the package's `adaptive_batch`, `noise_scale`,
`precise_bn`)."""

import os

from keras import ops

from keras_largebatch.train import checkpointing
from keras_largebatch.train import layout
from keras_largebatch.train.outputs import callbacks as outputs
from keras_largebatch.train.run import divergence
from keras_largebatch.train.run import interrupt


def callbacks(runtime, adaptive, evaluation, inputs, throughput, out_dir,
              *, gradient_accumulation_steps, compression="none",
              strategy=None, peer=False, start=None, agreement=None):
    """The callbacks of `fit`, in the order they see each epoch's logs.

    `runtime`, `adaptive` and `evaluation` are those parts of
    `config.RunConfig`; `gradient_accumulation_steps` is the micro-batches
    per update (unless the batch grows), `compression` the top-k residuals'
    (under `strategy`), `inputs` a `data.Inputs`. First
    `divergence.StopOnDivergence` (non-finite weights stop the run before
    anything saves them), then `throughput`; precise BN before the logs
    and checkpoints. The epoch backup (`checkpointing.Backup`) after every
    other writer: an epoch's records are on disk before the backup a
    resume starts from commits (a run killed before it replays the epoch,
    its stale rows trimmed). Last, `interrupt.StopOnInterrupt`: after
    SIGINT or SIGTERM it saves within the epoch (the top-k residuals too)
    at the step the job's processes agree on (`agreement`, a
    `processes.agreement` object; None: one process), or stops after the
    backup at an epoch's end. A `peer` (a JAX process not
    the chief) backs up into `out_dir`, restores from the chief's and
    writes no logs or checkpoints; `start` (a `checkpointing.restore.Start`)
    is what this run resumes from.
    """
    backup = os.path.join(out_dir, layout.BACKUP)
    within_epoch = start.position if start is not None else None
    growing = _adaptive_batch(adaptive, inputs.step_batch)
    residuals = _residual_checkpoints(compression, strategy, backup,
                                      within_epoch)
    steps = _step_checkpoints(runtime.checkpoint_every_steps, backup, inputs,
                              within_epoch, growing, strategy, residuals,
                              agreement)
    found = [
        # First: it raises on non-finite weights before anything saves them.
        divergence.StopOnDivergence(within_epoch),
        throughput,
        outputs.EpochScalars(),  # learning_rate, loss_scale
        # The adaptive batch first: its wrapper (every update measured)
        # is the one the noise-scale logs then read.
        *growing,
        *_noise_scale(adaptive, inputs.step_batch),
        steps,
        *residuals,
        outputs.step_randomness(runtime.seed, within_epoch),
        *_precise_bn(evaluation.precise_bn_batches, inputs),
    ]
    if not peer:
        found += _logs(runtime.keep_checkpoints, out_dir)
    # Every JAX process evaluates (it is collective); the chief writes.
    found += _within_epoch_evals(
        evaluation.evals_per_epoch, gradient_accumulation_steps,
        inputs.validation, throughput, None if peer else out_dir, growing,
        within_epoch)
    found += [
        # Its restore and the one within an epoch exclude each other.
        checkpointing.Backup(os.path.join(runtime.model_dir, layout.BACKUP)
                             if peer else backup, backup, start),
        interrupt.StopOnInterrupt(steps, agreement),
    ]
    return [c for c in found if c is not None]


def _within_epoch_evals(per_epoch, accumulation_steps, validation,
                        throughput, out_dir, growing, resumed):
    """`--evals_per_epoch` (`per_epoch`) above 1: the evaluations within
    each epoch, with the micro-batches per update read from the adaptive
    batch (`growing`) when it grows, else `accumulation_steps`; `out_dir`
    None: evaluate, write nothing (a JAX peer). A run `resumed` within an
    epoch (a `Position`) goes on from there."""
    if per_epoch == 1:
        return []
    if growing:
        accumulation = lambda: growing[0].accumulation_steps  # noqa: E731
        taken = lambda: _updates_taken(growing[0])  # noqa: E731
    else:
        accumulation, taken = (lambda: accumulation_steps), None
    return [outputs.WithinEpochEvals(
        validation, per_epoch,
        out_dir and os.path.join(out_dir, layout.EVALS), accumulation,
        throughput, resumed, taken)]


def _updates_taken(adaptive):
    """The updates the adaptive batch's optimizer has taken, the one under
    way counted by the micro-batches it has of the k in effect."""
    from keras_largebatch import noise_scale

    k = adaptive.accumulation_steps
    counter = noise_scale.accumulating_optimizer(
        adaptive.model.optimizer)._iterations
    return (int(ops.convert_to_numpy(adaptive.state.updates))
            + int(ops.convert_to_numpy(counter)) % k / k)


def _step_checkpoints(every, backup_dir, inputs, within_epoch, growing,
                      strategy, residuals, agreement):
    """The callback that saves within epochs (every `every` updates, where
    a signal stops the run) and resumes `within_epoch`, with the top-k
    `residuals` where there are, every worker's on disk (`agreement`'s
    barrier) before the chief's pointer names them."""
    data = inputs.train if hasattr(inputs.train, "state_at") else None
    return checkpointing.StepCheckpoints(
        every, backup_dir, inputs.steps_per_epoch, within_epoch, data,
        growing[0] if growing else None, strategy,
        residuals[0] if residuals else None,
        agreement.barrier if agreement is not None else None)


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


def _residual_checkpoints(compression, strategy, backup_dir, within_epoch):
    """Under `--compression=topk`, the callback that saves and restores this
    worker's error-feedback residuals at each epoch's end, beside the
    backup (`Backup` resumes from the same epoch), and with each checkpoint
    within an epoch; a run resuming `within_epoch` (a `Position`) restores
    those of that checkpoint."""
    if compression != "topk" or strategy is None:
        return []
    from keras_largebatch.distribute import sparse

    within = within_epoch and layout.RESIDUALS_WITHIN.format(
        within_epoch.epoch + 1, within_epoch.step)
    return [sparse.residual_checkpoint_callback(
        strategy, os.path.join(backup_dir, layout.RESIDUALS), within)]


def _precise_bn(count, inputs):
    if not count:
        return []
    from keras_largebatch.precise_bn import PreciseBatchNorm

    return [PreciseBatchNorm(inputs.precise_bn_batches, count)]


def _logs(keep_checkpoints, out_dir):
    """history.csv, the epoch checkpoints (`keep_checkpoints` kept) and
    TensorBoard (None without a writer)."""
    return [
        outputs.HistoryCSV(os.path.join(out_dir, layout.HISTORY)),
        checkpointing.EpochCheckpoints(
            os.path.join(out_dir, layout.CHECKPOINTS), keep_checkpoints),
        outputs.tensorboard(os.path.join(out_dir, layout.TENSORBOARD)),
    ]
