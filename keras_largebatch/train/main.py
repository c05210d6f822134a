"""`keras-largebatch-train`: the large-batch training job.

    keras-largebatch-train --model_dir /tmp/run1

trains AlexNet-BN (67x67) on the embedded digits with LARSMixed, warmup and
polynomial decay, shows Keras' progress bar (one line per epoch when stdout
is not a terminal) and writes `summary.json`,
`learning_curves.png` and checkpoints (see `outputs.py`). Running it again
with the same `--model_dir` resumes from the last finished epoch.

Every input is checked before anything is written; a bad one (unknown
model or data set, a global batch not divisible by the replicas, a missing
folder, a corrupt image, `--init_weights` of another architecture) ends the
command with a one-line error on stderr and exit code 2.
"""

import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings

from absl import app
from absl import flags

from keras_largebatch._shared import require
from keras_largebatch.train import flags as train_flags

PROG = "keras-largebatch-train"


def run(argv=None):
    """Console-script entry point."""
    sys.exit(main(sys.argv if argv is None else argv))


def main(argv):
    """Parses `argv` (argv[0] is the program) and trains; returns the exit code."""
    start = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    train_flags.define_flags()
    if "help" not in flags.FLAGS:
        app.define_help_flags()
    FLAGS = flags.FLAGS
    FLAGS.unparse_flags()
    try:
        rest = FLAGS(list(argv))
    except flags.Error as e:
        return fail(e)
    if len(rest) > 1:
        return fail(f"Unexpected arguments: {' '.join(rest[1:])}")
    try:
        train_flags.check({name: FLAGS[name].value
                           for name in train_flags.BY_NAME})
    except ValueError as e:
        return fail(e)
    from keras_largebatch.train import processes

    if (FLAGS.distribution == "data_parallel"
            and processes.SUPERVISED not in os.environ
            and processes.is_multi_process()):
        return processes.supervise(argv, FLAGS.model_dir,
                                   FLAGS.collective_timeout_seconds)
    try:
        strategy = None
        if FLAGS.distribution == "multi_worker":
            strategy = _multi_worker_strategy(FLAGS)  # before any TF op
        if FLAGS.mode == "eval":
            from keras_largebatch.train import evaluate

            evaluate.flags_from_run(FLAGS)
        job = prepare(FLAGS, strategy)
        if FLAGS.mode == "eval":
            return evaluate.evaluate(job)
    except (ValueError, OSError) as e:
        return fail(e)
    if FLAGS.distribution != "multi_worker":
        return train(job, start)
    import tensorflow as tf

    try:
        return train(job, start)
    except tf.errors.OpError as e:
        workers = len(json.loads(os.environ.get("TF_CONFIG") or "{}").get(
            "cluster", {}).get("worker", [])) or 1
        lost = processes.lost_worker_message(e, workers, job.task)
        print(f"{PROG}: error: {lost} "
              f"To resume, start all {workers} workers again with the same "
              f"command: they continue from the last finished epoch in "
              f"{FLAGS.model_dir}.", file=sys.stderr)
        return 1


def fail(error):
    message = " ".join(str(error).split())
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


class Job:
    """Everything checked and built, nothing written yet."""

    def precise_bn_batches(self, epoch):
        """The `--precise_bn_batches` training batches for `epoch`:
        augmented and normalized as in training, one batch-norm batch each
        (the step's batch, a micro-batch under accumulation), a function of
        the seed and the epoch only (a resumed run recomputes the same
        statistics)."""
        train_ds, _ = self.batches(
            self.flags["seed"] + 1, drop_remainder=True,
            steps_per_epoch=self.flags["precise_bn_batches"],
            epochs=epoch + 1, initial_epoch=epoch)
        return train_ds


