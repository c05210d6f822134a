"""The lines a run prints before it trains: what it is about to do.

    keras-largebatch-train: alexnet_bn on digits: images 8x8x1 (to the
        model 67x67x3), 10 classes, 1437 training and 360 validation images
    keras-largebatch-train: batch 32 (32 per device), 45 steps an epoch,
        6 epochs: 270 steps
    keras-largebatch-train: backend jax, 1 process, 1 device (cpu),
        precision float32, optimizer lars_mixed at a peak learning rate of
        0.4 (warmup 1.2 epochs)

(one line each), on the chief only; a resumed run adds where it resumes.
"""

import keras

from keras_largebatch.train import PROG
from keras_largebatch.train.recipe import precision


def lines(run, network, data, optimization, training):
    """The banner of `run` (a `driver.Run`), given those parts of its
    `RunConfig`."""
    spec, devices = run.spec, run.devices
    size = spec.image_size
    raw = spec.raw
    own = (f"images {_shape(raw.shape)}" if raw is not None
           else "images")
    model = f"{size}x{size}x{spec.channels}"
    per_device = training.global_batch_size // devices.replicas
    accumulation = training.gradient_accumulation_steps
    micro = (f" in {accumulation} micro-batches of "
             f"{per_device // accumulation}" if accumulation > 1 else "")
    steps = run.inputs.steps_per_epoch
    total = steps * training.epochs
    schedule = run.schedule
    processes = _count(devices.process_count, "process", "processes")
    replicas = _count(devices.replicas, "device")
    return [
        f"{network.model} on {data.dataset}: {own} (to the "
        f"model {model}), {spec.num_classes} classes, {spec.num_train} "
        f"training and {spec.num_validation} validation images",
        f"batch {training.global_batch_size} ({per_device} per "
        f"device{micro}), {steps} steps an epoch, "
        f"{_count(training.epochs, 'epoch')}: {total} steps"
        + (f"; resuming after epoch {run.initial_epoch}"
           if run.resuming else ""),
        f"backend {keras.backend.backend()}, {processes}, {replicas} "
        f"({'gpu' if precision.has_gpu() else 'cpu'}), precision "
        f"{run.precision}, optimizer {optimization.optimizer} at a "
        f"peak learning rate of {schedule.peak:.4g} (warmup "
        f"{schedule.warmup_epochs:.3g} epochs)",
    ]


def show(run, network, data, optimization, training):
    """Prints `lines` on the chief."""
    if run.devices.chief:
        for line in lines(run, network, data, optimization, training):
            print(f"{PROG}: {line}", flush=True)


def _shape(shape):
    return "x".join("?" if d is None else str(d) for d in shape)


def _count(n, one, many=None):
    return f"{n} {one if n == 1 else (many or one + 's')}"
