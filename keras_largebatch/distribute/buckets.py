"""Tensor fusion: packing gradients into all-reduce buckets.

The one packing rule of the package, used by `FusedCollectiveAllReduce`
(`all_reduce.py`) and by the cost model (`cost_model.fuse`). Pure Python:
importable without TensorFlow.

References:
    - Jia et al., 2018, arXiv:1807.11205 (tensor fusion).
"""

from keras_largebatch._shared import require


def assign_buckets(sizes, dtypes=None, fusion_threshold_bytes=0):
    """Packs tensors into fusion buckets, last tensor first.

    Args:
        sizes: bytes of each tensor, in variable (forward) order.
        dtypes: dtype of each tensor (anything comparable), or `None` when
            all share one.
        fusion_threshold_bytes: bucket capacity in bytes; `0` puts every
            tensor in a bucket of its own.

    Returns:
        A list of buckets, each a list of indices into `sizes`. Buckets are
        listed in the order they fill, which is backward's order; inside a
        bucket, indices run in reverse too. A bucket holds one dtype and at
        most `fusion_threshold_bytes` bytes, unless it is a single larger
        tensor.
    """
    require(
        fusion_threshold_bytes >= 0, "fusion_threshold_bytes",
        fusion_threshold_bytes, ">= 0",
    )
    if dtypes is None:
        dtypes = [None] * len(sizes)
    buckets, open_bucket = [], {}
    for i in reversed(range(len(sizes))):
        current = open_bucket.get(dtypes[i])
        if current is not None and current[1] + sizes[i] > fusion_threshold_bytes:
            current = None
        if current is None:
            current = [[], 0]
            open_bucket[dtypes[i]] = current
            buckets.append(current[0])
        current[0].append(i)
        current[1] += sizes[i]
    return buckets
