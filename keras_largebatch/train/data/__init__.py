"""The data layer of `keras-largebatch-train`: data sets in, batches out.

    spec.py            `DataSpec` (what every loader returns), `DataError`
    registry.py        the data sets of `--dataset`: one entry each (loader,
                       own size, augmentation, pipelines, needs)
    formats.py         IDX files, image files, class folders (no TensorFlow)
    loaders.py         their loaders (TFRecords: imagenet.py)
    tf_pipeline.py     tf.data batches (every data set; needs TensorFlow)
    grain_pipeline.py  Grain batches (in-memory data, class folders; no
                       TensorFlow)

The command calls two functions: `load_for(data, network, seed)`, the
run's data set, checked, and `inputs(data, training, spec, devices, seed,
precise_bn_batches, initial_epoch)`, the factory that builds the pipeline
`--input_pipeline` resolves to, with the augmentation of `--augment` (one
stage table, `augment.STAGES`, in tf.data and in NumPy), and returns
`Inputs`: what `fit` reads and what precise BN reads. `data`, `network`
and `training` are those parts of `config.RunConfig`.
"""

import dataclasses
import functools
import math

from keras_largebatch._shared import require
from keras_largebatch.train.data import augment
from keras_largebatch.train.data import augment_numpy
from keras_largebatch.train.data import grain_pipeline
from keras_largebatch.train.data import registry
from keras_largebatch.train.data import tf_pipeline
from keras_largebatch.train.data.spec import require_tensorflow

# The layer's API, from its modules.
from keras_largebatch.train.data.formats import decode_image  # noqa: F401
from keras_largebatch.train.data.formats import read_idx  # noqa: F401
from keras_largebatch.train.data.loaders import (  # noqa: F401
    FASHION_MNIST_FILES, find_fashion_mnist, from_arrays,
    load_fashion_mnist_arrays, load_synthetic)
