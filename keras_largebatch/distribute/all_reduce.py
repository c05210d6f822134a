"""Fused, hierarchical and hybrid all-reduce as TensorFlow cross-device ops.

Gradients arrive in the order of the variables; backward produces them in
reverse. They are packed, in reverse order, into buckets of at most
`fusion_threshold_bytes` (one dtype per bucket; a larger tensor travels
alone; see `buckets.assign_buckets`), so the first buckets can be reduced while backward still runs.
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

Small buckets are latency-bound, and the hierarchy pays fewer latencies
than the flat ring; large buckets are bandwidth-bound, and the ring is
optimal. The costs of both, and the threshold where they cross, are
stated once, in `keras_largebatch.distribute.cost_model.alpha_beta`.

Every sub-group has its own collective group key, the same on all
workers; instance keys come from TensorFlow's `CollectiveReplicaLauncher`.
Every collective issued on a device (flat, intra-node, leaders', broadcast)
has a control dependency on the one issued before it, so all ranks launch
them in one order, as NCCL requires.

Top-k compression (`compression="topk"`) replaces each float bucket's
all-reduce by a sparse one (`sparse.py`): every peer sends its
`topk_density` largest entries (plus its residual, with error feedback)
to all others with one all-gather. On several nodes the sparse exchange
runs among node leaders only, between a dense intra-node all-reduce and
an intra-node broadcast (the paper's hierarchy); on one node, among all
replicas. Float64 buckets stay dense.

Compression (`compression="fp16"`) applies to what replicas all-reduce
with `ReplicaContext.all_reduce` (the gradients of Keras' optimizers and
of `LARSMixed`), and only to tensors of rank >= 1. `strategy.reduce`,
metrics, variable aggregation (all through `reduce_to`) and scalars travel
in full precision. See `wire_format` for the arithmetic.

References:
    - Jia et al., 2018, arXiv:1807.11205 (tensor fusion, hierarchical and
      hybrid all-reduce).
    - Sergeev & Del Balso, 2018, "Horovod", arXiv:1802.05799.
"""

import collections
import copy
import functools
import multiprocessing.pool
import weakref

from tensorflow.python.distribute import cross_device_ops
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as value_lib
from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor as tensor_lib
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import collective_ops
from tensorflow.python.util import nest

from keras_largebatch._shared import check_int
from keras_largebatch.distribute import compression as compression_lib
from keras_largebatch.distribute import native
from keras_largebatch.distribute import sparse
from keras_largebatch.distribute.buckets import assign_buckets

_FUSABLE = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
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
        if context.executing_eagerly():
            return launch()
        graph = ops.get_default_graph()
        previous = self._last.get(graph)
        with ops.control_dependencies([] if previous is None else [previous]):
            result = launch()
        self._last[graph] = result.op
        return result


class _Launcher(cross_device_utils.CollectiveReplicaLauncher):
    """TensorFlow's launcher plus a broadcast, chained on its device."""

    def __init__(self, group_key, group_size, keys, device, options, chain):
        super().__init__(group_key, group_size, keys, device, options)
        self._chain = chain

    def all_reduce(self, input_tensor, control_input=None, options=None):
        parent = super().all_reduce
        return self._chain.issue(
            lambda: parent(input_tensor, control_input, options)
        )

    def gather(self, tensor, options=None):
        """All-gather of a tensor of the same shape on every peer, along
        axis 0 (TensorFlow's `all_gather` first gathers the shapes)."""
        return self._chain.issue(lambda: self._all_gather(tensor, options))

    def broadcast(self, tensor, is_source, options=None):
        return self._chain.issue(
            lambda: self._broadcast(tensor, is_source, options)
        )

    def _broadcast(self, tensor, is_source, options):
        instance_key = self._next_instance_key()
        options = self._options.merge(options)
        dtype = tensor.dtype
        if dtype == dtypes.bfloat16:
            # Broadcast kernels have no bfloat16: move the same 16 bits.
            tensor = array_ops.bitcast(tensor, dtypes.float16)
        with ops.device(self._device):
            if is_source:
                result = collective_ops.broadcast_send_v2(
                    tensor, self._group_size, self._group_key, instance_key,
                    communication_hint=options.implementation.value,
                    timeout=options.timeout_seconds,
                )
            else:
                result = collective_ops.broadcast_recv_v2(
                    tensor.shape, tensor.dtype, self._group_size,
                    self._group_key, instance_key,
                    communication_hint=options.implementation.value,
                    timeout=options.timeout_seconds,
                )
        if dtype == dtypes.bfloat16:
            result = array_ops.bitcast(result, dtypes.bfloat16)
        return result


