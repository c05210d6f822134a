"""The top-k sparsified reduction of a bucket, with its residuals.

`TopKReducer` is a reducer (see `reducers`): on one node every replica
runs the exchange; on several nodes it is the node leaders' step of the
hierarchy (dense inside each node). The exchange (error feedback,
selection, one all-gather of (value, index) pairs, the sparse sum) is
stated in `sparse`, which holds its maths. The reducer owns this worker's
residuals (`sparse.Residuals`), created on first use on the replicas that
exchange, and their checkpoints (`checkpoint_callback`).

References:
    - Shi, Zhou, Song et al., 2020, arXiv:2010.10458.
"""

import os
import shutil

import tensorflow as tf

from keras_largebatch._shared import atomic_write
from keras_largebatch.distribute import native
from keras_largebatch.distribute import sparse


class TopKReducer:
    """The sparse exchange of a bucket among the replicas of `launchers`.

    Args:
        launchers: one launcher per replica that exchanges (all local
            replicas on one node; the leader's launcher of the leaders'
            group on several nodes; none on other replicas).
        devices: the device of each of those replicas.
        task_id: this worker's rank (names its checkpoint folder).
        config: the `ReduceConfig` (`topk_density`, `topk_error_feedback`,
            `topk_exact_max_elements`).
        residuals: the `sparse.Residuals` to keep (a copy of the
            cross-device ops shares them); new ones by default.
    """

    kind = "sparse-flat"

    def __init__(self, launchers, devices, task_id, config, residuals=None):
        self._replica_launchers = launchers
        self._replica_devices = devices
        self._task_id = task_id
        self._config = config
        self.residuals = sparse.Residuals() if residuals is None else residuals

    def reduce(self, buffer, bucket, replica_id, options):
        size = buffer.shape.num_elements()
        k = sparse.num_selected(size, self._config.topk_density)
        residuals = self._residuals(bucket, replica_id)
        acc = buffer
        if residuals:
            acc = buffer + native.pack(
                [r.read_value() for r in residuals], dtype=buffer.dtype
            )
        values, indices, remainder = sparse.sparsify(
            acc, k, self._config.topk_exact_max_elements
        )
        gathered = self._replica_launchers[replica_id].gather(
            sparse.encode(values, indices), options
        )
        result = sparse.decode_sum(gathered, k, size, buffer.dtype)
        if not residuals:
            return result
        parts = native.unpack(
            remainder, [r.shape for r in residuals],
            [r.dtype for r in residuals],
        )
        updates = [r.assign(part) for r, part in zip(residuals, parts)]
        with tf.control_dependencies(updates):
            return tf.identity(result)

    def _residuals(self, bucket, replica_id):
        if not self._config.topk_error_feedback:
            return []
        return [
            self.residuals.get(self._replica_devices[replica_id], replica_id,
                               bucket.signature, i, tensor)
            for i, tensor in zip(bucket.indices, bucket.tensors)
        ]

    def checkpoint_callback(self, directory, within=None):
        """A Keras callback that keeps this worker's residuals across
        restarts.

        At the end of every epoch it writes them to
        `directory/worker_<task>/epoch_<n>/` and then names that folder in
        `directory/worker_<task>/latest` (an atomic write; the previous
        folder is then deleted), so a crash never leaves a half-written
        checkpoint named. At the start of `fit` it restores the latest one
        when there is one (applied as the residuals are created, on the
        first step), or the folder `within` where that names one.
        Pair it with `keras.callbacks.BackupAndRestore`, which resumes
        from the last finished epoch: the residuals then match the weights.

        Within an epoch, `save_within(name)` writes them to
        `directory/worker_<task>/<name>/` (names the caller gives a
        checkpoint within an epoch); the two newest of those are kept,
        for the checkpoint that names one may still be the older, and
        all are deleted when `fit` ends.
        """
        import keras

        folder = os.path.join(directory, f"worker_{self._task_id}")
        pointer = os.path.join(folder, "latest")
        residuals = self.residuals
        saved = []  # The folders `save_within` wrote, oldest first.

        class ResidualCheckpoint(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.checkpoint = tf.train.Checkpoint(residuals=residuals)
                self.status = None

            def on_train_begin(self, logs=None):
                name = within
                if name is None and os.path.exists(pointer):
                    with open(pointer) as f:
                        name = f.read().strip()
                if name is not None:
                    self.status = self.checkpoint.read(
                        os.path.join(folder, name, "residuals")
                    )

            def save_within(self, name):
                os.makedirs(os.path.join(folder, name), exist_ok=True)
                self.checkpoint.write(os.path.join(folder, name, "residuals"))
                saved.append(name)
                for old in saved[:-2]:
                    shutil.rmtree(os.path.join(folder, old),
                                  ignore_errors=True)
                del saved[:-2]

            def on_epoch_end(self, epoch, logs=None):
                name = f"epoch_{epoch + 1:03d}"
                os.makedirs(os.path.join(folder, name), exist_ok=True)
                self.checkpoint.write(os.path.join(folder, name, "residuals"))
                old = None
                if os.path.exists(pointer):
                    with open(pointer) as f:
                        old = f.read().strip()
                atomic_write(pointer, name)
                if old and old != name:
                    shutil.rmtree(os.path.join(folder, old),
                                  ignore_errors=True)

            def on_train_end(self, logs=None):
                for old in saved + ([within] if within else []):
                    shutil.rmtree(os.path.join(folder, old),
                                  ignore_errors=True)
                saved.clear()

        return ResidualCheckpoint()