def prepare(FLAGS, strategy=None):
    """Builds data, model and optimizer for the checked flags, with the
    multi-worker `strategy` if any; checks what needs the data or the
    devices (no writes)."""
    import keras

    from keras_largebatch.train import augment
    from keras_largebatch.train import data
    from keras_largebatch.train import outputs
    from keras_largebatch.train import recipe

    job = Job()
    job.process_index, job.process_count = 0, 1
    job.flags = {name: FLAGS[name].value for name in train_flags.RECORDED}
    size = recipe.image_size_for(FLAGS.model, FLAGS.dataset, FLAGS.image_size)
    minimum = recipe.MIN_IMAGE_SIZE[FLAGS.model]
    require(size >= minimum, "image_size", size,
            f"at least {minimum} for {FLAGS.model}")
    # Each worker would compute statistics of its own batches and assign
    # them to mirrored variables: they would differ between workers.
    require(FLAGS.precise_bn_batches == 0
            or FLAGS.distribution != "multi_worker", "precise_bn_batches",
            FLAGS.precise_bn_batches,
            "0 with --distribution=multi_worker (each worker would set "
            "different statistics)")
    if FLAGS.init_weights and not os.path.isfile(FLAGS.init_weights):
        raise ValueError(
            "`init_weights` is not a file. Received: "
            f"init_weights={FLAGS.init_weights!r}"
        )
    if not FLAGS.model_dir:
        raise ValueError("`model_dir` is required. Received: model_dir=None")

    if FLAGS.distribution == "multi_worker":
        strategy = strategy or _multi_worker_strategy(FLAGS)
        job.strategy = strategy
        job.replicas, job.chief, job.task = _worker_roles(strategy)
    else:
        job.strategy, job.replicas, job.chief, job.task = _distribution(
            FLAGS)
    if FLAGS.distribution == "data_parallel":
        import jax

        job.process_index, job.process_count = (jax.process_index(),
                                                jax.process_count())
    # Each process would set statistics of its own slice of the batches.
    require(FLAGS.precise_bn_batches == 0 or job.process_count == 1,
            "precise_bn_batches", FLAGS.precise_bn_batches,
            "0 with several JAX processes (each would set different "
            "statistics)")
    batch = FLAGS.global_batch_size
    require(batch % job.replicas == 0, "global_batch_size", batch,
            f"divisible by the number of replicas ({job.replicas})")
    require(batch % (job.replicas * FLAGS.gradient_accumulation_steps) == 0,
            "global_batch_size", batch,
            f"divisible by the replicas ({job.replicas}) times "
            f"--gradient_accumulation_steps "
            f"({FLAGS.gradient_accumulation_steps})")
    keras.utils.set_random_seed(FLAGS.seed)
    if FLAGS.deterministic:
        _make_deterministic()
    job.precision = recipe.resolve_precision(FLAGS.precision)
    keras.mixed_precision.set_dtype_policy(job.precision)

    spec = data.load(FLAGS.dataset, size, FLAGS.data_dir, FLAGS.num_classes,
                     FLAGS.seed, FLAGS.check_images,
                     recipe.input_channels(FLAGS.model),
                     (FLAGS.num_train_examples,
                      FLAGS.num_validation_examples), FLAGS.init_weights)
    job.spec, job.image_size = spec, size
    job.run_config = dict(job.flags, image_size=size,
                          num_classes=spec.num_classes)
    job.resuming = outputs.check_model_dir(FLAGS.model_dir, job.run_config)
    job.initial_epoch = job.resuming.finished_epochs if job.resuming else 0

    policy = augment.policy_for(FLAGS.augment, FLAGS.dataset)
    drop = job.replicas > 1
    _check_sizes(FLAGS, spec, drop)
    accumulation = FLAGS.gradient_accumulation_steps
    job.step_batch = FLAGS.global_batch_size // accumulation
    per_epoch = FLAGS.steps_per_epoch or (
        spec.num_train // job.step_batch if drop
        else math.ceil(spec.num_train / job.step_batch))
    job.steps_per_epoch = per_epoch
    job.batches = _pipeline(job, FLAGS, spec, policy, drop)
    job.train_ds, job.val_ds = job.batches(
        FLAGS.seed, steps_per_epoch=FLAGS.steps_per_epoch or None,
        epochs=FLAGS.epochs,
        initial_epoch=min(job.initial_epoch, FLAGS.epochs - 1))

    job.peak_lr = recipe.peak_learning_rate(
        FLAGS.optimizer, FLAGS.base_learning_rate, FLAGS.global_batch_size,
        FLAGS.base_batch_size, FLAGS.lr_scaling)
    raised = job.resuming and job.resuming.raised
    # A default warmup is a fraction of the run: of the original one when
    # --epochs is raised on resume, so the steps already taken keep theirs.
    job.warmup_epochs = recipe.warmup_epochs_for(
        FLAGS.optimizer, FLAGS.lr_scaling, FLAGS.global_batch_size,
        job.resuming.epochs_before if raised else FLAGS.epochs,
        FLAGS.warmup_epochs)
    with _scope(job.strategy):
        model = recipe.build_model(
            FLAGS.model, size, spec.num_classes, FLAGS.bn_momentum,
            spec.channels, FLAGS.resnet_depth, FLAGS.resnet_width)
        if FLAGS.init_weights:
            recipe.load_init_weights(model, FLAGS.init_weights)
        # Keras calls a schedule with its step counter, which counts
        # batches, not updates, under gradient accumulation.
        lr = recipe.schedule(job.peak_lr, per_epoch, FLAGS.epochs,
                             job.warmup_epochs, FLAGS.end_learning_rate,
                             FLAGS.poly_power)
        if raised:
            from keras_largebatch.train import resume

            before = recipe.schedule(
                job.peak_lr, per_epoch, job.resuming.epochs_before,
                job.warmup_epochs, FLAGS.end_learning_rate,
                FLAGS.poly_power)
            job.raise_message = resume.raise_message(
                job.resuming, before, lr, per_epoch)
        optimizer = recipe.build_optimizer(
            FLAGS.optimizer, lr, model, FLAGS.momentum, FLAGS.eta,
            FLAGS.weight_decay, FLAGS.gradient_accumulation_steps)
        recipe.compile_model(model, optimizer, FLAGS.label_smoothing,
                             top5=spec.num_classes > 10)
        if FLAGS.gradient_noise_scale:
            from keras_largebatch import noise_scale

            try:
                noise_scale.check_measurable(optimizer, job.strategy)
            except ValueError:
                raise ValueError(
                    "`gradient_noise_scale` needs two batch sizes in one "
                    "step: --gradient_accumulation_steps >= 2 or several "
                    "replicas (--distribution=multi_worker). Received: "
                    "gradient_noise_scale=True, gradient_accumulation_steps="
                    f"{FLAGS.gradient_accumulation_steps}") from None
    job.model = model
    job.model_dir = FLAGS.model_dir
    return job


