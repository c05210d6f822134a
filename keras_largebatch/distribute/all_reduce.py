"""Fused all-reduce with a reducer per bucket, as TensorFlow cross-device ops.

Gradients arrive in the order of the variables; backward produces them in
reverse. They are packed, in reverse order, into buckets of at most
`fusion_threshold_bytes` (one dtype per bucket; a larger tensor travels
alone; see `buckets.assign_buckets`), so the first buckets can be reduced
while backward still runs. `FusedCollectiveAllReduce.reducer` then picks
how each bucket is reduced (the reducers are in `reducers` and `topk`):

```
if compress and config.topk and dtype != float64:
    sparse-flat on one node, sparse-hierarchical on several
elif spans_nodes and wire_bytes(bucket) < hierarchical_threshold_bytes:
    hierarchical          # intra-node, node leaders, intra-node broadcast
else:
    flat                  # ring / NCCL among everyone
```

Small buckets are latency-bound, and the hierarchy pays fewer latencies
than the flat ring; large buckets are bandwidth-bound, and the ring is
optimal. The costs of both, and the threshold where they cross, are
stated once, in `keras_largebatch.distribute.cost_model.alpha_beta`.

Every sub-group has its own collective group key, the same on all
workers; instance keys come from TensorFlow's `CollectiveReplicaLauncher`.
Every collective issued on a device (flat, intra-node, leaders', broadcast,
all-gather) has a control dependency on the one issued before it, so all
ranks launch them in one order, as NCCL requires.

`compress` is true for what replicas all-reduce with
`ReplicaContext.all_reduce` (the gradients of Keras' optimizers and of
`LARSMixed`): only there do fp16 transport (on tensors of rank >= 1; see
`wire_format`) and top-k apply. `strategy.reduce`, metrics and variable
aggregation (all through `reduce_to`) and scalars travel in full
precision.

References:
    - Jia et al., 2018, arXiv:1807.11205 (tensor fusion, hierarchical and
      hybrid all-reduce).
    - Sergeev & Del Balso, 2018, "Horovod", arXiv:1802.05799.
"""

import collections
import copy
import typing
import weakref

import tensorflow as tf

from keras_largebatch import _tf_internals
from keras_largebatch.distribute import compression as compression_lib
from keras_largebatch.distribute import native
from keras_largebatch.distribute import reducers
from keras_largebatch.distribute import sparse
from keras_largebatch.distribute.buckets import assign_buckets
from keras_largebatch.distribute.config import ReduceConfig
from keras_largebatch.distribute.topk import TopKReducer

_FUSABLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# Sub-group keys live far above the keys TensorFlow hands out (1, 2, ...).
SUBGROUP_KEY_START = 1 << 20


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


class _Chain:
    """The last collective issued on one device, per graph being built.

    NCCL needs every rank to launch the collectives of a group in one
    order. TensorFlow's launcher orders its all-reduces with an ordering
    token (automatic control dependencies chain the ops that use it);
    broadcasts take no token, and the hierarchy uses three groups. So every
    collective this module issues on a device gets a control dependency on
    the previous one: one program order, the same on every rank.
    """

    def __init__(self):
        self._last = weakref.WeakKeyDictionary()

    def issue(self, launch):
        if tf.executing_eagerly():
            return launch()
        graph = tf.compat.v1.get_default_graph()
        previous = self._last.get(graph)
        with tf.control_dependencies([] if previous is None else [previous]):
            result = launch()
        self._last[graph] = result.op
        return result


class BucketRecord(typing.NamedTuple):
    """One bucket as `FusedCollectiveAllReduce.bucket_log` records it."""

    tensors: int
    """How many tensors the bucket packs."""
    wire_bytes: int
    """Its size on the wire (after any fp16 cast)."""
    reducer: str
    """The `kind` of the reducer that took it: `"flat"`, `"hierarchical"`,
    `"sparse-flat"` or `"sparse-hierarchical"`."""


