"""A drop-in `tf.distribute.MultiWorkerMirroredStrategy` with fused,
hierarchical, hybrid all-reduce, and Keras 3 `fit` on many workers."""

import tensorflow as tf

from keras_largebatch import _tf_internals
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.distribute import all_reduce
from keras_largebatch.distribute.config import ReduceConfig


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

    In a `tf.function` (Keras' `fit`) it reduces without `merge_call`, as
    TensorFlow's strategies do under XLA on GPUs: every replica all-reduces
    its gradients through these cross-device ops itself, and Keras'
    optimizers update variables in the replica context. So a `cond` may
    reduce in a branch: Keras' `gradient_accumulation_steps` works under
    it (TensorFlow's own strategy refuses the `merge_call` in the update
    branch). Keras' optimizers sum the gradients once per update, in that
    branch; `LARSMixed` and `LAMBMixed` every micro-batch, before their
    finiteness check.

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
    enough that per-bucket latency stays small.

    The default `hierarchical_threshold_bytes` is 4 MiB. The costs of the
    ring and of the hierarchy are stated once, in
    `keras_largebatch.distribute.cost_model.alpha_beta`; the best threshold
    is where they cross, and `python -m keras_largebatch.distribute.cost_model
    --model=resnet50 --gpus=64,1024` prints it for a given network. The
    measurements and the cost model's numbers behind both defaults are in
    docs/benchmarks.md (measured numbers are kept there, with their machine
    and date, and nowhere else).

    The settings are held by one `config.ReduceConfig`, which the
    cross-device ops read them from (`cross_device_ops.config`; assigning
    another there changes them, and `get_config()` reports what they use).
    Each bucket is reduced by one reducer
    (`reducers.FlatReducer`, `reducers.HierarchicalReducer`,
    `topk.TopKReducer`); see docs/distributed.md.

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
        fusion_threshold_bytes=ReduceConfig.fusion_threshold_bytes,
        hierarchical_threshold_bytes=ReduceConfig.hierarchical_threshold_bytes,
        compression=ReduceConfig.compression,
        workers_per_node=ReduceConfig.workers_per_node,
        topk_density=ReduceConfig.topk_density,
        topk_error_feedback=ReduceConfig.topk_error_feedback,
    ):
        config = ReduceConfig(
            fusion_threshold_bytes=fusion_threshold_bytes,
            hierarchical_threshold_bytes=hierarchical_threshold_bytes,
            compression=compression,
            workers_per_node=workers_per_node,
            topk_density=topk_density,
            topk_error_feedback=topk_error_feedback,
        )
        super().__init__(cluster_resolver, communication_options)
        nodes = all_reduce.node_of_tasks(
            _tf_internals.cluster_spec(self), config.workers_per_node
        )

        def build(group_size, options, collective_keys):
            return all_reduce.FusedCollectiveAllReduce(
                self.extended.worker_devices, group_size, options,
                collective_keys, task_id=_tf_internals.task_id(self),
                node_of_task=nodes,
                key_base=_tf_internals.collective_key_base(self),
                config=config,
            )

        _tf_internals.replace_cross_device_ops(self, build)
        _tf_internals.reduce_without_merge_call(self)

    @property
    def cross_device_ops(self):
        """The `FusedCollectiveAllReduce` that reduces gradients."""
        return _tf_internals.cross_device_ops(self)

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
        if tf.nest.is_nested(value):
            return tf.nest.map_structure(
                lambda v: self.reduce(reduce_op, v, axis), value
            )
        if axis is not None and _rank(value) == 0:
            axis = None
        return super().reduce(reduce_op, value, axis)

    def get_config(self):
        """The constructor's keyword arguments (not the cluster), as the
        cross-device ops use them now."""
        return self.cross_device_ops.config.get_config()


def _rank(value):
    if isinstance(value, tf.distribute.DistributedValues):
        value = value.values[0]
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    return tf.TensorShape(shape).rank