def _pipeline(job, FLAGS, spec, policy, drop):
    """`batches(seed, **kwargs) -> (train, validation)` of the resolved
    `--input_pipeline`: tf.data, or Grain (no TensorFlow)."""
    from keras_largebatch.train import data

    job.input_pipeline = resolve_input_pipeline(FLAGS.input_pipeline,
                                               FLAGS.dataset)
    kwargs = dict(drop_remainder=drop)
    if job.input_pipeline == "grain":
        from keras_largebatch.train import augment_numpy
        from keras_largebatch.train import grain_data

        augmenter = augment_numpy.build(policy, FLAGS.seed)
        build = grain_data.batch
        kwargs.update(process_index=job.process_index,
                      process_count=job.process_count)
    else:
        from keras_largebatch.train import augment

        data.require_tensorflow("`input_pipeline=tf_data`")
        augmenter = augment.build(policy, job.image_size, FLAGS.seed)
        build = data.batch

    def batches(seed, **overrides):
        return build(spec, job.step_batch, augmenter, seed,
                     **dict(kwargs, **overrides))

    return batches


def resolve_input_pipeline(input_pipeline, dataset):
    """`--input_pipeline` resolved: `auto` is tf.data on the TensorFlow
    backend and for TFRecords, Grain elsewhere."""
    import keras

    if input_pipeline != "auto":
        return input_pipeline
    if keras.backend.backend() == "tensorflow" or dataset == "tfrecord":
        return "tf_data"
    return "grain"