class FusedCollectiveAllReduce(_tf_internals.CollectiveAllReduce):
    """`CollectiveAllReduce` with fusion buckets and a reducer per bucket.

    Args:
        devices, group_size, options, collective_keys, canonicalize_devices:
            As TensorFlow's `CollectiveAllReduce` (the local devices, the
            number of devices in the job, `CommunicationOptions`, ...).
        task_id: this worker's id in the cluster (chief first).
        node_of_task: node index of every task (see `node_of_tasks`).
        key_base: offset of the sub-group keys (the strategy's collective
            key base).
        config: the `ReduceConfig` (`None`: its defaults). It is the one
            place these ops read their settings from; `config` is also
            assignable afterwards.
        residuals: the top-k `sparse.Residuals` to use (a copy shares them).

    Attributes:
        bucket_log: the last 1024 buckets built, a `BucketRecord` each
            (replica 0's: once per trace in a `tf.function`, every call
            when eager).
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
        key_base=0,
        config=None,
        residuals=None,
    ):
        config = ReduceConfig() if config is None else config
        if not isinstance(config, ReduceConfig):
            raise ValueError(
                "`config` must be a `ReduceConfig` or None. Received: "
                f"config={config!r}"
            )
        super().__init__(
            devices, group_size, options, collective_keys, canonicalize_devices
        )
        self._task_id = task_id
        self._node_of_task = tuple(node_of_task)
        self._key_base = key_base
        self._num_nodes = len(set(self._node_of_task))
        self.bucket_log = collections.deque(maxlen=1024)
        devices = self.devices
        chains = [_Chain() for _ in devices]
        self.launchers = [
            _tf_internals.Launcher(self.group_key, group_size,
                                   self.collective_keys, d, options, c.issue)
            for d, c in zip(devices, chains)
        ]
        node = self._node_of_task[task_id]
        tasks_in_node = [
            t for t, n in enumerate(self._node_of_task) if n == node
        ]
        self._node_group_size = len(tasks_in_node) * len(devices)
        start = SUBGROUP_KEY_START + key_base
        self._intra_launchers = [
            _tf_internals.Launcher.for_subgroup(
                start + 1 + node, self._node_group_size, d, devices, options,
                c.issue,
            )
            for d, c in zip(devices, chains)
        ]
        self._leader_launcher = None
        if task_id == tasks_in_node[0] and self._num_nodes > 1:
            self._leader_launcher = _tf_internals.Launcher.for_subgroup(
                start, self._num_nodes, devices[0], devices[:1], options,
                chains[0].issue,
            )
        self._flat = reducers.FlatReducer(self.launchers)
        leaders = None
        if self._leader_launcher is not None:
            leaders = reducers.FlatReducer([self._leader_launcher])
        self._hierarchical = self._hierarchy(leaders, "hierarchical")
        self._set_config(config, residuals)

    def _hierarchy(self, leaders, kind):
        return reducers.HierarchicalReducer(
            self._intra_launchers, self._node_group_size, leaders, kind
        )

    @property
    def config(self):
        """The `ReduceConfig` these ops use (the strategy's `get_config()`
        reads it). Assigning another applies it to the buckets built from
        then on (in a `tf.function`: at its next trace)."""
        return self._reduce_config

    @config.setter
    def config(self, config):
        if not isinstance(config, ReduceConfig):
            raise ValueError(
                "`config` must be a `ReduceConfig`. Received: "
                f"config={config!r}"
            )
        self._set_config(config, self.residuals)

    def _set_config(self, config, residuals):
        self._reduce_config = config
        self._compressor = compression_lib.get(config.compression)
        # Top-k on one node: every replica exchanges; on several, the node
        # leaders do, as the hierarchy's leaders' step.
        if self._num_nodes == 1:
            self.topk = TopKReducer(
                self.launchers, self.devices, self._task_id, config,
                residuals,
            )
            self._sparse = self.topk
        else:
            leader = self._leader_launcher
            self.topk = TopKReducer(
                [leader] if leader else [], self.devices[:1], self._task_id,
                config, residuals,
            )
            self._sparse = self._hierarchy(
                self.topk if leader else None, "sparse-hierarchical"
            )

    @property
    def residuals(self):
        """This worker's top-k residuals (`topk.residuals`)."""
        return self.topk.residuals

    @property
    def num_nodes(self):
        return self._num_nodes

    def uses_hierarchy(self, wire_bytes):
        """Whether a dense bucket of `wire_bytes` takes the hierarchical
        path."""
        return self._num_nodes > 1 and (
            wire_bytes < self._reduce_config.hierarchical_threshold_bytes
        )

    def reducer(self, dtype, wire_bytes, compress):
        """The reducer of a bucket: top-k for gradient buckets (`compress`)
        other than float64 under `compression="topk"`, else hierarchical or
        flat by `uses_hierarchy`."""
        if compress and self._reduce_config.topk and dtype != tf.float64:
            return self._sparse
        if self.uses_hierarchy(wire_bytes):
            return self._hierarchical
        return self._flat

    def reduce_replica(self, reduce_op, value, replica_id, options, compress):
        """Reduces replica `replica_id`'s nested `value`: float tensors of
        static shape through fusion buckets, others by TensorFlow."""
        flat = tf.nest.flatten(value)
        fused = [i for i, v in enumerate(flat) if _is_fusable(v)]
        other = [i for i, v in enumerate(flat) if not _is_fusable(v)]
        results = [None] * len(flat)
        if other:
            reduced = self.tf_all_reduce(
                reduce_op, [flat[i] for i in other], replica_id, options
            )
            for i, r in zip(other, reduced):
                results[i] = r
        if fused:
            reduced = self._fused_all_reduce(
                reduce_op, [flat[i] for i in fused], replica_id, options,
                compress,
            )
            for i, r in zip(fused, reduced):
                results[i] = r
        return tf.nest.pack_sequence_as(value, results)

    def _fused_all_reduce(
        self, reduce_op, values, replica_id, options, compress
    ):
        compressor = self._compressor if compress else None
        # Names the top-k residuals; no other reducer keeps state.
        signature = (
            sparse.signature(values)
            if compress and self._reduce_config.topk else None
        )
        formats = [
            wire_format(v.dtype, v.shape.rank, reduce_op, self.group_size,
                        compressor)
            for v in values
        ]
        buckets = assign_buckets(
            [v.shape.num_elements() * v.dtype.size for v in values],
            [(v.dtype,) + f for v, f in zip(values, formats)],
            self._reduce_config.fusion_threshold_bytes,
        )
        results = [None] * len(values)
        for indices in buckets:
            bucket = reducers.Bucket(
                [values[i] for i in indices], indices, signature
            )
            dtype = bucket.tensors[0].dtype
            wire, prescale, postscale = formats[indices[0]]
            with tf.device(self.devices[replica_id]):
                buffer = native.pack(bucket.tensors, dtype=wire,
                                     scale=prescale)
                wire_bytes = buffer.shape.num_elements() * wire.size
                reducer = self.reducer(dtype, wire_bytes, compress)
                if replica_id == 0:
                    self.bucket_log.append(
                        BucketRecord(len(indices), wire_bytes, reducer.kind)
                    )
                buffer = reducer.reduce(buffer, bucket, replica_id, options)
                outputs = native.unpack(
                    buffer, [t.shape for t in bucket.tensors], dtype,
                    scale=postscale,
                )
            for i, out in zip(indices, outputs):
                results[i] = out
        return results

    def __deepcopy__(self, memo):
        return FusedCollectiveAllReduce(
            self.devices,
            self.group_size,
            self.options,
            copy.deepcopy(self.collective_keys, memo),
            self.canonicalize_devices,
            task_id=self._task_id,
            node_of_task=self._node_of_task,
            key_base=self._key_base,
            config=self._reduce_config,
            residuals=self.residuals,
        )


