"""Exercises the strategy and collective internals of `_tf_internals`.

Run as the one task of a localhost cluster (`TF_CONFIG` set by
`localhost.run`), with the CPU split in two logical devices first. Prints
one line `RESULT<json>`: for each internal, `[ok, what was seen]`.
"""

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

from keras_largebatch import _tf_internals  # noqa: E402
from keras_largebatch.distribute import MultiWorkerMirroredStrategy  # noqa: E402
from keras_largebatch.distribute.all_reduce import FusedCollectiveAllReduce  # noqa: E402
from keras_largebatch.distribute.config import ReduceConfig  # noqa: E402

OPTIONS = tf.distribute.experimental.CommunicationOptions(timeout_seconds=60)
strategy = MultiWorkerMirroredStrategy(communication_options=OPTIONS)

import numpy as np  # noqa: E402

DEVICES = ["/device:CPU:0", "/device:CPU:1"]
RESULT = {}


def check(name, ok, seen):
    RESULT[name] = [bool(ok), repr(seen)[:300]]


def strategy_internals():
    ops = strategy.cross_device_ops
    extended = strategy.extended
    check("replace_cross_device_ops",
          isinstance(ops, FusedCollectiveAllReduce)
          and extended._cross_device_ops is ops
          and getattr(extended, "_inferred_cross_device_ops", ops) is ops
          and extended._get_cross_device_ops(None) is ops,
          type(extended._get_cross_device_ops(None)).__name__)
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    spec = _tf_internals.cluster_spec(strategy)
    check("cluster_spec", spec.as_dict() == cluster, spec)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    check("task_id", _tf_internals.task_id(strategy) == task,
          _tf_internals.task_id(strategy))
    base = _tf_internals.collective_key_base(strategy)
    # TensorFlow's collective keys start right above the key base.
    check("collective_key_base",
          isinstance(base, int) and ops.group_key == 1 + base,
          (base, ops.group_key))
    check("CollectiveAllReduce properties",
          ops.devices == tuple(extended.worker_devices)
          and ops.group_size == 1 and ops.options is OPTIONS
          and ops.collective_keys is extended._collective_keys,
          (ops.devices, ops.group_size, ops.options))


class Recording(FusedCollectiveAllReduce):
    """Records which `compress` each replica's reduction got."""

    calls = []

    def reduce_replica(self, reduce_op, value, replica_id, options, compress):
        self.calls.append((replica_id, compress))
        return super().reduce_replica(
            reduce_op, value, replica_id, options, compress
        )


def hooks():
    ops = Recording(DEVICES, 2, OPTIONS,
                    config=ReduceConfig(fusion_threshold_bytes=64))
    mirrored = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=ops)
    x = [np.arange(6, dtype="float32").reshape(2, 3) * (d + 1)
         for d in range(2)]
    n = np.arange(4, dtype="int32")
    want = (x[0] + x[1]).tolist()

    @tf.function
    def replica_all_reduce():
        def fn():
            ctx = tf.distribute.get_replica_context()
            d = ctx.replica_id_in_sync_group
            value = tf.constant(x[0]) * tf.cast(d + 1, tf.float32)
            return ctx.all_reduce("sum", value)

        return mirrored.run(fn)

    Recording.calls.clear()
    y = replica_all_reduce()
    got = [v.numpy().tolist() for v in mirrored.experimental_local_results(y)]
    # Both replicas got compress=True, through `_all_reduce` or
    # `batch_reduce_implementation`, whichever TensorFlow calls.
    check("_all_reduce / batch_reduce_implementation hook",
          got == [want, want]
          and sorted(Recording.calls) == [(0, True), (1, True)],
          (Recording.calls, got))
    check("launchers are TensorFlow's too",
          all(isinstance(l, _tf_internals.Launcher) for l in ops._launchers),
          [type(l).__name__ for l in ops._launchers])

    value = per_replica(x)
    for mode in ("graph", "eager"):
        Recording.calls.clear()
        reduce = lambda: list(ops.reduce("sum", value, value).values)  # noqa
        got = tf.function(reduce)() if mode == "graph" else reduce()
        check(f"_all_reduce_per_replica_values hook ({mode})",
              [v.numpy().tolist() for v in got] == [want, want]
              and sorted(Recording.calls) == [(0, False), (1, False)],
              (Recording.calls, got))
    counts = per_replica([n, 2 * n])
    got = tf.function(lambda: list(ops.reduce("sum", counts, counts).values))()
    check("tf_all_reduce (int32, by TensorFlow's reduction)",
          [v.numpy().tolist() for v in got] == [(n * 3).tolist()] * 2, got)
    Recording.calls.clear()
    got = tf.function(
        lambda: list(ops.batch_reduce("sum", [(value, value)])[0].values)
    )()
    check("batch_reduce_implementation hook",
          [v.numpy().tolist() for v in got] == [want, want]
          and sorted(Recording.calls) == [(0, True), (1, True)],
          (Recording.calls, got))


