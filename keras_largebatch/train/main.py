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

This module is the driver: it parses the command line into one frozen
`flags.RunConfig` (the only reader of absl's `FLAGS`), places the run on
its devices, has the builders assemble it (`prepare`), then fits
(`train`) or evaluates (`evaluate.py`).
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

from absl import app
from absl import flags

from keras_largebatch.train import PROG
from keras_largebatch.train import flags as train_flags


def run(argv=None):
    """Console-script entry point."""
    sys.exit(main(sys.argv if argv is None else argv))


def main(argv):
    """Parses `argv` (argv[0] is the program) and trains or evaluates;
    returns the exit code."""
    start = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        config = parse(argv)
    except (flags.Error, ValueError) as e:
        return fail(e)
    from keras_largebatch.train import processes

    if (config.distribution == "data_parallel"
            and processes.SUPERVISED not in os.environ
            and processes.is_multi_process()):
        return processes.supervise(argv, config.model_dir,
                                   config.collective_timeout_seconds)
    try:
        devices = place(config)
        built = prepare(config, devices)
        if config.mode == "eval":
            from keras_largebatch.train import evaluate

            return evaluate.evaluate(built)
    except (ValueError, OSError) as e:
        return fail(e)
    if config.distribution != "multi_worker":
        return train(built, start)
    import tensorflow as tf

    try:
        return train(built, start)
    except tf.errors.OpError as e:
        lost = processes.lost_worker_message(e, devices.workers, devices.task)
        print(f"{PROG}: error: {lost} "
              f"To resume, start all {devices.workers} workers again with "
              f"the same command: they continue from the last finished "
              f"epoch in {config.model_dir}.", file=sys.stderr)
        return 1


def fail(error):
    message = " ".join(str(error).split())
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def parse(argv):
    """The checked `flags.RunConfig` of `argv`; under `--mode=eval`, flags
    not given are the run's (`evaluate.run_values`). Raises absl's
    `flags.Error` or `ValueError`."""
    train_flags.define_flags()
    if "help" not in flags.FLAGS:
        app.define_help_flags()
    FLAGS = flags.FLAGS
    FLAGS.unparse_flags()
    rest = FLAGS(list(argv))
    if len(rest) > 1:
        raise ValueError(f"Unexpected arguments: {' '.join(rest[1:])}")
    values = {name: FLAGS[name].value for name in train_flags.BY_NAME}
    if values["mode"] == "eval":
        from keras_largebatch.train import evaluate

        given = {name for name in values if FLAGS[name].present}
        values = evaluate.run_values(values, given)
    return train_flags.config(values)


def place(config):
    """The `builders.Devices` of `--distribution`; the multi-worker
    strategy first, before any other TensorFlow op."""
    from keras_largebatch.train.builders import Devices

    if config.distribution == "multi_worker":
        _require_backend("tensorflow", "`distribution=multi_worker` needs "
                         "the TensorFlow backend (KERAS_BACKEND=tensorflow)")
        cluster = _tf_config()
        strategy = _multi_worker_strategy(config)
        task = cluster.get("task", {})
        index = task.get("index", 0)
        chief = task.get("type", "worker") == "chief" or (
            "chief" not in cluster.get("cluster", {}) and index == 0)
        workers = len(cluster.get("cluster", {}).get("worker", [])) or 1
        return Devices(strategy, strategy.num_replicas_in_sync, chief, index,
                       workers)
    strategy, replicas, chief, task = _distribution(config)
    if config.distribution != "data_parallel":
        return Devices(strategy, replicas, chief, task)
    import jax

    return Devices(strategy, replicas, chief, task, 1, jax.process_index(),
                   jax.process_count())


def prepare(config, devices):
    """Builds data, schedule, model and optimizer for the checked `config`
    on `devices`; checks what needs the data or the devices (no writes).
    Returns a `builders.Run`."""
    import keras

    from keras_largebatch.train import builders
    from keras_largebatch.train import data
    from keras_largebatch.train import outputs
    from keras_largebatch.train import recipe

    builders.check_devices(config, devices)
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        recipe.make_deterministic()
    precision = recipe.resolve_precision(config.precision)
    keras.mixed_precision.set_dtype_policy(precision)
    spec = data.load_for(config)
    recorded = dict(config.recorded(), image_size=spec.image_size,
                    num_classes=spec.num_classes)
    resuming = outputs.check_model_dir(config.model_dir, recorded)
    train_flags.check_after_resume(config)
    initial_epoch = resuming.finished_epochs if resuming else 0
    inputs = data.inputs(config, spec, devices, initial_epoch)
    schedule = builders.schedule(config, inputs.steps_per_epoch, resuming)
    with _scope(devices.strategy):
        model = builders.model(config, spec, schedule, devices.strategy)
    return builders.Run(config, devices, spec, inputs, schedule, model,
                        resuming, recorded, precision, initial_epoch)


def train(run, start):
    """Creates `model_dir`, fits (resuming), evaluates and writes outputs."""
    # TensorFlow workers other than the chief keep their own state apart;
    # JAX processes other than the chief save (a collective) into a scratch
    # folder, deleted at the end, and restore from the chief's backup.
    devices, model_dir = run.devices, run.config.model_dir
    peer = devices.process_count > 1 and not devices.chief
    out_dir = model_dir if devices.chief else (
        tempfile.mkdtemp(prefix=f"{PROG}-peer-") if peer
        else os.path.join(model_dir, f"worker_{devices.task}"))
    try:
        return _train(run, start, out_dir, peer)
    finally:
        if peer:
            shutil.rmtree(out_dir, ignore_errors=True)


def _train(run, start, out_dir, peer):
    from keras_largebatch.train import builders
    from keras_largebatch.train import outputs
    from keras_largebatch.train import report

    os.makedirs(os.path.join(out_dir, "checkpoints"), exist_ok=True)
    report.begin(run, out_dir)
    throughput = outputs.Throughput(run.inputs.step_batch)
    callbacks = builders.callbacks(run, throughput, out_dir, peer)
    with warnings.catch_warnings():
        # Keras' Grain adapter knows no length, so the end of each
        # validation pass reads as "input ran out of data".
        warnings.filterwarnings("ignore", "Your input ran out of data")
        history = run.model.fit(
            run.inputs.train, validation_data=run.inputs.validation,
            epochs=run.config.epochs,
            steps_per_epoch=run.inputs.steps_per_epoch, callbacks=callbacks,
            verbose=_verbose(run.config.verbose),
            shuffle=False,  # The pipelines shuffle.
        )
        val_metrics = run.model.evaluate(run.inputs.validation, verbose=0,
                                         return_dict=True)
    return report.finish(run, out_dir, history, val_metrics, throughput,
                         start)


def _verbose(verbose):
    """`--verbose`, or by default a progress bar on a terminal and one line
    per epoch otherwise (a log file gets no redrawn bars)."""
    if verbose is not None:
        return verbose
    return 1 if sys.stdout.isatty() else 2


def _distribution(config):
    """`none` or `data_parallel`: (None, replicas, is_chief, process
    index)."""
    import keras

    from keras_largebatch.train import processes

    if config.distribution == "none":
        return None, 1, True, 0
    _require_backend("jax", "`distribution=data_parallel` uses "
                     "keras.distribution, which needs the JAX backend")
    index, _ = processes.initialize(config.collective_timeout_seconds)
    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(
        devices=devices, auto_shard_dataset=False))
    return None, len(devices), index == 0, index