def _is_fusable(value):
    return (
        isinstance(value, tf.Tensor)
        and value.dtype in _FUSABLE
        and value.shape.is_fully_defined()
    )


def wire_format(dtype, rank, reduce_op, group_size, compressor=None):
    """How a tensor travels: `(wire dtype, pre-scale, post-scale)`.

    Only tensors of rank >= 1 are compressed (scalars are flags, counts and
    losses). A sum is cast as it is: optimizers sum gradients that Keras
    has already divided by the number of replicas `n`, so the sum is no
    larger than the largest replica's undivided gradient, and under
    `LARSMixed` the values still carry the loss scale that keeps them in
    float16's normal range. A mean divides by `n` before a narrowing cast
    (it needs that division anyway; the sum of `n` values below float16's
    maximum then stays below it) and after a sum otherwise:

    ```python
    wire = compressor.wire_dtype(dtype) if compressed else dtype
    if mean and wire is narrower:  x = cast(wire, x / n); y = sum(x)
    elif mean:                     x = cast(wire, x);     y = sum(x) / n
    else:                          x = cast(wire, x);     y = sum(x)
    ```
    """
    dtype = tf.as_dtype(dtype)
    wire = dtype
    if compressor is not None and rank:
        wire = tf.as_dtype(compressor.wire_dtype(dtype))
    mean = reduce_op == tf.distribute.ReduceOp.MEAN
    if not mean:
        return wire, 1.0, 1.0
    if wire.size < dtype.size:
        return wire, 1.0 / group_size, 1.0
    return wire, 1.0, 1.0 / group_size

