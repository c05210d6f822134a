"""`keras-largebatch-train`: the large-batch training job.

    keras-largebatch-train --model_dir /tmp/run1

trains AlexNet-BN (67x67) on the embedded digits with LARSMixed, warmup and
polynomial decay, shows Keras' progress bar (one line per epoch when stdout
is not a terminal) and writes `summary.json`,
`learning_curves.png` and checkpoints (see `outputs/`, `checkpointing/`).
Running it again with the same `--model_dir` resumes from the last
checkpoint that loads whole.

Every input is checked before anything is written; a bad one (unknown
model or data set, a global batch not divisible by the replicas, a missing
folder, a corrupt image, `--init_weights` of another architecture, a
damaged run_config.json, a disk too small for the first checkpoint, a
`--model_dir` another run holds: `checkpointing/lock.py`) ends the
command with a one-line error on stderr and exit code 2. Ctrl-C (SIGINT)
and SIGTERM save a checkpoint at the next step (every process of a job
at the same one) and end it with one line saying where it resumes, exit
code 130 or 143 (`interrupt.py`). A run
whose loss or weights turn non-finite stops there with one line (the
step, the rate, the loss scale, what to try) and exit code 3, its last
finite checkpoints kept (`divergence.py`). A lost worker ends it with
exit code 1, and so does a checkpoint that cannot be written (a full
disk: one line, the last complete checkpoint kept,
`checkpointing/files.py`).

This module is the driver: it has the command line parsed into one frozen
`config.RunConfig` (`config.load.parse_run`, the only reader of absl's
`FLAGS`, which reads the run recorded in `model_dir` once), places the
run on its devices (`placement.place`), assembles it (`prepare`, as Model
Garden's `train_lib` does: each part built once by its own room from the
config sections it reads), then fits (`train`) or evaluates
(`evaluate.py`). It is the one place that holds the whole config.
`cli.run` is the command's one door to it.

    precision.set_up(runtime)                         seeds, kernels, policy
    data.load_for(data, network, seed)                -> DataSpec
    checkpointing.check_model_dir(model_dir, ...)     -> Resume or None
    data.inputs(data, training, spec, devices, ...)   -> Inputs
    rates.plan(learning_rate, training, optimizer, steps, resuming)
                                                      -> Schedule
    models.build_network(network, spec)               -> keras.Model
    optimizers.compile_run(model, optimization, schedule, ...)
    callbacks.callbacks(runtime, adaptive, evaluation, inputs, ...)
                                                      -> fit's callbacks
"""

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time

import keras
from absl import flags

from keras_largebatch.train import PROG
from keras_largebatch.train import checkpointing
from keras_largebatch.train import data
from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import disk
from keras_largebatch.train.checkpointing import lock
from keras_largebatch.train.config import load
from keras_largebatch.train.config import rules
from keras_largebatch.train.config import table
from keras_largebatch.train.data import grain_pipeline
from keras_largebatch.train.outputs import report
from keras_largebatch.train.outputs.callbacks import Throughput
from keras_largebatch.train.recipe import models
from keras_largebatch.train.recipe import optimizers
from keras_largebatch.train.recipe import precision
from keras_largebatch.train.recipe import rates
from keras_largebatch.train.run import banner
from keras_largebatch.train.run import callbacks
from keras_largebatch.train.run import divergence
from keras_largebatch.train.run import evaluate
from keras_largebatch.train.run import interrupt
from keras_largebatch.train.run.placement import Devices
from keras_largebatch.train.run.placement import barrier
from keras_largebatch.train.run.placement import place
from keras_largebatch.train.run.processes import agreement
from keras_largebatch.train.run.processes import jax_cluster
from keras_largebatch.train.run.processes import supervisor