def _launcher(group_key, group_size, device, devices, options, chain):
    keys = cross_device_utils.CollectiveKeys(group_key_start=group_key)
    keys.get_group_key(devices)
    return _Launcher(group_key, group_size, keys, device, options, chain)


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
        compression: `None`, `"fp16"`, `"topk"` or a
            `compression.Compressor`.
        key_base: offset of the sub-group keys (the strategy's
            `_collective_key_base`).
        topk_density: fraction of each bucket sent under `"topk"`.
        topk_error_feedback: keep what was not sent as a residual.
        topk_exact_max_elements: buckets up to this size use the exact
            `tf.math.top_k`, larger ones MSTopK.
        residuals: the `sparse.Residuals` to use (a copy shares them).
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
        fusion_threshold_bytes=8 * 2**20,
        hierarchical_threshold_bytes=0,
        compression=None,
        key_base=0,
        topk_density=0.01,
        topk_error_feedback=True,
        topk_exact_max_elements=sparse.EXACT_MAX_ELEMENTS,
        residuals=None,
    ):
        sparse.check_density(topk_density)
        check_int("topk_exact_max_elements", topk_exact_max_elements, 0)
        super().__init__(
            devices, group_size, options, collective_keys, canonicalize_devices
        )
        self._fusion_threshold_bytes = fusion_threshold_bytes
        self._hierarchical_threshold_bytes = hierarchical_threshold_bytes
        self._compression = compression
        self._compressor = compression_lib.get(compression)
        self._topk_density = topk_density
        self._topk_error_feedback = bool(topk_error_feedback)
        self._topk_exact_max_elements = topk_exact_max_elements
        self.residuals = sparse.Residuals() if residuals is None else residuals
        self._task_id = task_id
        self._node_of_task = tuple(node_of_task)
        self._key_base = key_base
        self._num_nodes = len(set(self._node_of_task))
        # (tensors, wire bytes, "hierarchical" | "flat" | "sparse-flat" |
        # "sparse-hierarchical") per bucket built:
        # once per trace in a tf.function, every call when eager.
        self.bucket_log = collections.deque(maxlen=1024)
        chains = [_Chain() for _ in self._devices]
        group_key = self._collective_keys.get_group_key(self._devices)
        self._launchers = [
            _Launcher(group_key, group_size, self._collective_keys, d,
                      options, chain)
            for d, chain in zip(self._devices, chains)
        ]
        node = self._node_of_task[task_id]
        tasks_in_node = [
            t for t, n in enumerate(self._node_of_task) if n == node
        ]
        self._is_node_leader = task_id == tasks_in_node[0]
        self._node_group_size = len(tasks_in_node) * len(self._devices)
        start = SUBGROUP_KEY_START + key_base
        self._intra_launchers = [
            _launcher(start + 1 + node, self._node_group_size, d,
                      self._devices, options, chain)
            for d, chain in zip(self._devices, chains)
        ]
        self._leader_launcher = None
        if self._is_node_leader and self._num_nodes > 1:
            self._leader_launcher = _launcher(
                start, self._num_nodes, self._devices[0], self._devices[:1],
                options, chains[0],
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
        # `ReplicaContext.all_reduce` without `merge_call`: gradients.
        return self._reduce(reduce_op, value, replica_id, options, True)

    def batch_reduce_implementation(
        self, reduce_op, value_destination_pairs, options
    ):
        # `ReplicaContext.all_reduce` with `merge_call` (the values are
        # their own destinations): gradients.
        if not cross_device_ops._all_devices_match(
            value_destination_pairs, self._canonicalize_devices
        ):
            return super().batch_reduce_implementation(
                reduce_op, value_destination_pairs, options
            )
        return self._all_reduce_per_replica_values(
            reduce_op, [v for v, _ in value_destination_pairs], options,
            compress=True,
        )

    def _all_reduce_per_replica_values(
        self, reduce_op, per_replica_values, options, compress=False
    ):
        # TensorFlow's implementation; `reduce_implementation`
        # (`strategy.reduce`, metrics, variable updates) calls it without
        # `compress`: full precision.
        values_by_device = [
            [v.values[i] for v in per_replica_values]
            for i in range(len(self._devices))
        ]

        def reduce(i):
            return self._reduce(
                reduce_op, values_by_device[i], i, options, compress
            )

        with self._lock:
            if context.executing_eagerly():
                with multiprocessing.pool.ThreadPool(len(self._devices)) as p:
                    outputs = p.map(
                        lambda i: _eager(reduce, i), range(len(self._devices))
                    )
            else:
                outputs = [reduce(i) for i in range(len(self._devices))]
        return [
            distribute_utils.regroup(values, wrap_class=value_lib.Mirrored)
            for values in zip(*outputs)
        ]

    def _reduce(self, reduce_op, value, replica_id, options, compress):
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
                reduce_op, [flat[i] for i in fused], replica_id, options,
                compress,
            )
            for i, r in zip(fused, reduced):
                results[i] = r
        return nest.pack_sequence_as(value, results)

    def _fused_all_reduce(
        self, reduce_op, values, replica_id, options, compress
    ):
        compressor = self._compressor if compress else None
        topk = compressor is compression_lib.TopKCompressor
        signature = sparse.signature(values) if topk else None
        formats = [
            wire_format(v.dtype, v.shape.rank, reduce_op, self._group_size,
                        compressor)
            for v in values
        ]
        buckets = assign_buckets(
            [v.shape.num_elements() * v.dtype.size for v in values],
            [(v.dtype,) + f for v, f in zip(values, formats)],
            self._fusion_threshold_bytes,
        )
        results = [None] * len(values)
        device = self._devices[replica_id]
        for bucket in buckets:
            tensors = [values[i] for i in bucket]
            dtype = tensors[0].dtype
            wire, prescale, postscale = formats[bucket[0]]
            with ops.device(device):
                buffer = native.pack(tensors, dtype=wire, scale=prescale)
                wire_bytes = buffer.shape.num_elements() * wire.size
                hierarchical = self.uses_hierarchy(wire_bytes)
                sparse_bucket = topk and dtype != dtypes.float64
                if sparse_bucket:
                    hierarchical = self._num_nodes > 1
                if replica_id == 0:
                    kind = "hierarchical" if hierarchical else "flat"
                    if sparse_bucket:
                        kind = "sparse-" + kind
                    self.bucket_log.append((len(tensors), wire_bytes, kind))
                if sparse_bucket:
                    residuals = functools.partial(
                        self._residuals, device, replica_id, signature,
                        bucket, values,
                    )
                    buffer = self._sparse(
                        buffer, residuals, hierarchical, replica_id, options
                    )
                elif hierarchical:
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

    def _residuals(self, device, replica_id, signature, bucket, values):
        if not self._topk_error_feedback:
            return []
        return [
            self.residuals.get(device, replica_id, signature, i, values[i])
            for i in bucket
        ]

    def _sparse(self, buffer, residuals, hierarchical, replica_id, options):
        """The top-k exchange of one bucket (see `sparse.py`): among all
        replicas, or as the node leaders' step of the hierarchy (dense
        inside each node). `residuals()` returns the bucket's residuals,
        created on first use: only on the replicas that exchange."""
        if not hierarchical:
            return self._sparse_exchange(
                buffer, residuals, self._launchers[replica_id], options
            )
        return self._hierarchical(
            buffer, replica_id, options,
            lambda b: self._sparse_exchange(
                b, residuals, self._leader_launcher, options
            ),
        )

    def _sparse_exchange(self, buffer, residuals, launcher, options):
        size = buffer.shape.num_elements()
        k = sparse.num_selected(size, self._topk_density)
        acc = buffer
        residuals = residuals()
        if residuals:
            acc = buffer + native.pack(
                [r.read_value() for r in residuals], dtype=buffer.dtype
            )
        values, indices, remainder = sparse.sparsify(
            acc, k, self._topk_exact_max_elements
        )
        gathered = launcher.gather(sparse.encode(values, indices), options)
        result = sparse.decode_sum(gathered, k, size, buffer.dtype)
        if not residuals:
            return result
        parts = native.unpack(
            remainder, [r.shape for r in residuals],
            [r.dtype for r in residuals],
        )
        updates = [r.assign(part) for r, part in zip(residuals, parts)]
        with ops.control_dependencies(updates):
            return array_ops.identity(result)

    def _hierarchical(self, buffer, replica_id, options, across_nodes=None):
        """Intra-node all-reduce, `across_nodes` on the node leaders (their
        all-reduce by default), intra-node broadcast."""
        intra = self._intra_launchers[replica_id]
        if self._node_group_size > 1:
            buffer = intra.all_reduce(buffer, None, options)
        is_source = self._leader_launcher is not None and replica_id == 0
        if is_source:
            buffer = (across_nodes or (
                lambda b: self._leader_launcher.all_reduce(b, None, options)
            ))(buffer)
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
            topk_density=self._topk_density,
            topk_error_feedback=self._topk_error_feedback,
            topk_exact_max_elements=self._topk_exact_max_elements,
            residuals=self.residuals,
        )


def _is_fusable(value):
    return (
        isinstance(value, tensor_lib.Tensor)
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
    dtype = dtypes.as_dtype(dtype)
    wire = dtype
    if compressor is not None and rank:
        wire = dtypes.as_dtype(compressor.wire_dtype(dtype))
    mean = reduce_op == reduce_util.ReduceOp.MEAN
    if not mean:
        return wire, 1.0, 1.0
    if wire.size < dtype.size:
        return wire, 1.0 / group_size, 1.0
    return wire, 1.0, 1.0 / group_size


def _eager(fn, i):
    with context.eager_mode():
        return fn(i)
