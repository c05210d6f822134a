"""A drop-in `tf.distribute.MultiWorkerMirroredStrategy` with fused,
hierarchical, hybrid all-reduce, and Keras 3 `fit` on many workers."""

import tensorflow as tf
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.util import nest

from keras_largebatch._shared import check_int
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.distribute import FUSION_THRESHOLD_BYTES
from keras_largebatch.distribute import HIERARCHICAL_THRESHOLD_BYTES
from keras_largebatch.distribute import all_reduce
from keras_largebatch.distribute import compression as compression_lib
from keras_largebatch.distribute import sparse


@keras_largebatch_export("keras_largebatch.distribute.MultiWorkerMirroredStrategy")
class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """Synchronous multi-worker training with fused, hybrid all-reduce.

    Gradients are packed, last layer first, into buckets of at most
    `fusion_threshold_bytes` (tensor fusion); each bucket is all-reduced
    hierarchically (intra-node all-reduce, inter-node all-reduce among one
    leader per node, intra-node broadcast) when it is smaller than
    `hierarchical_threshold_bytes` and the job spans several nodes, and by
    TensorFlow's flat ring / NCCL collective otherwise:

    ```python
    for bucket in buckets(reversed(grads), fusion_threshold_bytes):
        x = pack(bucket, float16 if compression == "fp16" else dtype)
        if num_nodes > 1 and bytes(x) < hierarchical_threshold_bytes:
            x = node_all_reduce(x); x = leaders_all_reduce(x); x = node_bcast(x)
        else:
            x = all_reduce(x)
        bucket = unpack(x)                    # the sum, in the bucket's dtype
    ```

    Under `keras_largebatch.LARSMixed` the gradients are summed while
    still multiplied by the loss scale; every replica then unscales and
    checks the same sum (see `LARSMixed.all_reduce_scaled_gradients`).

    Use it like TensorFlow's: create it first thing in the program (before
    any other TensorFlow op), then build and compile the model in its
    `scope()` and call `fit`, `evaluate` or `predict`. Keras 3's trainers
    work with two and more workers: this class reduces nested structures
    leaf by leaf and reduces scalars across replicas when Keras asks for
    `axis=0` (keras-team/keras#20585, tensorflow/tensorflow#72388).

    The default `fusion_threshold_bytes` is 8 MiB (ResNet-50: 16 buckets).
    Buckets are issued one after another on a device (see ordering in
    `all_reduce`), so a bucket must be small enough for its ring to overlap
    with packing and unpacking its neighbours and with backward, and large
    enough that per-bucket latency stays small. Measured on localhost CPU
    workers (`bench/allreduce.py`), 4-8 MiB buckets are fastest and 64 MiB
    buckets take about twice as long; in the alpha-beta model 8 MiB costs
    little latency up to tens of GPUs, and at 1,024 GPUs (with
    `hierarchical_threshold_bytes` at the cost model's crossover) about
    1.7x the comm time of 64 MiB buckets (the command below prints 94.9 ms
    of hybrid all-reduce with `--fusion_threshold_bytes=8388608`, 54.8 ms
    with its default 64 MiB), most of it hidden behind backward.

    The default `hierarchical_threshold_bytes` is 4 MiB. The costs of the
    ring and of the hierarchy are stated once, in
    `keras_largebatch.distribute.cost_model.alpha_beta`; the best threshold
    is where they cross. For the cost model's default network (8 GPUs per
    node, intra-node 5 us and 10 GB/s, inter-node 10 us and 12.5 GB/s),
    `python -m keras_largebatch.distribute.cost_model --model=resnet50
    --gpus=64,1024` prints a crossover of 3,343,284 bytes (3.2 MiB) at 64
    GPUs and 57,550,639 bytes (54.9 MiB) at 1,024 GPUs: 4 MiB is right for
    tens of GPUs; for a given cluster, take the command's value.

    Args:
        cluster_resolver: As `tf.distribute.MultiWorkerMirroredStrategy`;
            `None` reads `TF_CONFIG`.
        communication_options: A
            `tf.distribute.experimental.CommunicationOptions`; its
            `timeout_seconds` bounds every collective (a dead peer then
            raises instead of hanging). Its `bytes_per_pack` is ignored.
        fusion_threshold_bytes: Int >= 0, bucket capacity. `0` reduces each
            tensor alone. Defaults to 8 MiB.
        hierarchical_threshold_bytes: Int >= 0; buckets smaller than this
            (in bytes on the wire) go hierarchical on multi-node jobs. `0`
            means never. Defaults to 4 MiB.
        compression: `None`, `"fp16"`, `"topk"` or a class of
            `keras_largebatch.distribute.Compression`. `"fp16"`: float32
            gradients travel as float16, cast as they are (see
            `compression`). `"topk"`: each worker sends the
            `topk_density` largest entries of each bucket (plus its
            residual) by all-gather, sparsified across nodes only on a
            multi-node job (see `sparse`). Metrics, `strategy.reduce` and
            scalars travel dense, in full precision.
        workers_per_node: Int >= 1 or `None`. Nodes are runs of this many
            consecutive tasks (chief first); `None` groups the tasks whose
            addresses share a host.
        topk_density: Float in (0, 1], under `compression="topk"`: the
            fraction of each bucket every worker sends (at least one value).
            Defaults to 0.01.
        topk_error_feedback: Bool, under `compression="topk"`: add what a
            worker did not send to its next step's gradients (residuals,
            see `topk_residuals`). Defaults to True.

    References:
        - Jia et al., 2018, "Highly Scalable Deep Learning Training System
          with Mixed-Precision: Training ImageNet in Four Minutes",
          arXiv:1807.11205.
        - Sergeev & Del Balso, 2018, "Horovod", arXiv:1802.05799.
    """

    def __init__(
        self,
        cluster_resolver=None,
        communication_options=None,
        *,
        fusion_threshold_bytes=FUSION_THRESHOLD_BYTES,
        hierarchical_threshold_bytes=HIERARCHICAL_THRESHOLD_BYTES,
        compression=None,
        workers_per_node=None,
        topk_density=0.01,
        topk_error_feedback=True,
    ):
        check_int("fusion_threshold_bytes", fusion_threshold_bytes, 0)
        check_int(
            "hierarchical_threshold_bytes", hierarchical_threshold_bytes, 0
        )
        if workers_per_node is not None:
            check_int("workers_per_node", workers_per_node, 1)
        compressor = compression_lib.get(compression)
        sparse.check_density(topk_density)
        super().__init__(cluster_resolver, communication_options)
        self._fusion_threshold_bytes = fusion_threshold_bytes
        self._hierarchical_threshold_bytes = hierarchical_threshold_bytes
        self._compression = compression_lib.serialize(compressor)
        self._workers_per_node = workers_per_node
        self._topk_density = topk_density
        self._topk_error_feedback = bool(topk_error_feedback)
        ext = self.extended
        old = ext._cross_device_ops
        nodes = all_reduce.node_of_tasks(ext._cluster_spec, workers_per_node)
        ext._cross_device_ops = all_reduce.FusedCollectiveAllReduce(
            devices=ext.worker_devices,
            group_size=old._group_size,
            options=ext._communication_options,
            collective_keys=ext._collective_keys,
            task_id=ext._id_in_cluster,
            node_of_task=nodes,
            fusion_threshold_bytes=fusion_threshold_bytes,
            hierarchical_threshold_bytes=hierarchical_threshold_bytes,
            compression=compressor,
            key_base=self._collective_key_base,
            topk_density=topk_density,
            topk_error_feedback=topk_error_feedback,
        )
        if getattr(ext, "_inferred_cross_device_ops", None) is old:
            ext._inferred_cross_device_ops = ext._cross_device_ops

    @property
    def cross_device_ops(self):
        """The `FusedCollectiveAllReduce` that reduces gradients."""
        return self.extended._cross_device_ops

    @property
    def topk_residuals(self):
        """This worker's error-feedback residuals under `compression="topk"`
        (a trackable; empty before the first step). Save and restore it per
        worker with `tf.train.Checkpoint(residuals=strategy.topk_residuals)`:
        a restore before the first step is applied as the residuals are
        created."""
        return self.cross_device_ops.residuals

    @property
    def num_nodes(self):
        return self.cross_device_ops.num_nodes

    def reduce(self, reduce_op, value, axis=None):
        """`tf.distribute.Strategy.reduce`, also for nested structures.

        Leaves are reduced one by one, and a scalar leaf with an `axis` is
        reduced across replicas only (it has no axis to reduce along). Keras
        3's trainers need both under a multi-worker job.
        """
        if nest.is_nested(value):
            return nest.map_structure(
                lambda v: self.reduce(reduce_op, v, axis), value
            )
        if axis is not None and _rank(value) == 0:
            axis = None
        return super().reduce(reduce_op, value, axis)

    def get_config(self):
        """The constructor's keyword arguments (not the cluster)."""
        return {
            "fusion_threshold_bytes": self._fusion_threshold_bytes,
            "hierarchical_threshold_bytes": self._hierarchical_threshold_bytes,
            "compression": self._compression,
            "workers_per_node": self._workers_per_node,
            "topk_density": self._topk_density,
            "topk_error_feedback": self._topk_error_feedback,
        }


def _rank(value):
    if isinstance(value, values_lib.DistributedValues):
        value = value.values[0]
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    return tf.TensorShape(shape).rank
