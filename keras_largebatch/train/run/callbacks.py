"""The callbacks of `fit`, in the order they see each epoch's logs
(`callbacks`), each built from the config parts it reads: the divergence
check, Ctrl-C, throughput, the adaptive batch, the noise scale, the
checkpoints, precise BN, the logs and the evaluations within an epoch.
The callback classes live with their concept (`outputs.callbacks`,
`checkpointing`, `divergence`, `interrupt`, and the package's
`adaptive_batch`, `noise_scale`, `precise_bn`)."""

import os

from keras_largebatch.train import checkpointing
from keras_largebatch.train.outputs import callbacks as outputs
from keras_largebatch.train.run import divergence
from keras_largebatch.train.run import interrupt


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
