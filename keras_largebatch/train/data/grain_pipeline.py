"""The Grain pipeline, without TensorFlow: datasets of whole batches.

`batch` returns Grain datasets that Keras' `fit` reads on every backend.
Element `i` of the training dataset is batch `step = i % steps` of epoch
`epoch = i // steps` (from `initial_epoch` on), computed from nothing but
`(seed, epoch, step)`:

    order of pass p of epoch e:   default_rng(epoch_seed(seed, e, p)).permutation
    batch s of epoch e:           positions [s * B, (s + 1) * B) of e's passes
    augmentation of batch s:      NumpyAugmenter(seed)(x, e, s)

so a run resumed at epoch e reads what an uninterrupted run reads there,
whatever Grain's reading threads do and however often Keras peeks. With
`process_count > 1` (several JAX processes), process `p` yields rows
`[p * B / P, (p + 1) * B / P)` of every global batch: the processes' slices
tile the batch with no overlap, and the global batch is the one a single
process would read.
"""

import collections
import contextlib
import functools
import logging
import warnings

import numpy as np

from keras_largebatch.train.data import augment_numpy
from keras_largebatch.train.data.formats import decode_image
from keras_largebatch.train.data.spec import epoch_seed

READ_THREADS = 4
PREFETCH_BATCHES = 4


def batch(spec, global_batch_size, augmenter=None, seed=0,
          drop_remainder=False, steps_per_epoch=None, epochs=1,
          initial_epoch=0, process_index=0, process_count=1):
    """Returns `(train, validation)` Grain `IterDataset`s of batches.

    Args:
        spec: a `DataSpec` with `arrays` or `files`.
        global_batch_size: images per step over all processes.
        augmenter: a `augment_numpy.NumpyAugmenter`, or None.
        seed, drop_remainder, steps_per_epoch, epochs, initial_epoch: as
            `tf_pipeline.batch`.
        process_index, process_count: this process's slice of each batch.
    """
    grain = _grain()

    if spec.arrays is None and spec.files is None:
        raise ValueError(
            f"The Grain pipeline reads in-memory data sets and class "
            f"folders; `{spec.name}` needs TensorFlow "
            f"(--input_pipeline=tf_data). Received: dataset={spec.name!r}")
    per_process = global_batch_size // process_count
    rows = slice(process_index * per_process,
                 (process_index + 1) * per_process)
    n = spec.num_train
    per_pass = (n // global_batch_size if drop_remainder
                else -(-n // global_batch_size))
    steps = steps_per_epoch or per_pass
    passes = -(-steps * global_batch_size // n) if steps_per_epoch else 1
    read_train, read_val = _readers(spec)
    scale = spec.normalize or (lambda x: (x - 0.5) * 2.0)

    def train_batch(index):
        epoch, step = divmod(index, steps)
        start = step * global_batch_size
        stop = min(start + global_batch_size, passes * n)
        positions = np.arange(start, stop)[rows]
        x, y = read_train(_order(n, seed, epoch, passes)[positions])
        if augmenter is not None:
            x = augmenter(x, epoch, step,
                          slice(rows.start, rows.start + len(positions)))
        return scale(x), y

    def val_batch(index):
        start = index * global_batch_size
        positions = np.arange(start, min(start + global_batch_size,
                                         spec.num_validation))
        x, y = read_val(positions[rows])
        return scale(x), y

    val_batches = (spec.num_validation // global_batch_size if drop_remainder
                   else -(-spec.num_validation // global_batch_size))
    options = grain.ReadOptions(num_threads=READ_THREADS,
                                prefetch_buffer_size=PREFETCH_BATCHES)
    train = grain.MapDataset.range(initial_epoch * steps, epochs * steps)
    val = grain.MapDataset.range(val_batches)
    return (train.map(train_batch).to_iter_dataset(options),
            val.map(val_batch).to_iter_dataset(options))


@functools.lru_cache(maxsize=4)
def _order(n, seed, epoch, passes):
    """The example order of `epoch`: its passes' permutations, in turn
    (computed once per epoch, not per batch)."""
    return np.concatenate([
        np.random.default_rng(epoch_seed(seed, epoch, p)).permutation(n)
        for p in range(passes)])


def _readers(spec):
    """`(read_train, read_val)`: example indices -> (images, one-hot)."""
    eye = np.eye(spec.num_classes, dtype="float32")
    size, channels = spec.image_size, spec.channels
    if spec.arrays is not None:
        x_train, y_train, x_val, y_val = spec.arrays

        def reader(x, y):
            return lambda idx: (augment_numpy.resize(x[idx], size, channels),
                                eye[y[idx]])
    else:
        x_train, y_train, x_val, y_val = spec.files

        def reader(paths, y):
            return lambda idx: (
                np.stack([decode_image(paths[i], size) for i in idx]),
                eye[y[idx]])
    return reader(x_train, y_train), reader(x_val, y_val)


def resumable(train, start_epoch, state=None):
    """`train` (from `batch`, its epochs from `start_epoch`) whose
    iterators start at Grain's iterator `state` (None: at its start).

    Keras peeks with iterators of its own and may read a batch ahead of
    the step it trains (on a GPU), so each iterator keeps Grain's state
    after each batch it yields; `state_at(n)` is the state after the
    first `n` batches of the last one, the position to save.
    """
    grain = _grain()

    class Recording(grain.DatasetIterator):
        def __init__(self, parent, states):
            super().__init__(parent)
            self._states, self._count = states, 0
            states[0] = parent.get_state()

        def __next__(self):
            value = next(self._parent)
            self._count += 1
            self._states[self._count] = self._parent.get_state()
            if len(self._states) > 64:
                self._states.popitem(last=False)
            return value

        def get_state(self):
            return self._parent.get_state()

        def set_state(self, new_state):
            self._parent.set_state(new_state)

    class Resumable(grain.IterDataset):
        def __init__(self):
            super().__init__(train)
            self.start_epoch = start_epoch
            self._states = collections.OrderedDict()

        def __iter__(self):
            iterator = self._parent.__iter__()
            if state is not None:
                iterator.set_state(state)
            self._states = collections.OrderedDict()
            return Recording(iterator, self._states)

        def state_at(self, consumed):
            return self._states[consumed]

    return Resumable()


def _grain():
    """`grain`, imported without the warning it logs where JAX is not
    installed (a torch-only install), "Failed to load jax profiler", at
    every start of the command: its profiler is then a no-op, all that a
    run without JAX needs."""
    absl = logging.getLogger("absl")

    def no_jax_profiler(record):
        return "Failed to load jax profiler" not in record.getMessage()

    absl.addFilter(no_jax_profiler)
    try:
        import grain
    finally:
        absl.removeFilter(no_jax_profiler)
    return grain


@contextlib.contextmanager
def no_end_of_input_warning():
    """Silences Keras' "Your input ran out of data" warning: its Grain
    adapter knows no length, so the end of every validation pass reads as
    running out."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Your input ran out of data")
        yield