# A checkpoint could not be written (a full or failing disk): exit code.
SAVE_FAILED = 1


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything checked and built, nothing written yet (the settings
    stay in `config.RunConfig`, whose parts the driver hands out).

    Attributes:
        devices: `placement.Devices`.
        spec: the data set (`data.DataSpec`); `spec.image_size` is the
            input size.
        inputs: `data.Inputs`, the batches of `fit` and of precise BN.
        schedule: `recipe.rates.Schedule`.
        model: the compiled model (with its optimizer).
        resuming: `checkpointing.resume.Resume`, or None for a new run.
        recorded: what `run_config.json` holds (the recorded flags, the
            resolved image size and number of classes).
        precision: `--precision` resolved.
        initial_epoch: the epochs already finished in `model_dir`.
    """

    devices: Devices
    spec: object
    inputs: object
    schedule: object
    model: object
    resuming: object
    recorded: dict
    precision: str
    initial_epoch: int


def main(argv):
    """Parses `argv` (argv[0] is the program) and trains or evaluates;
    returns the exit code."""
    start = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        config, record = load.parse_run(argv)
    except (flags.Error, ValueError) as e:
        return fail(e)
    placement, runtime = config.placement, config.runtime
    if (placement.distribution == "data_parallel"
            and supervisor.SUPERVISED not in os.environ
            and jax_cluster.is_multi_process()):
        return supervisor.supervise(argv, runtime.model_dir,
                                   placement.collective_timeout_seconds)
    held = []  # The lock on model_dir, once taken.
    try:
        with interrupt.handled(runtime.model_dir):
            return _run(config, record, start, held)
    except KeyboardInterrupt:
        print(f"{PROG}: {interrupt.message(runtime.model_dir)}",
              file=sys.stderr)
        interrupt.close()
        return interrupt.exit_code()
    finally:
        for lock in held:  # A folder made for the lock alone goes too.
            lock.release(remove_if_empty=True)


def _run(config, record, start, held):
    """Places, locks `model_dir` (the chief of a training run, into
    `held`), prepares (resuming the run `record`ed there) and trains or
    evaluates; returns the exit code."""
    placement, runtime = config.placement, config.runtime
    try:
        devices = place(placement)
        if runtime.mode == "train" and devices.chief:
            held.append(lock.acquire(runtime.model_dir))
            if held[-1].unlocked:
                print(f"{PROG}: {held[-1].unlocked}", file=sys.stderr)
        built = prepare(config, devices, record)
        if runtime.mode == "eval":
            return evaluate.evaluate(
                built, runtime.model_dir, config.training.epochs,
                config.evaluation.precise_bn_batches)
        if devices.chief:
            disk.check_free_space(
                runtime.model_dir, disk.first_checkpoint_bytes(built.model),
                built.resuming is not None)
    except (ValueError, OSError) as e:
        return fail(e)
    banner.show(built, config.network, config.data, config.optimization,
                config.training)
    # What a lost worker raises out of `fit`: TensorFlow's `OpError` under
    # multi_worker; elsewhere nothing (JAX and torch runs import no TF).
    lost_worker = ()
    if placement.distribution == "multi_worker":
        import tensorflow as tf

        lost_worker = tf.errors.OpError
    try:
        return train(config, built, start)
    except lost_worker as e:
        lost = supervisor.lost_worker_message(e, devices.workers, devices.task)
        print(f"{PROG}: error: {lost} "
              f"To resume, start all {devices.workers} workers again with "
              f"the same command: they continue from the last finished "
              f"epoch in {runtime.model_dir}.", file=sys.stderr)
        return 1


def fail(error, code=2):
    message = " ".join(str(error).split())
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def prepare(config, devices, record):
    """Builds data, schedule, model and optimizer for the checked `config`
    (a `config.RunConfig`) on `devices`, each part once, by its own room,
    from the config sections it reads; checks what needs the data or the
    devices, and `config` against the run `record`ed in `model_dir`
    (`load.parse_run`'s; no writes). Returns a `Run`."""
    runtime, training = config.runtime, config.training
    resolved = precision.set_up(runtime)
    spec = data.load_for(config.data, config.network, runtime.seed)
    recorded = dict(config.recorded(), image_size=spec.image_size,
                    num_classes=spec.num_classes)
    resuming = checkpointing.check_model_dir(
        runtime.model_dir, recorded, record,
        may_differ=table.FREE + table.RAISABLE,
        train=runtime.mode == "train")
    if resuming is not None and resuming.skipped:
        print(f"{PROG}: {resuming.skipped}")
    # Every process has read `model_dir` before the chief writes there.
    barrier(keras.backend.backend(), devices.process_count)
    rules.check_after_resume(config)
    initial_epoch = resuming.finished_epochs if resuming else 0
    inputs = data.inputs(config.data, training, spec, devices, runtime.seed,
                         config.evaluation.precise_bn_batches, initial_epoch,
                         resuming.within_epoch if resuming else None)
    schedule = rates.plan(config.learning_rate, training,
                          config.optimization.optimizer,
                          inputs.steps_per_epoch, resuming)
    with _scope(devices.strategy):
        model = models.build_network(config.network, spec)
        optimizers.compile_run(
            model, config.optimization, schedule,
            training.gradient_accumulation_steps,
            top5=spec.num_classes > 10,
            noise_scale=config.adaptive.gradient_noise_scale,
            strategy=devices.strategy)
    return Run(devices, spec, inputs, schedule, model, resuming, recorded,
               resolved, initial_epoch)


def train(config, run, start):
    """Creates `model_dir`, fits `run` (resuming), evaluates and writes
    outputs; returns the exit code (`divergence.EXIT_CODE` where the
    weights turned non-finite)."""
    # TensorFlow workers other than the chief keep their own state apart;
    # JAX processes other than the chief save (a collective) into a scratch
    # folder, deleted at the end, and restore from the chief's backup.
    devices, model_dir = run.devices, config.runtime.model_dir
    peer = devices.process_count > 1 and not devices.chief
    out_dir = model_dir if devices.chief else (
        tempfile.mkdtemp(prefix=f"{PROG}-peer-") if peer
        else os.path.join(model_dir, layout.WORKER.format(devices.task)))
    try:
        return _train(config, run, start, out_dir, peer)
    except divergence.Diverged as e:
        return fail(e, divergence.EXIT_CODE)
    except checkpointing.SaveError as e:  # The last checkpoint is whole.
        return fail(e, SAVE_FAILED)
    except OSError as e:
        if not checkpointing.files.full(e):
            raise
        return fail(f"could not write in {out_dir} ({e})", SAVE_FAILED)
    finally:
        if peer:
            shutil.rmtree(out_dir, ignore_errors=True)


def _train(config, run, start, out_dir, peer):
    os.makedirs(os.path.join(out_dir, layout.CHECKPOINTS), exist_ok=True)
    checkpointing.tidy(out_dir, run.initial_epoch if run.resuming else None)
    report.begin(run, out_dir)
    throughput = Throughput(run.inputs.step_batch)
    found = callbacks.callbacks(
        config.runtime, config.adaptive, config.evaluation, run.inputs,
        throughput, out_dir,
        gradient_accumulation_steps=(
            config.training.gradient_accumulation_steps),
        compression=config.placement.compression,
        strategy=run.devices.strategy, peer=peer,
        start=run.resuming.start if run.resuming else None,
        agreement=agreement.for_devices(run.devices))
    # --verbose, or a progress bar on a terminal and one line per epoch
    # otherwise (a log file gets no redrawn bars).
    verbose = config.runtime.verbose
    if verbose is None:
        verbose = 1 if sys.stdout.isatty() else 2
    with grain_pipeline.no_end_of_input_warning():
        history = run.model.fit(
            run.inputs.train, validation_data=run.inputs.validation,
            epochs=config.training.epochs,
            steps_per_epoch=run.inputs.steps_per_epoch, callbacks=found,
            verbose=verbose,
            shuffle=False,  # The pipelines shuffle.
        )
        val_metrics = run.model.evaluate(run.inputs.validation, verbose=0,
                                         return_dict=True)
    return report.finish(config, run, out_dir, history, val_metrics,
                         throughput, start)


def _scope(strategy):
    return strategy.scope() if strategy is not None else (
        contextlib.nullcontext())

