"""The tf.data pipeline: shuffled, augmented, normalized batches.

Every data set reads through it (TFRecords only through it); it needs
TensorFlow, on any backend. With `process_count > 1` (several JAX or torch
processes), process `p` keeps rows `[p * B / P, (p + 1) * B / P)` of every
global batch, after its augmentation: the processes' slices tile the batch
a single process would read. Each process still reads and decodes the
whole global batch; only the slice reaches the model.
"""

from keras_largebatch.train.data.spec import epoch_seed


def batch(spec, global_batch_size, augmenter=None, seed=0,
          drop_remainder=False, steps_per_epoch=None, epochs=1,
          initial_epoch=0, initial_step=0, process_index=0,
          process_count=1):
    """Shuffles, augments and batches; returns `(train_ds, val_ds)`.

    `train_ds` holds the batches of epochs `initial_epoch .. epochs - 1`,
    `steps_per_epoch` each (default: one pass over the data), and every
    random choice is a function of `(seed, epoch, step)` alone:

        order of pass p of epoch e:   shuffle(seed=epoch_seed(seed, e, p))
        augmentation of batch s of e: augmenter(x, seed=fold(seed, e, s))

    so a run resumed at epoch e reads exactly what an uninterrupted run
    reads there, whatever the thread scheduling and however often the
    dataset was iterated before (Keras peeks at a batch to build);
    `initial_step` batches of `initial_epoch` are left out, skipped before
    they are augmented (a run resumed within that epoch). With
    `steps_per_epoch` larger than a pass, passes follow each other, each
    shuffled anew. Data whose decoding is random (`spec.train_for_epoch`)
    is decoded with seeds of `(seed, epoch, pass, example)`. Every batch
    is then cut to this process's rows (`process_index` of
    `process_count`).
    """
    import tensorflow as tf

    per_process = global_batch_size // process_count
    lo = process_index * per_process
    rows = lambda x, y: (x[lo:lo + per_process], y[lo:lo + per_process])  # noqa: E731

    per_pass = (spec.num_train // global_batch_size if drop_remainder
                else -(-spec.num_train // global_batch_size))
    steps = steps_per_epoch or per_pass
    passes = -(-steps // max(per_pass, 1)) if steps_per_epoch else 1

    def epoch_batches(epoch):
        data = _shuffled_passes(spec, seed, epoch, passes)
        data = data.batch(global_batch_size, drop_remainder=drop_remainder)
        data = data.take(steps).enumerate()
        if epoch == initial_epoch and initial_step:
            data = data.skip(initial_step)
        if augmenter is None:
            data = data.map(lambda step, xy: xy)
        else:
            data = data.map(
                lambda step, xy: (augmenter(xy[0], seed=batch_seed(
                    seed, epoch, step)), xy[1]),
                num_parallel_calls=tf.data.AUTOTUNE)
        return data.map(rows) if process_count > 1 else data

    train = _concatenate([epoch_batches(e)
                          for e in range(initial_epoch, epochs)])
    val = spec.validation.batch(
        global_batch_size, drop_remainder=drop_remainder)
    if process_count > 1:
        val = val.map(rows)
    return _normalized(spec, train, val)


def _normalized(spec, train, val):
    """`(train, val)` normalized (`spec.normalize`, or [0, 1] to [-1, 1])
    and prefetched."""
    import tensorflow as tf

    scale = spec.normalize or (lambda x: (x - 0.5) * 2.0)
    normalize = lambda x, y: (scale(x), y)  # noqa: E731
    # For its default optimizations tf.data rewrites a pipeline by
    # serializing it, which copies an in-memory source once per epoch above
    # (188 MB an epoch of Fashion-MNIST: 18 GB for 96 epochs); the maps
    # here are parallel already, the order is unchanged.
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    train = train.map(
        normalize, num_parallel_calls=tf.data.AUTOTUNE
    ).prefetch(tf.data.AUTOTUNE).with_options(options)
    return train, val.map(normalize).prefetch(tf.data.AUTOTUNE)


def _shuffled_passes(spec, seed, epoch, passes):
    """The training examples of `epoch`: `passes` passes, each shuffled
    with its own seed."""
    buffer = min(spec.num_train, 10_000)
    return _concatenate([
        _source(spec, epoch, p).shuffle(
            buffer, seed=epoch_seed(seed, epoch, p),
            reshuffle_each_iteration=False)
        for p in range(passes)])


def _source(spec, epoch, data_pass):
    if spec.train_for_epoch is not None:
        return spec.train_for_epoch(epoch, data_pass)
    return spec.train


def batch_seed(seed, epoch, step):
    """The `[2]` stateless seed of batch `step` of `epoch`."""
    import tensorflow as tf

    fold = tf.random.experimental.stateless_fold_in
    base = tf.constant([seed, 0], "int64")
    return fold(fold(base, tf.cast(epoch, "int64")), tf.cast(step, "int64"))


def from_arrays(arrays, num_classes, size, channels):
    """The unbatched tf.data pipelines of in-memory `arrays` (a
    `DataSpec`'s), at `size` with `channels`."""
    import tensorflow as tf

    x_train, y_train, x_val, y_val = arrays

    def make(x, y):
        if x.shape[1:3] != (size, size):
            x = tf.image.resize(x, (size, size), "bilinear")
        if x.shape[-1] == 1 and channels == 3:
            x = tf.repeat(x, 3, axis=-1)
        labels = tf.one_hot(y, num_classes)
        return tf.data.Dataset.from_tensor_slices((x, labels))

    return make(x_train, y_train), make(x_val, y_val)


def _concatenate(datasets):
    out = datasets[0]
    for d in datasets[1:]:
        out = out.concatenate(d)
    return out