def _residual_checkpoints(job, backup_dir):
    """Under `--compression=topk`, the callback that saves and restores this
    worker's error-feedback residuals at each epoch's end, beside the
    backup (`Backup` resumes from the same epoch)."""
    if job.flags.get("compression") != "topk" or job.strategy is None:
        return []
    from keras_largebatch.distribute import sparse

    return [sparse.residual_checkpoint_callback(
        job.strategy, os.path.join(backup_dir, "topk_residuals"))]


def _noise_scale(job):
    if not job.flags["gradient_noise_scale"]:
        return []
    from keras_largebatch.noise_scale import GradientNoiseScale

    return [GradientNoiseScale(job.step_batch)]


def _precise_bn(job):
    count = job.flags["precise_bn_batches"]
    if not count:
        return []
    from keras_largebatch.precise_bn import PreciseBatchNorm

    return [PreciseBatchNorm(job.precise_bn_batches,
                             count)]


def train(job, start):
    """Creates `model_dir`, fits (resuming), evaluates and writes outputs."""
    # TensorFlow workers other than the chief keep their own state apart;
    # JAX processes other than the chief save (a collective) into a scratch
    # folder, deleted at the end, and restore from the chief's backup.
    peer = job.process_count > 1 and not job.chief
    out_dir = job.model_dir if job.chief else (
        tempfile.mkdtemp(prefix="keras-largebatch-peer-") if peer
        else os.path.join(job.model_dir, f"worker_{job.task}"))
    try:
        return _train(job, start, out_dir, peer)
    finally:
        if peer:
            shutil.rmtree(out_dir, ignore_errors=True)


