"""Every use of TensorFlow's private API in keras_largebatch, in one module.

The rest of the package sees only the public names below. Each private
name is used for one reason, stated where it is used: what the public
API lacks. Checked on TensorFlow 2.21 (`tests/distribute/test_tf_internals.py`
exercises every one against the installed TensorFlow); another version
may have moved them.

- `CollectiveAllReduce`: TensorFlow's collective cross-device ops, with
  its private hooks routed to one method, `reduce_replica`.
- `Launcher`: one device's collectives in one group (all-reduce,
  all-gather of equal shapes, broadcast).
- `cluster_spec`, `task_id`, `collective_key_base`, `cross_device_ops`,
  `replace_cross_device_ops`, `reduce_without_merge_call`: a
  `tf.distribute.MultiWorkerMirroredStrategy`'s internals.
- `local_variable`, `in_xla_context`, `strategy_supports_no_merge_call`,
  `maybe_merge_call`.
"""

import multiprocessing.pool

import tensorflow as tf

# No public module has collective cross-device ops, their launchers or
# their group and instance keys (`tf.distribute` exports the strategies
# only).
from tensorflow.python.distribute import cross_device_ops as _cross_device_ops
from tensorflow.python.distribute import cross_device_utils as _utils
# `regroup` and `Mirrored` build the per-replica result TensorFlow's
# strategies expect back from cross-device ops; there is no public one.
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import values as _values
# `eager_mode()`: the thread pool's threads must run eagerly, as
# TensorFlow's own `CollectiveAllReduce` makes them; no public scope does.
from tensorflow.python.eager import context as _context
# `GraphOrParentsInXlaContext`: no public function says whether a trace is
# for XLA (`jit_compile=True`).
from tensorflow.python.ops import control_flow_util as _control_flow_util
# `ResourceVariable`: `tf.Variable` under a strategy's scope is mirrored.
from tensorflow.python.ops import resource_variable_ops as _resource_variables

TENSORFLOW_VERSIONS_CHECKED = ("2.21",)


class CollectiveAllReduce(_cross_device_ops.CollectiveAllReduce):
    """TensorFlow's `CollectiveAllReduce` that reduces through `reduce_replica`.

    A subclass implements `reduce_replica(reduce_op, value, replica_id,
    options, compress)`: the reduction, on replica `replica_id`, of a nested
    structure of that replica's tensors. TensorFlow reaches it by three
    private hooks:

    - `_all_reduce`, without `merge_call`: `ReplicaContext.all_reduce`
      (gradients), `compress=True`, and the aggregation of a variable's
      update or read in the replica context (metrics), `compress=False`;
    - `batch_reduce_implementation`: `ReplicaContext.all_reduce` with
      `merge_call` (gradients), `compress=True`, when every value is its
      own destination (TensorFlow's path otherwise);
    - `_all_reduce_per_replica_values`: `strategy.reduce`, metrics and
      variable updates (`reduce_implementation`), `compress=False`.

    `tf_all_reduce` is TensorFlow's own reduction of one replica's tensors.
    """

    @property
    def devices(self):
        """The local devices, canonicalized, one replica each."""
        return self._devices

    @property
    def group_size(self):
        """The number of devices in the whole job."""
        return self._group_size

    @property
    def options(self):
        """The `tf.distribute.experimental.CommunicationOptions`."""
        return self._options

    @property
    def collective_keys(self):
        """The key source shared with the strategy (instance keys)."""
        return self._collective_keys

    @property
    def canonicalize_devices(self):
        return self._canonicalize_devices

    @property
    def launchers(self):
        """One `Launcher` per local device, in the job's group."""
        return self._launchers

    @launchers.setter
    def launchers(self, launchers):
        # `_launchers`: TensorFlow's own reduction (`tf_all_reduce`) issues
        # through them too, so every collective follows one order.
        self._launchers = list(launchers)

    @property
    def group_key(self):
        """The collective group key of all the job's devices."""
        return self._collective_keys.get_group_key(self._devices)

    def reduce_replica(self, reduce_op, value, replica_id, options, compress):
        raise NotImplementedError(
            f"{type(self).__name__} must implement `reduce_replica`."
        )

    def tf_all_reduce(self, reduce_op, values, replica_id, options):
        """TensorFlow's all-reduce of a list of one replica's tensors."""
        return super()._all_reduce(reduce_op, values, replica_id, options)

    # TensorFlow's private hook for the replica context's reductions
    # without `merge_call`; no public method is called there. Its callers
    # differ in what they pass (TensorFlow 2.21): `ReplicaContext.all_reduce`
    # a tuple of the flattened values, a variable's aggregation
    # (`values_util.apply_aggregation_replica_context`, `SyncOnReadVariable`)
    # one tensor, which then travels uncompressed as `reduce_to` sends it
    # with `merge_call`.
    def _all_reduce(self, reduce_op, value, replica_id, options):
        return self.reduce_replica(
            reduce_op, value, replica_id, options, tf.nest.is_nested(value)
        )

    def batch_reduce_implementation(
        self, reduce_op, value_destination_pairs, options
    ):
        # `_all_devices_match`: TensorFlow's test of whether the values are
        # their own destinations; it is private.
        if not _cross_device_ops._all_devices_match(
            value_destination_pairs, self._canonicalize_devices
        ):
            return super().batch_reduce_implementation(
                reduce_op, value_destination_pairs, options
            )
        return self._all_reduce_per_replica_values(
            reduce_op, [v for v, _ in value_destination_pairs], options,
            compress=True,
        )

    # TensorFlow's private hook, called by `reduce_implementation` and
    # `batch_reduce_implementation`: as TensorFlow's, but through
    # `reduce_replica`.
    def _all_reduce_per_replica_values(
        self, reduce_op, per_replica_values, options, compress=False
    ):
        values_by_device = [
            [v.values[i] for v in per_replica_values]
            for i in range(len(self._devices))
        ]

        def reduce(i):
            return self.reduce_replica(
                reduce_op, values_by_device[i], i, options, compress
            )

        # `_lock`: TensorFlow's lock against interleaved launches from
        # several user threads (a deadlock); ours must take the same one.
        with self._lock:
            if tf.executing_eagerly():
                with multiprocessing.pool.ThreadPool(len(self._devices)) as p:
                    outputs = p.map(
                        lambda i: _eager(reduce, i), range(len(self._devices))
                    )
            else:
                outputs = [reduce(i) for i in range(len(self._devices))]
        return [
            _distribute_utils.regroup(values, wrap_class=_values.Mirrored)
            for values in zip(*outputs)
        ]