from keras_largebatch.train.data.registry import load  # noqa: F401
from keras_largebatch.train.data.spec import DataError  # noqa: F401
from keras_largebatch.train.data.spec import DataSpec  # noqa: F401
from keras_largebatch.train.data.spec import epoch_seed  # noqa: F401
from keras_largebatch.train.data.tf_pipeline import batch  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What `fit` and precise BN read.

    Attributes:
        train: the training batches of epochs `initial_epoch .. epochs - 1`.
        validation: the validation batches.
        steps_per_epoch: training steps (batches) per epoch.
        step_batch: images per step (the global batch over
            `--gradient_accumulation_steps`).
        pipeline: `tf_data` or `grain`, `--input_pipeline` resolved.
        precise_bn_batches: `epoch -> batches`, see `inputs`.
    """

    train: object
    validation: object
    steps_per_epoch: int
    step_batch: int
    pipeline: str
    precise_bn_batches: object


def load_for(data, network, seed):
    """The `DataSpec` of `data.dataset` at the input size of
    `network.model` (see `recipe.models.image_size_for`), split by `seed`; raises
    `DataError`."""
    from keras_largebatch.train.recipe import models  # Imports Keras.

    dataset = registry.get(data.dataset)
    size = models.image_size_for(network.model, dataset.native_size,
                                 data.image_size)
    return dataset.load(registry.Request(
        size, data.data_dir, data.num_classes, seed, data.check_images,
        models.input_channels(network.model),
        (data.num_train_examples, data.num_validation_examples),
        network.init_weights))


def inputs(data, training, spec, devices, seed, precise_bn_batches=0,
           initial_epoch=0, position=None):
    """The batches of `spec` for the run: `Inputs`.

    `data` gives the pipeline and augmentation, `training` the batch and
    the epochs, `devices` the replicas (several drop the remainder, so
    every batch is full) and this process's slice of each batch (several
    JAX processes). `Inputs.precise_bn_batches(epoch)` are
    `precise_bn_batches` training batches of `epoch`, augmented and
    normalized as in training, one batch-norm batch each (the step's
    batch, a micro-batch under accumulation), a function of `seed` and the
    epoch only (a resumed run recomputes the same statistics).

    Grain's training data is a `grain_pipeline.resumable`, whose position
    a checkpoint within an epoch saves (`--checkpoint_every_steps`, a
    signal); `position` (a `checkpointing.within_epoch.Position` within
    `initial_epoch`) starts it there: at Grain's saved iterator state, or for tf.data at
    the saved micro-batch.

    Refuses (`ValueError`) a global batch the replicas and
    `--gradient_accumulation_steps` cannot split, and precise BN over
    several processes.
    """
    dataset = registry.get(data.dataset)
    pipeline = dataset.pipeline_for(data.input_pipeline)
    policy = dataset.augment_for(data.augment)
    drop = devices.replicas > 1
    _check_batch(training, spec, devices, precise_bn_batches, drop)
    step_batch = (training.global_batch_size
                  // training.gradient_accumulation_steps)
    steps = training.steps_per_epoch or (
        spec.num_train // step_batch if drop
        else math.ceil(spec.num_train / step_batch))
    make_batches = _batch_maker(pipeline, policy, seed, spec, devices,
                                step_batch, drop)
    first = min(initial_epoch, training.epochs - 1)
    saved = position.data if position is not None else {}
    make_train = make_batches
    if pipeline == "grain" and saved:
        first = saved["start_epoch"]
    elif pipeline != "grain" and position is not None:
        make_train = functools.partial(
            make_batches, initial_step=position.micro_batches)
    train, validation = make_train(
        seed, steps_per_epoch=training.steps_per_epoch or None,
        epochs=training.epochs, initial_epoch=first)
    if pipeline == "grain":
        train = grain_pipeline.resumable(train, first,
                                         saved.get("grain_state"))

    def bn_batches(epoch):
        return make_batches(seed + 1, drop_remainder=True,
                            steps_per_epoch=precise_bn_batches,
                            epochs=epoch + 1, initial_epoch=epoch)[0]

    return Inputs(train, validation, steps, step_batch, pipeline,
                  bn_batches)


def resolve_input_pipeline(input_pipeline, dataset):
    """`--input_pipeline` resolved for the data set called `dataset`
    (`registry.Dataset.pipeline_for`)."""
    return registry.get(dataset).pipeline_for(input_pipeline)


def _batch_maker(pipeline, policy, seed, spec, devices, step_batch, drop):
    """`make(order_seed, **overrides) -> (train, validation)`: the batches
    of `pipeline`, augmented by `policy` with `seed`."""
    kwargs = dict(drop_remainder=drop, process_index=devices.process_index,
                  process_count=devices.process_count)
    if pipeline == "grain":
        augmenter = augment_numpy.build(policy, seed)
        batches = grain_pipeline.batch
    else:
        require_tensorflow("`input_pipeline=tf_data`")
        augmenter = augment.build(policy, spec.image_size, seed)
        batches = tf_pipeline.batch

    def make(order_seed, **overrides):
        return batches(spec, step_batch, augmenter, order_seed,
                       **dict(kwargs, **overrides))

    return make


def _check_batch(training, spec, devices, precise_bn_batches,
                 drop_remainder):
    """Refuses a global batch the replicas and the accumulation steps
    cannot split or the data cannot fill, and precise BN over several
    processes.

    The learning rate is scaled for `global_batch_size`, so a batch larger
    than the training set would train on smaller batches at a rate scaled
    for the larger one.
    """
    # Each process would set statistics of its own slice of the batches.
    require(precise_bn_batches == 0 or devices.process_count == 1,
            "precise_bn_batches", precise_bn_batches,
            "0 with several processes (each would set different "
            "statistics)")
    batch_size, replicas = training.global_batch_size, devices.replicas
    require(batch_size % replicas == 0, "global_batch_size", batch_size,
            f"divisible by the number of replicas ({replicas})")
    accumulation = training.gradient_accumulation_steps
    require(batch_size % (replicas * accumulation) == 0,
            "global_batch_size", batch_size,
            f"divisible by the replicas ({replicas}) times "
            f"--gradient_accumulation_steps ({accumulation})")
    if batch_size > spec.num_train:
        raise DataError(
            f"`global_batch_size` is larger than the {spec.num_train} "
            f"training images. Received: global_batch_size={batch_size}")
    val_batches = (spec.num_validation // batch_size if drop_remainder
                   else math.ceil(spec.num_validation / batch_size))
    if val_batches < 1:
        why = (" (batches are full: several replicas drop the remainder)"
               if drop_remainder else "")
        raise DataError(
            f"The validation set ({spec.num_validation} images) has no "
            f"batch of `global_batch_size`{why}. "
            f"Received: global_batch_size={batch_size}")