def _train(job, start, out_dir, peer):
    import keras

    from keras_largebatch.train import checkpoints
    from keras_largebatch.train import outputs
    from keras_largebatch.train import recipe
    from keras_largebatch.train import resume

    F = job.flags
    os.makedirs(os.path.join(out_dir, "checkpoints"), exist_ok=True)
    if job.chief and not job.resuming:
        outputs.write_json(os.path.join(out_dir, "run_config.json"),
                           job.run_config)
    if job.chief and job.resuming and job.resuming.raised:
        print(f"{PROG}: {job.raise_message}")
        resume.record_raise(out_dir, job.resuming, job.raise_message)
    throughput = outputs.Throughput(job.step_batch)
    callbacks = [
        throughput,  # First: adds images_per_sec to the logs the rest see.
        outputs.EpochScalars(),  # learning_rate, loss_scale
        *_noise_scale(job),
        outputs.Backup(os.path.join(job.model_dir if peer else out_dir,
                                    "backup"),
                       os.path.join(out_dir, "backup")),
        *_residual_checkpoints(job, os.path.join(out_dir, "backup")),
        resume.step_randomness(F["seed"]),
        *_precise_bn(job),  # Before validation, so CSV/checkpoints see it.
    ]
    if not peer:
        callbacks += [
            keras.callbacks.CSVLogger(
                os.path.join(out_dir, "history.csv"), append=True),
            checkpoints.EpochCheckpoints(
                os.path.join(out_dir, "checkpoints"), F["keep_checkpoints"]),
            outputs.tensorboard(os.path.join(out_dir, "tensorboard")),
        ]
    with warnings.catch_warnings():
        # Keras' Grain adapter knows no length, so the end of each
        # validation pass reads as "input ran out of data".
        warnings.filterwarnings("ignore", "Your input ran out of data")
        history, val_metrics = _fit(job, callbacks)
    epochs_run = len(history.epoch)
    val_accuracy = float(val_metrics["accuracy"])
    checkpoints.save_final(
        job.model, os.path.join(out_dir, "checkpoints"), out_dir,
        job.initial_epoch + epochs_run, F["keep_checkpoints"])
    summary_path = os.path.join(out_dir, "summary.json")
    images_per_sec = throughput.images_per_sec()
    images_timed, seconds_timed = throughput.timed()
    previous = {}
    if job.resuming and os.path.exists(summary_path):
        with open(summary_path) as f:
            previous = json.load(f)
    if images_per_sec is None:
        images_per_sec = previous.get("images_per_sec")
    wall_now = time.perf_counter() - start
    summary = {
        "model": F["model"],
        "dataset": F["dataset"],
        "global_batch_size": F["global_batch_size"],
        "epochs": F["epochs"],
        "epochs_run_now": epochs_run,
        "val_accuracy": val_accuracy,
        "images_per_sec": images_per_sec,
        # What images_per_sec divides (epochs after the first, this process).
        "images_timed": images_timed,
        "train_seconds_timed": seconds_timed,
        # Over every invocation on this model_dir (resumed runs add up).
        "wall_seconds": previous.get("wall_seconds", 0.0) + wall_now,
        "wall_seconds_now": wall_now,
        "image_size": job.image_size,
        "optimizer": F["optimizer"],
        "peak_learning_rate": job.peak_lr,
        "lr_rule": recipe.lr_rule(F["optimizer"], F["lr_scaling"]),
        "warmup_epochs": job.warmup_epochs,
        "precision": job.precision,
        "backend": keras.backend.backend(),
        "replicas": job.replicas,
        "num_train": job.spec.num_train,
        "num_validation": job.spec.num_validation,
    }
    if "top5_accuracy" in val_metrics:
        summary["top5_accuracy"] = float(val_metrics["top5_accuracy"])
    noise = history.history.get("gradient_noise_scale")
    if noise:
        from keras_largebatch.noise_scale import describe

        summary["gradient_noise_scale"] = float(noise[-1])
        print(f"{PROG}: {describe(float(noise[-1]), F['global_batch_size'])}")
    if job.chief:
        outputs.plot_learning_curves(
            outputs.read_history(os.path.join(out_dir, "history.csv")),
            os.path.join(out_dir, "learning_curves.png"),
            f"{F['model']} on {F['dataset']}, batch {F['global_batch_size']}"
            f", {F['optimizer']}",
        )
        outputs.write_json(summary_path, summary)
    where = summary_path if job.chief else "(not the chief: no summary)"
    print(f"{PROG}: val_accuracy={val_accuracy:.4f} "
          f"images_per_sec={images_per_sec or 0:.1f} "
          f"wall_seconds={wall_now:.1f} -> {where}")
    return 0


def _fit(job, callbacks):
    """`fit`, then `evaluate` on the validation set: (history, metrics)."""
    history = job.model.fit(
        job.train_ds, validation_data=job.val_ds, epochs=job.flags["epochs"],
        steps_per_epoch=job.steps_per_epoch,
        callbacks=[c for c in callbacks if c is not None],
        verbose=_verbose(job.flags["verbose"]),
        shuffle=False,  # The pipelines shuffle.
    )
    return history, job.model.evaluate(job.val_ds, verbose=0,
                                       return_dict=True)


def _verbose(verbose):
    """`--verbose`, or by default a progress bar on a terminal and one line
    per epoch otherwise (a log file gets no redrawn bars)."""
    if verbose is not None:
        return verbose
    return 1 if sys.stdout.isatty() else 2