def _eager(fn, i):
    with _context.eager_mode():
        return fn(i)


class Launcher(_utils.CollectiveReplicaLauncher):
    """TensorFlow's launcher of one device's collectives in one group, plus
    an all-gather of equal shapes and a broadcast.

    `issue(launch)`, when given, issues every all-reduce, all-gather and
    broadcast (the caller's ordering); it returns `launch()`. TensorFlow's
    own packed all-reduce (`batch_all_reduce`) calls `all_reduce`, so it is
    issued the same way.

    Args:
        group_key, group_size: the group's collective key and its number
            of devices.
        collective_keys: where instance keys come from.
        device: this launcher's device.
        options: the default `CommunicationOptions`.
        issue: a function of `launch`, or `None` to call `launch()`.
    """

    def __init__(self, group_key, group_size, collective_keys, device,
                 options, issue=None):
        super().__init__(group_key, group_size, collective_keys, device,
                         options)
        self._issue = issue or (lambda launch: launch())

    @classmethod
    def for_subgroup(cls, group_key, group_size, device, devices, options,
                     issue=None):
        """A launcher of a group of our own, keyed `group_key` on every
        worker; `devices` are this worker's devices in the group."""
        keys = _utils.CollectiveKeys(group_key_start=group_key)
        keys.get_group_key(devices)
        return cls(group_key, group_size, keys, device, options, issue)

    def all_reduce(self, input_tensor, control_input=None, options=None):
        parent = super().all_reduce
        return self._issue(
            lambda: parent(input_tensor, control_input, options)
        )

    def gather(self, tensor, options=None):
        """All-gather along axis 0 of a tensor of the same shape on every
        peer. `_all_gather` is the launcher's collective without the shape
        exchange of its public `all_gather`, which equal shapes need not."""
        return self._issue(lambda: self._all_gather(tensor, options))

    def broadcast(self, tensor, is_source, options=None):
        """`tensor` from the source to every peer (the source returns it)."""
        return self._issue(lambda: self._broadcast(tensor, is_source, options))

    def _broadcast(self, tensor, is_source, options):
        # The launcher has no broadcast; its private instance keys, options,
        # device and group are what one needs.
        instance_key = self._next_instance_key()
        options = self._options.merge(options)
        dtype = tensor.dtype
        if dtype == tf.bfloat16:
            # Broadcast kernels have no bfloat16: move the same 16 bits.
            tensor = tf.bitcast(tensor, tf.float16)
        group = dict(
            group_size=self._group_size, group_key=self._group_key,
            instance_key=instance_key,
            communication_hint=options.implementation.value.lower(),
            timeout_seconds=options.timeout_seconds,
        )
        with tf.device(self._device):
            if is_source:
                result = tf.raw_ops.CollectiveBcastSendV2(input=tensor, **group)
            else:
                result = tf.raw_ops.CollectiveBcastRecvV2(
                    shape=tensor.shape, T=tensor.dtype, **group
                )
        if dtype == tf.bfloat16:
            result = tf.bitcast(result, tf.bfloat16)
        return result