def no_merge_call():
    """`reduce_without_merge_call` on the package's strategy: each replica
    reduces through `_all_reduce`, also in a `cond`; a variable's
    aggregation travels uncompressed. Run last: it replaces the strategy's
    cross-device ops by a recording copy."""
    check("reduce_without_merge_call (the package's strategy)",
          strategy.extended._use_merge_call()
          and not tf.function(strategy.extended._use_merge_call)(),
          strategy.extended._use_merge_call)
    from tensorflow.python.distribute import cross_device_utils

    # A group key of its own: `hooks` used the strategy's first one.
    keys = cross_device_utils.CollectiveKeys(group_key_start=1 << 22)
    _tf_internals.replace_cross_device_ops(
        strategy, lambda size, options, _: Recording(
            strategy.extended.worker_devices, size, options, keys))
    with strategy.scope():
        total = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)

    @tf.function
    def step(flag):
        def fn():
            ctx = tf.distribute.get_replica_context()
            x = tf.cond(flag, lambda: ctx.all_reduce("sum", [2.0])[0],
                        lambda: tf.constant(0.0))
            total.assign_add(3.0)
            return x

        return strategy.run(fn)

    Recording.calls.clear()
    got = [v.numpy().tolist()
           for v in strategy.experimental_local_results(
               step(tf.constant(True)))]
    # One replica here: the variable's update needs no aggregation. A
    # variable's aggregation hands `_all_reduce` one tensor (compress=False).
    ops = strategy.cross_device_ops
    tf.function(lambda: ops._all_reduce("sum", tf.ones([3]), 0, OPTIONS))()
    calls = list(Recording.calls)
    check("_all_reduce without merge_call (in a cond; variable aggregation)",
          got == [2.0] and total.numpy() == 3.0
          and calls == [(0, True), (0, False)],
          (calls, got, total.numpy()))


def per_replica(arrays):
    """A `PerReplica` of one array per device (TensorFlow has no public
    constructor of one with chosen devices)."""
    from tensorflow.python.distribute import values

    parts = []
    for device, array in zip(DEVICES, arrays):
        with tf.device(device):
            parts.append(tf.constant(array))
    return values.PerReplica(parts)


def launcher():
    keys = FusedCollectiveAllReduce(DEVICES, 2, OPTIONS).collective_keys
    group_key = keys.get_group_key(tuple(DEVICES))
    launchers = [_tf_internals.Launcher(group_key, 2, keys, d, OPTIONS)
                 for d in DEVICES]
    subgroup = [_tf_internals.Launcher.for_subgroup(1 << 21, 2, d, DEVICES,
                                                    OPTIONS)
                for d in DEVICES]

    @tf.function
    def run():
        out = {"gather": [], "bcast": [], "bcast_bf16": [], "sub": []}
        for d, device in enumerate(DEVICES):
            with tf.device(device):
                t = tf.constant([1.0, 2.0, 3.0]) * (d + 1)
                out["gather"].append(launchers[d].gather(t))
                out["bcast"].append(launchers[d].broadcast(t, d == 0))
                out["bcast_bf16"].append(tf.cast(launchers[d].broadcast(
                    tf.cast(t, tf.bfloat16), d == 0), tf.float32))
                out["sub"].append(subgroup[d].all_reduce(t))
        return out

    out = {k: [v.numpy().tolist() for v in vs] for k, vs in run().items()}
    check("Launcher.gather (_all_gather)",
          out["gather"] == [[1, 2, 3, 2, 4, 6]] * 2, out["gather"])
    check("Launcher.broadcast (_next_instance_key, _options, _device, "
          "_group_key, _group_size)",
          out["bcast"] == [[1, 2, 3]] * 2, out["bcast"])
    check("Launcher.broadcast of bfloat16",
          out["bcast_bf16"] == [[1, 2, 3]] * 2, out["bcast_bf16"])
    check("Launcher.for_subgroup (CollectiveKeys)",
          out["sub"] == [[3, 6, 9]] * 2, out["sub"])


strategy_internals()
hooks()
launcher()
no_merge_call()
print("RESULT" + json.dumps(RESULT))
