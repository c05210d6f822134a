"""An alpha-beta cost model of fused ring, hierarchical and hybrid all-reduce.

Sending a message of `n` bytes over a link costs `alpha + n * beta`
(latency `alpha` in seconds, inverse bandwidth `beta` in seconds per byte).
For `p` GPUs, `g` per node (Jia et al. 2018, arXiv:1807.11205: tensor
fusion, hierarchical and hybrid all-reduce; Thakur et al. 2005 for the
ring):

```python
ring(n, p)  = 2 (p - 1) alpha + 2 (p - 1) / p * n * beta
# A flat ring crosses PCIe and the network; every step waits for the
# slowest link, so alpha = max(intra, inter), beta = max(intra, inter).
hier(n)     = reduce_g(n) + ring(n, p / g) [inter] + broadcast_g(n)
reduce_g(n) = broadcast_g(n) = 2 (g - 1) alpha_intra
                               + 2 (g - 1) / g * n * beta_intra
hybrid(b)   = hier(b) if b < hierarchical_threshold_bytes else ring(b)
```

Reduce and broadcast inside a node are rings too (reduce-scatter + gather,
scatter + all-gather), so `hier` pays `4 (g - 1) + 2 (p / g - 1)`
latencies against the flat ring's `2 (p - 1)`, but moves about
`3.5 n` bytes over PCIe and `2 n` over the network against the ring's `2 n`.

Top-k sparsification (Shi et al. 2020, arXiv:2010.10458; the strategy's
`compression="topk"`) sends `k = density * n / s` of a bucket's values
(element size `s`) with their int32 indices: an all-gather, by a ring,
of `2 k` 4-byte numbers from each of `P` peers:

```python
allgather(m, P) = (P - 1) alpha + (P - 1) * m * beta     # m = 8 k bytes
sparse(n, d)    = allgather(8 k, p)            # one node: all GPUs
                = reduce_g(n) + allgather(8 k, p / g) [inter]
                  + broadcast_g(n)             # several: across nodes
```

It is linear in the density `d`, so it beats a flat ring below one
density, `sparse_crossover_density`. Selection (MSTopK) and the
scatter-add are computation, not in this model.

Tensor fusion packs the gradients in reverse order (the order backward
produces them) into buckets of up to `fusion_threshold_bytes`, so a step
pays the latency terms once per bucket instead of once per tensor. The baseline is
one flat all-reduce per tensor (NCCL-style, no fusion). Both costs are
linear in `n`, so the best `hierarchical_threshold_bytes` is where `hier`
and `ring` cross.
"""

import math
from typing import NamedTuple

from keras_largebatch._shared import check_int
from keras_largebatch._shared import require
from keras_largebatch.distribute.buckets import assign_buckets

MiB = 2**20


class Network(NamedTuple):
    """A cluster of nodes with `gpus_per_node` GPUs each.

    Latencies in seconds per message, betas in seconds per byte.
    Defaults: a P40 node of 8 GPUs on PCIe 3.0 x16 (15.75 GB/s peak, about
    10 GB/s achieved), nodes on 100 Gb/s InfiniBand EDR (12.5 GB/s); 5 us
    and 10 us per ring step are assumptions (wire latencies are ~1 us,
    collective libraries add software overhead per step).
    """

    gpus_per_node: int = 8
    intra_alpha: float = 5e-6
    intra_beta: float = 1 / 10e9
    inter_alpha: float = 10e-6
    inter_beta: float = 1 / 12.5e9


def ring_allreduce_time(nbytes, workers, alpha, beta):
    """Seconds for a ring all-reduce of `nbytes` on `workers` peers."""
    if workers <= 1:
        return 0.0
    return 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * nbytes * beta


def _check_gpus(gpus, network):
    g = network.gpus_per_node
    check_int("gpus_per_node", g, 1)
    require(
        isinstance(gpus, int) and gpus >= 1 and (gpus <= g or gpus % g == 0),
        "gpus", gpus,
        f"an int >= 1, a multiple of `gpus_per_node` ({g}) when larger than it",
    )
    for name in ("intra_alpha", "intra_beta", "inter_alpha", "inter_beta"):
        value = getattr(network, name)
        require(value >= 0, name, value, ">= 0")


def flat_allreduce_time(nbytes, gpus, network):
    """Seconds for one ring over all `gpus`, crossing nodes where needed."""
    _check_gpus(gpus, network)
    if gpus <= network.gpus_per_node:
        return ring_allreduce_time(
            nbytes, gpus, network.intra_alpha, network.intra_beta
        )
    alpha = max(network.intra_alpha, network.inter_alpha)
    beta = max(network.intra_beta, network.inter_beta)
    return ring_allreduce_time(nbytes, gpus, alpha, beta)