def _require_backend(name, what):
    """Raises `ValueError` (`what`, then the backend) unless the Keras
    backend is `name`; reads `KERAS_BACKEND` first, so that nothing
    TensorFlow is imported for a refusal."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend is None:
        import keras

        backend = keras.backend.backend()
    if backend != name:
        raise ValueError(f"{what}. Received: backend={backend}")


def _tf_config():
    """`TF_CONFIG` parsed ({} when unset); `ValueError` unless JSON."""
    raw = os.environ.get("TF_CONFIG")
    try:
        return json.loads(raw) if raw is not None else {}
    except json.JSONDecodeError:
        raise ValueError(
            "The TF_CONFIG environment variable must be JSON (or unset for "
            f"one worker). Received: TF_CONFIG={raw!r}") from None


def _multi_worker_strategy(config):
    """The config's `MultiWorkerMirroredStrategy`.

    `main` creates it first, after parsing and checking the flags and
    before any other TensorFlow op: TensorFlow configures collectives when
    its runtime starts, and the strategy waits there for every worker in
    `TF_CONFIG`.
    """
    import tensorflow as tf

    from keras_largebatch import distribute

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=config.collective_timeout_seconds or None)
    return distribute.MultiWorkerMirroredStrategy(
        communication_options=options,
        fusion_threshold_bytes=config.fusion_threshold_bytes,
        hierarchical_threshold_bytes=config.hierarchical_threshold_bytes,
        compression=config.compression,
        workers_per_node=config.workers_per_node or None,
        topk_density=config.topk_density,
    )


def _scope(strategy):
    return strategy.scope() if strategy is not None else (
        contextlib.nullcontext())


if __name__ == "__main__":
    run()
