"""Fused, hierarchical and hybrid all-reduce as TensorFlow cross-device ops.

Gradients arrive in the order of the variables; backward produces them in
reverse. They are packed, in reverse order, into buckets of at most
`fusion_threshold_bytes` (one dtype per bucket; a larger tensor travels
alone), so the first buckets can be reduced while backward still runs.
Each bucket is then all-reduced by one of two algorithms (hybrid):

```
if spans_nodes and bytes(bucket) < hierarchical_threshold_bytes:
    x = all_reduce(x, group=my_node)           # intra-node
    if node_leader:
        x = all_reduce(x, group=node_leaders)  # inter-node, 1 per node
    x = broadcast(x, source=node_leader, group=my_node)
else:
    x = all_reduce(x, group=everyone)          # flat ring / NCCL
```

Small buckets are latency-bound: a flat ring over `p` devices takes
`2 (p - 1)` steps, the hierarchy `2 (g - 1) + 2 (p / g - 1) + 1` for `g`
devices per node. Large buckets are bandwidth-bound and the ring is
optimal. Every sub-group has its own collective group key, the same on all
workers; instance keys come from TensorFlow's `CollectiveReplicaLauncher`.

References:
    - Jia et al., 2018, arXiv:1807.11205 (tensor fusion, hierarchical and
      hybrid all-reduce).
    - Sergeev & Del Balso, 2018, "Horovod", arXiv:1802.05799.
"""

import collections
import copy

from tensorflow.python.distribute import cross_device_ops
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.distribute import reduce_util
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor as tensor_lib
from tensorflow.python.ops import collective_ops
from tensorflow.python.util import nest

from keras_largebatch.distribute import compression as compression_lib
from keras_largebatch.distribute import native

_FUSABLE = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
# Sub-group keys live far above the keys TensorFlow hands out (1, 2, ...).
SUBGROUP_KEY_START = 1 << 20


def assign_buckets(sizes, dtypes_, threshold):
    """Packs tensors into fusion buckets, last tensor first.

    Args:
        sizes: bytes of each tensor, in variable (forward) order.
        dtypes_: dtype of each tensor (anything comparable).
        threshold: bucket capacity in bytes; `0` puts every tensor in a
            bucket of its own.

    Returns:
        A list of buckets, each a list of indices into `sizes`. Buckets are
        listed in the order they fill, which is backward's order; inside a
        bucket, indices run in reverse too. A bucket holds one dtype and at
        most `threshold` bytes, unless it is a single larger tensor.
    """
    buckets, open_bucket = [], {}
    for i in reversed(range(len(sizes))):
        key = dtypes_[i]
        current = open_bucket.get(key)
        if current is not None and current[1] + sizes[i] > threshold:
            current = None
        if current is None:
            current = [[], 0]
            open_bucket[key] = current
            buckets.append(current[0])
        current[0].append(i)
        current[1] += sizes[i]
    return buckets