def hierarchical_allreduce_time(nbytes, gpus, network):
    """Seconds for reduce in node, ring across node leaders, broadcast."""
    _check_gpus(gpus, network)
    g = network.gpus_per_node
    if gpus <= g:
        return flat_allreduce_time(nbytes, gpus, network)
    local = 2 * (g - 1) * network.intra_alpha + (
        2 * (g - 1) / g * nbytes * network.intra_beta
    )
    leaders = ring_allreduce_time(
        nbytes, gpus // g, network.inter_alpha, network.inter_beta
    )
    return 2 * local + leaders


def allgather_time(message_bytes, workers, alpha, beta):
    """Seconds for a ring all-gather of `message_bytes` from each peer."""
    if workers <= 1:
        return 0.0
    return (workers - 1) * alpha + (workers - 1) * message_bytes * beta


def sparse_allreduce_time(nbytes, density, gpus, network, element_bytes=4):
    """Seconds for the top-k exchange of a bucket of `nbytes`.

    On one node, all GPUs all-gather (value, index) pairs; on several, a
    dense reduce in each node, the all-gather among node leaders and a
    broadcast in each node (sparsified across nodes only).
    """
    _check_gpus(gpus, network)
    require(0 < density <= 1, "density", density, "in (0, 1]")
    k = max(1.0, density * nbytes / element_bytes)
    message = 8 * k
    g = network.gpus_per_node
    if gpus <= g:
        return allgather_time(
            message, gpus, network.intra_alpha, network.intra_beta
        )
    local = 2 * (g - 1) * network.intra_alpha + (
        2 * (g - 1) / g * nbytes * network.intra_beta
    )
    leaders = allgather_time(
        message, gpus // g, network.inter_alpha, network.inter_beta
    )
    return 2 * local + leaders


def sparse_crossover_density(buckets, gpus, network, dense_seconds=None,
                             element_bytes=4):
    """The density below which the top-k exchange of all `buckets` beats a
    dense scheme taking `dense_seconds` (default: the fused flat ring); 0
    when it never does, 1 when it always does."""
    ring = dense_seconds
    if ring is None:
        ring = sum(flat_allreduce_time(b, gpus, network) for b in buckets)
    lo, hi = 1e-9, 1.0
    sparse = lambda d: sum(  # noqa: E731
        sparse_allreduce_time(b, d, gpus, network, element_bytes)
        for b in buckets
    )
    if sparse(hi) <= ring:
        return 1.0
    if sparse(lo) >= ring:
        return 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sparse(mid) < ring else (lo, mid)
    return lo


def crossover_bytes(gpus, network):
    """The best `hierarchical_threshold_bytes`: where `hier` meets `ring`.

    Buckets below it are cheaper hierarchical. Returns 0 (never
    hierarchical) on one node or when the ring is never slower, and
    `math.inf` when hierarchical is never slower.
    """
    if gpus <= network.gpus_per_node:
        _check_gpus(gpus, network)
        return 0
    probe = 2**30
    ring0, ring1 = (flat_allreduce_time(n, gpus, network) for n in (0, probe))
    hier0, hier1 = (
        hierarchical_allreduce_time(n, gpus, network) for n in (0, probe)
    )
    d_alpha = ring0 - hier0
    d_beta = ((hier1 - hier0) - (ring1 - ring0)) / probe
    if d_alpha <= 0:
        return 0
    if d_beta <= 0:
        return math.inf
    return int(math.ceil(d_alpha / d_beta))


def fuse(tensor_bytes, fusion_threshold_bytes):
    """Bucket sizes in bytes, in the order they are sent.

    The packing is the strategy's own (`distribute.buckets.assign_buckets`):
    last tensor first, up to the threshold; a larger tensor is a bucket of
    its own, so `fusion_threshold_bytes=0` gives one bucket per tensor.
    """
    sizes = list(tensor_bytes)
    return [
        sum(sizes[i] for i in bucket)
        for bucket in assign_buckets(sizes, None, fusion_threshold_bytes)
    ]


def hybrid_allreduce_time(buckets, gpus, network, hierarchical_threshold_bytes):
    """Seconds for all buckets, hierarchical below the threshold."""
    return sum(
        hierarchical_allreduce_time(b, gpus, network)
        if b < hierarchical_threshold_bytes
        else flat_allreduce_time(b, gpus, network)
        for b in buckets
    )