def _check_sizes(FLAGS, spec, drop_remainder):
    """Refuses a batch the data cannot fill and a warmup the run never ends.

    The learning rate is scaled for `global_batch_size`, so a batch larger
    than the training set would train on smaller batches at a rate scaled
    for the larger one.
    """
    batch = FLAGS.global_batch_size
    if batch > spec.num_train:
        raise ValueError(
            f"`global_batch_size` is larger than the {spec.num_train} "
            f"training images. Received: global_batch_size={batch}")
    require(FLAGS.warmup_epochs is None or FLAGS.warmup_epochs < FLAGS.epochs,
            "warmup_epochs", FLAGS.warmup_epochs,
            f"less than `epochs` ({FLAGS.epochs}): the warmup would never end")
    val_batches = (spec.num_validation // batch if drop_remainder
                   else math.ceil(spec.num_validation / batch))
    if val_batches < 1:
        why = (" (batches are full: several replicas drop the remainder)"
               if drop_remainder else "")
        raise ValueError(
            f"The validation set ({spec.num_validation} images) has no "
            f"batch of `global_batch_size`{why}. "
            f"Received: global_batch_size={batch}")


def _make_deterministic():
    """Deterministic kernels (what `--deterministic` changes)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    elif backend == "torch":
        import torch

        torch.use_deterministic_algorithms(True)


def _distribution(FLAGS):
    """`none` or `data_parallel`: (None, replicas, is_chief, process
    index)."""
    import keras

    from keras_largebatch.train import processes

    backend = keras.backend.backend()
    if FLAGS.distribution == "none":
        return None, 1, True, 0
    if FLAGS.distribution == "data_parallel":
        if backend != "jax":
            raise ValueError(
                "`distribution=data_parallel` uses keras.distribution, which "
                f"needs the JAX backend. Received: backend={backend}")
        index, _ = processes.initialize(FLAGS.collective_timeout_seconds)
        devices = keras.distribution.list_devices()
        distribution = keras.distribution.DataParallel(
            devices=devices, auto_shard_dataset=False)
        keras.distribution.set_distribution(distribution)
        return None, len(devices), index == 0, index
    raise ValueError(
        "`distribution=multi_worker` is created by `main` first. Received: "
        f"distribution={FLAGS.distribution!r}")


def _worker_roles(strategy):
    """(replicas, is_chief, task index) of this worker under `TF_CONFIG`."""
    raw = os.environ.get("TF_CONFIG")
    tf_config = json.loads(raw) if raw is not None else {}
    task = tf_config.get("task", {})
    cluster = tf_config.get("cluster", {})
    chief = task.get("type", "worker") == "chief" or (
        "chief" not in cluster and task.get("index", 0) == 0)
    return strategy.num_replicas_in_sync, chief, task.get("index", 0)


def _multi_worker_strategy(FLAGS):
    """The flags' `MultiWorkerMirroredStrategy`.

    `main` creates it first, after parsing and checking the flags and
    before any other TensorFlow op: TensorFlow configures collectives when
    its runtime starts, and the strategy waits there for every worker in
    `TF_CONFIG`.
    """
    backend = os.environ.get("KERAS_BACKEND")
    if backend is None:
        import keras

        backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(
            "`distribution=multi_worker` needs the TensorFlow backend "
            f"(KERAS_BACKEND=tensorflow). Received: backend={backend}")
    raw = os.environ.get("TF_CONFIG")
    try:
        json.loads(raw) if raw is not None else {}
    except json.JSONDecodeError:
        raise ValueError(
            "The TF_CONFIG environment variable must be JSON (or unset for "
            f"one worker). Received: TF_CONFIG={raw!r}") from None
    import tensorflow as tf

    from keras_largebatch import distribute

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=FLAGS.collective_timeout_seconds or None)
    return distribute.MultiWorkerMirroredStrategy(
        communication_options=options,
        fusion_threshold_bytes=FLAGS.fusion_threshold_bytes,
        hierarchical_threshold_bytes=FLAGS.hierarchical_threshold_bytes,
        compression=FLAGS.compression,
        workers_per_node=FLAGS.workers_per_node or None,
        topk_density=FLAGS.topk_density,
    )


class _NullScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _scope(strategy):
    return strategy.scope() if strategy is not None else _NullScope()


if __name__ == "__main__":
    run()