def node_of_tasks(cluster_spec, workers_per_node=None):
    """The node index of every task, in collective (id-in-cluster) order.

    Tasks are the `chief` (if any) followed by the `worker`s. With
    `workers_per_node`, nodes are runs of that many consecutive tasks;
    otherwise tasks whose address has the same host form one node, numbered
    by first appearance.
    """
    spec = cluster_spec.as_dict() if cluster_spec else {}
    addresses = list(spec.get("chief", [])) + list(spec.get("worker", []))
    if isinstance(spec.get("worker"), dict):
        workers = spec["worker"]
        addresses = list(spec.get("chief", [])) + [
            workers[k] for k in sorted(workers)
        ]
    if not addresses:
        return [0]
    if workers_per_node:
        return [i // workers_per_node for i in range(len(addresses))]
    hosts = {}
    return [
        hosts.setdefault(a.rsplit(":", 1)[0], len(hosts)) for a in addresses
    ]


class _Launcher(cross_device_utils.CollectiveReplicaLauncher):
    """TensorFlow's launcher plus a broadcast within its group."""

    def broadcast(self, tensor, is_source, options=None):
        instance_key = self._next_instance_key()
        options = self._options.merge(options)
        with ops.device(self._device):
            if is_source:
                return collective_ops.broadcast_send_v2(
                    tensor, self._group_size, self._group_key, instance_key,
                    communication_hint=options.implementation.value,
                    timeout=options.timeout_seconds,
                )
            return collective_ops.broadcast_recv_v2(
                tensor.shape, tensor.dtype, self._group_size,
                self._group_key, instance_key,
                communication_hint=options.implementation.value,
                timeout=options.timeout_seconds,
            )


def _launcher(group_key, group_size, device, devices, options):
    keys = cross_device_utils.CollectiveKeys(group_key_start=group_key)
    keys.get_group_key(devices)
    return _Launcher(group_key, group_size, keys, device, options)


class FusedCollectiveAllReduce(cross_device_ops.CollectiveAllReduce):
    """`CollectiveAllReduce` with fusion buckets and a hybrid algorithm.

    Args:
        devices, group_size, options, collective_keys, canonicalize_devices:
            As `tf.distribute.CollectiveAllReduce` (the local devices, the
            number of devices in the job, `CommunicationOptions`, ...).
        task_id: this worker's id in the cluster (chief first).
        node_of_task: node index of every task (see `node_of_tasks`).
        fusion_threshold_bytes: bucket capacity.
        hierarchical_threshold_bytes: buckets (in wire bytes) below this go
            hierarchical when the job spans more than one node.
        compression: `None`, `"fp16"` or a `compression.Compressor`.
        key_base: offset of the sub-group keys (the strategy's
            `_collective_key_base`).
    """

    def __init__(
        self,
        devices,
        group_size,
        options,
        collective_keys=None,
        canonicalize_devices=True,
        *,
        task_id=0,
        node_of_task=(0,),
        fusion_threshold_bytes=64 * 2**20,
        hierarchical_threshold_bytes=0,
        compression=None,
        key_base=0,
    ):
        super().__init__(
            devices, group_size, options, collective_keys, canonicalize_devices
        )
        self._fusion_threshold_bytes = fusion_threshold_bytes
        self._hierarchical_threshold_bytes = hierarchical_threshold_bytes
        self._compression = compression
        self._compressor = compression_lib.get(compression)
        self._task_id = task_id
        self._node_of_task = tuple(node_of_task)
        self._key_base = key_base
        self._num_nodes = len(set(self._node_of_task))
        # (tensors, wire bytes, "hierarchical" | "flat") per bucket built:
        # once per trace in a tf.function, every call when eager.
        self.bucket_log = collections.deque(maxlen=1024)
        node = self._node_of_task[task_id]
        tasks_in_node = [
            t for t, n in enumerate(self._node_of_task) if n == node
        ]
        self._is_node_leader = task_id == tasks_in_node[0]
        self._node_group_size = len(tasks_in_node) * len(self._devices)
        start = SUBGROUP_KEY_START + key_base
        self._intra_launchers = [
            _launcher(start + 1 + node, self._node_group_size, d,
                      self._devices, options)
            for d in self._devices
        ]
        self._leader_launcher = None
        if self._is_node_leader and self._num_nodes > 1:
            self._leader_launcher = _launcher(
                start, self._num_nodes, self._devices[0], self._devices[:1],
                options,
            )

    @property
    def num_nodes(self):
        return self._num_nodes

    def uses_hierarchy(self, wire_bytes):
        """Whether a bucket of `wire_bytes` takes the hierarchical path."""
        return self._num_nodes > 1 and (
            wire_bytes < self._hierarchical_threshold_bytes
        )

    def _all_reduce(self, reduce_op, value, replica_id, options):
        flat = nest.flatten(value)
        fused = [i for i, v in enumerate(flat) if _is_fusable(v)]
        other = [i for i, v in enumerate(flat) if not _is_fusable(v)]
        results = [None] * len(flat)
        if other:
            reduced = super()._all_reduce(
                reduce_op, [flat[i] for i in other], replica_id, options
            )
            for i, r in zip(other, reduced):
                results[i] = r
        if fused:
            reduced = self._fused_all_reduce(
                reduce_op, [flat[i] for i in fused], replica_id, options
            )
            for i, r in zip(fused, reduced):
                results[i] = r
        return nest.pack_sequence_as(value, results)

    def _fused_all_reduce(self, reduce_op, values, replica_id, options):
        n = self._group_size
        mean = reduce_op == reduce_util.ReduceOp.MEAN
        buckets = assign_buckets(
            [v.shape.num_elements() * v.dtype.size for v in values],
            [v.dtype for v in values],
            self._fusion_threshold_bytes,
        )
        results = [None] * len(values)
        device = self._devices[replica_id]
        for bucket in buckets:
            tensors = [values[i] for i in bucket]
            dtype = tensors[0].dtype
            wire = self._compressor.wire_dtype(dtype)
            prescale = self._compressor.prescale(dtype, n)
            postscale = (1.0 / prescale) * (1.0 / n if mean else 1.0)
            with ops.device(device):
                buffer = native.pack(tensors, dtype=wire, scale=prescale)
                wire_bytes = buffer.shape.num_elements() * wire.size
                hierarchical = self.uses_hierarchy(wire_bytes)
                if replica_id == 0:
                    self.bucket_log.append((
                        len(tensors), wire_bytes,
                        "hierarchical" if hierarchical else "flat",
                    ))
                if hierarchical:
                    buffer = self._hierarchical(buffer, replica_id, options)
                else:
                    buffer = self._launchers[replica_id].all_reduce(
                        buffer, None, options
                    )
                outputs = native.unpack(
                    buffer, [t.shape for t in tensors], dtype, scale=postscale
                )
            for i, out in zip(bucket, outputs):
                results[i] = out
        return results

    def _hierarchical(self, buffer, replica_id, options):
        intra = self._intra_launchers[replica_id]
        if self._node_group_size > 1:
            buffer = intra.all_reduce(buffer, None, options)
        is_source = self._leader_launcher is not None and replica_id == 0
        if is_source:
            buffer = self._leader_launcher.all_reduce(buffer, None, options)
        if self._node_group_size > 1:
            buffer = intra.broadcast(buffer, is_source, options)
        return buffer

    def __deepcopy__(self, memo):
        return FusedCollectiveAllReduce(
            self._devices,
            self._group_size,
            self._options,
            copy.deepcopy(self._collective_keys, memo),
            self._canonicalize_devices,
            task_id=self._task_id,
            node_of_task=self._node_of_task,
            fusion_threshold_bytes=self._fusion_threshold_bytes,
            hierarchical_threshold_bytes=self._hierarchical_threshold_bytes,
            compression=self._compression,
            key_base=self._key_base,
        )


def _is_fusable(value):
    return (
        isinstance(value, tensor_lib.Tensor)
        and value.dtype in _FUSABLE
        and value.shape.is_fully_defined()
    )
