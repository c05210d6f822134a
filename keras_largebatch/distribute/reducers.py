"""The reductions a fusion bucket can take, as peers behind one interface.

A reducer has a `kind` (the name `bucket_log` records) and
`reduce(buffer, bucket, replica_id, options)`, which returns the sum over
the job of one replica's packed bucket `buffer`. `FusedCollectiveAllReduce`
picks one per bucket:

```
flat:          x = all_reduce(x, group=everyone)        # ring / NCCL
hierarchical:  x = all_reduce(x, group=my_node)
               if node_leader: x = leaders_step(x)      # 1 replica per node
               x = broadcast(x, source=node_leader, group=my_node)
top-k:         the sparse exchange (`topk.TopKReducer`)
```

The leaders' step is a flat all-reduce among the leaders, or the top-k
exchange among them (kind `"sparse-hierarchical"`). Launchers are
`_tf_internals.Launcher`s, one per local device (replica).
"""

from typing import NamedTuple


class Bucket(NamedTuple):
    """One fusion bucket: its `tensors`, their `indices` in the list being
    reduced, and that list's `signature` (a hash of its shapes and dtypes).
    Together they name per-tensor state that lasts across steps (top-k
    residuals)."""

    tensors: list
    indices: list
    signature: str


class FlatReducer:
    """One all-reduce among every replica of the group."""

    kind = "flat"

    def __init__(self, launchers):
        self._by_replica = launchers

    def reduce(self, buffer, bucket, replica_id, options):
        launcher = self._by_replica[replica_id]
        return launcher.all_reduce(buffer, options=options)


class HierarchicalReducer:
    """Intra-node all-reduce, the leaders' step, intra-node broadcast.

    Args:
        intra_launchers: one launcher per local device, for its node's group.
        node_group_size: the number of devices in this node.
        leaders: the reducer of the node leaders' step, on a node leader
            (replica 0 of the node's first task); `None` on the others.
        kind: the name `bucket_log` records.
    """

    def __init__(self, intra_launchers, node_group_size, leaders,
                 kind="hierarchical"):
        self._intra = intra_launchers
        self._node_group_size = node_group_size
        self._leaders = leaders
        self.kind = kind

    def reduce(self, buffer, bucket, replica_id, options):
        intra = self._intra[replica_id]
        if self._node_group_size > 1:
            buffer = intra.all_reduce(buffer, options=options)
        is_source = self._leaders is not None and replica_id == 0
        if is_source:
            buffer = self._leaders.reduce(buffer, bucket, 0, options)
        if self._node_group_size > 1:
            buffer = intra.broadcast(buffer, is_source, options)
        return buffer