# A strategy's internals. `tf.distribute.MultiWorkerMirroredStrategy` takes
# no cross-device ops (`MirroredStrategy` does) and exposes neither its
# cluster, nor this task's rank, nor its collective keys and options.


def cluster_spec(strategy):
    """The strategy's `tf.train.ClusterSpec` (`None` on one worker)."""
    return strategy.extended._cluster_spec


def task_id(strategy):
    """This worker's rank in the cluster (chief first)."""
    return strategy.extended._id_in_cluster


def collective_key_base(strategy):
    """The offset of the strategy's collective keys (distinct per strategy
    instance in a process)."""
    return strategy._collective_key_base


def cross_device_ops(strategy):
    """The cross-device ops that reduce the strategy's values."""
    return strategy.extended._cross_device_ops


def replace_cross_device_ops(strategy, build):
    """Makes `build(group_size, options, collective_keys)` the strategy's
    cross-device ops, wherever the strategy keeps them; returns them."""
    extended = strategy.extended
    old = extended._cross_device_ops
    new = build(
        old._group_size, extended._communication_options,
        extended._collective_keys,
    )
    extended._cross_device_ops = new
    if getattr(extended, "_inferred_cross_device_ops", None) is old:
        extended._inferred_cross_device_ops = new
    return new


def reduce_without_merge_call(strategy):
    """Makes `strategy` reduce without `merge_call` in a `tf.function`.

    As TensorFlow's strategies do when XLA compiles for GPUs: each replica
    calls the cross-device ops' `_all_reduce` for
    `ReplicaContext.all_reduce` and for variable aggregation, and Keras'
    optimizers update variables in the replica context
    (`maybe_merge_call`). A `cond` may then reduce and update in a branch,
    where `merge_call` is refused: Keras' gradient accumulation, a
    `LossScaleOptimizer`'s skipped step. Eagerly, where replicas run one
    after another and a collective issued by one would wait for the next,
    `merge_call` stays. `_use_merge_call` is the strategy's private switch
    (TensorFlow's own tests turn it off the same way,
    `strategy_combinations`); no public option does it.
    """
    strategy.extended._use_merge_call = tf.executing_eagerly


def local_variable(initial_value, name):
    """A non-trainable variable of this worker alone, even under a
    strategy's scope (where `tf.Variable` makes a mirrored one)."""
    return _resource_variables.ResourceVariable(
        initial_value, trainable=False, name=name
    )


def in_xla_context():
    """Whether TensorFlow is tracing for XLA (`jit_compile=True`).

    `False` when the private function has moved.
    """
    try:
        graph = tf.compat.v1.get_default_graph()
        return bool(_control_flow_util.GraphOrParentsInXlaContext(graph))
    except AttributeError:
        return False


def strategy_supports_no_merge_call():
    """Whether the current strategy reduces without `merge_call`
    (`tf.__internal__`: how Keras' `LossScaleOptimizer` asks)."""
    return tf.__internal__.distribute.strategy_supports_no_merge_call()


def maybe_merge_call(fn, strategy, *args):
    """`fn(strategy, *args)` in the cross-replica context: through
    `merge_call`, or directly where the strategy needs none
    (`tf.__internal__`: how Keras' TensorFlow optimizers update
    variables)."""
    return tf.__internal__.distribute.interim.maybe_merge_call(
        fn, strategy, *args
    )