def step_time(comm_seconds, compute_seconds, overlap=0.0):
    """Step seconds when `overlap` of backward (2/3 of compute) hides comm."""
    require(0.0 <= overlap <= 1.0, "overlap", overlap, "in [0, 1]")
    hidden = overlap * 2.0 / 3.0 * compute_seconds
    return compute_seconds + max(comm_seconds - hidden, 0.0)


def compare(
    tensor_bytes,
    gpus,
    network,
    fusion_threshold_bytes=64 * MiB,
    compute_seconds=0.0,
    overlap=0.0,
    hierarchical_threshold_bytes=None,
    topk_density=0.01,
    element_bytes=4,
):
    """All schemes for one gradient set on `gpus` GPUs.

    Args:
        tensor_bytes: Bytes of each gradient, in forward order.
        gpus: Int, a multiple of `network.gpus_per_node` when larger.
        network: A `Network`.
        fusion_threshold_bytes: Bucket size. Defaults to 64 MiB.
        compute_seconds: Forward + backward time per step. Defaults to 0
            (speedups of communication alone).
        overlap: Fraction of backward, taken as 2/3 of compute, that hides
            communication, for both schemes. Defaults to 0.
        hierarchical_threshold_bytes: The hybrid's threshold. Defaults to
            `crossover_bytes(gpus, network)`.
        topk_density: Density of the `topk` scheme. Defaults to 0.01.
        element_bytes: Bytes per gradient value. Defaults to 4.

    Returns:
        A dict with seconds per step for `per_tensor` (flat ring, one
        all-reduce per tensor), `ring`, `hierarchical` and `hybrid` (fused),
        `threshold` (the best `hierarchical_threshold_bytes`),
        `comm_speedup`/`step_speedup` of hybrid over per-tensor, `topk`
        (the sparse exchange at `topk_density`), `topk_crossover` and
        `topk_crossover_hybrid` (the densities below which it beats the
        fused ring and the hybrid), `topk_step_speedup` (of top-k over
        hybrid, in step time).
    """
    buckets = fuse(tensor_bytes, fusion_threshold_bytes)
    threshold = crossover_bytes(gpus, network)
    used = threshold
    if hierarchical_threshold_bytes is not None:
        used = hierarchical_threshold_bytes
    row = {
        "gpus": gpus,
        "nodes": max(gpus // network.gpus_per_node, 1),
        "buckets": len(buckets),
        "per_tensor": sum(
            flat_allreduce_time(n, gpus, network) for n in tensor_bytes
        ),
        "ring": sum(flat_allreduce_time(b, gpus, network) for b in buckets),
        "hierarchical": sum(
            hierarchical_allreduce_time(b, gpus, network) for b in buckets
        ),
        "hybrid": hybrid_allreduce_time(buckets, gpus, network, used),
        "threshold": threshold,
        "topk": sum(
            sparse_allreduce_time(b, topk_density, gpus, network,
                                  element_bytes)
            for b in buckets
        ),
    }
    row["topk_crossover"] = sparse_crossover_density(
        buckets, gpus, network, row["ring"], element_bytes
    )
    row["topk_crossover_hybrid"] = sparse_crossover_density(
        buckets, gpus, network, row["hybrid"], element_bytes
    )
    row["topk_step_speedup"] = _ratio(
        step_time(row["hybrid"], compute_seconds, overlap),
        step_time(row["topk"], compute_seconds, overlap),
    )
    row["comm_speedup"] = _ratio(row["per_tensor"], row["hybrid"])
    row["step_speedup"] = _ratio(
        step_time(row["per_tensor"], compute_seconds, overlap),
        step_time(row["hybrid"], compute_seconds, overlap),
    )
    return row


def _ratio(a, b):
    return a / b if b > 0 else 1.0


def inter_alpha_for_speedup(
    tensor_bytes, gpus, network, target, lo=0.0, hi=1e-3, **kwargs
):
    """The inter-node latency at which `compare` gives `target` step speedup.

    Returns None when no latency in `[lo, hi]` reaches it (the speedup grows
    with latency: the baseline pays far more latencies than hybrid).
    """

    def speedup(alpha):
        net = network._replace(inter_alpha=alpha)
        return compare(tensor_bytes, gpus, net, **kwargs)["step_speedup"]

    if not speedup(lo) <= target <= speedup(hi):
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) < target else (lo, mid)
    return (lo + hi) / 2
