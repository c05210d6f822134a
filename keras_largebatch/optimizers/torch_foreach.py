"""What the torch paths (`torch_lars`, `torch_lamb`, `torch_mixed`) share:
which variables go through the multi-tensor `torch._foreach_*` ops (a
`Batch`, what each path's `update_step` opens with), the per-variable flags
and step scalars as device tensors, the norms.

Every op here takes all the step's tensors at once, so an optimizer step
dispatches the same number of torch ops for 10 variables as for 1,000; all
of them have fake (meta) implementations, so the step also runs under
`torch.compile` (`model.compile(..., jit_compile=True)`). Per-variable
scalars (trust ratios, decay factors) stay one device vector, handed to the
`_foreach` ops as its 0-d slices (`torch.unbind`): nothing waits for the
device.

A step that may be skipped (`GradientStep.finite`, a device flag) is masked
here too: a rule zeroes the non-finite gradients with `where_finite` (or
hands the flag to a kernel that skips, as `torch.amp` does), and multiplies
its per-variable scalars by the flag.
"""

import functools
from typing import NamedTuple

import keras
import torch


class Batch(NamedTuple):
    """The variables of a step that a torch path updates with the
    multi-tensor ops, and their rules as device vectors.

    Attributes:
        grads: their dense float32 gradients, as torch tensors.
        variables: the Keras variables.
        weights: the variables' torch tensors, updated in place.
        device: where they live.
        decay: each variable's weight decay (0 where not decayed).
        adapted: whether each variable gets a trust ratio (bool).
        decayed: the indices of the decayed variables.
    """

    grads: list
    variables: list
    weights: list
    device: torch.device
    decay: torch.Tensor
    adapted: torch.Tensor
    decayed: list


def batch(optimizer, grads, variables, learning_rate, gradient_step):
    """What a torch path's `update_step` opens with: the variables `split`
    leaves to the per-variable `update_step` are updated by it, and the
    others returned as a `Batch` (None where there are none)."""
    fused, others = split(optimizer, grads, variables)
    for g, v in others:
        optimizer.update_step(g, v, learning_rate, gradient_step)
    if not fused:
        return None
    weights = [v.value for _, v, _ in fused]
    device = weights[0].device
    decay, adapted, decayed = rule_vectors(
        [rule for _, _, rule in fused], optimizer.weight_decay, device)
    return Batch(
        grads=[g for g, _, _ in fused],
        variables=[v for _, v, _ in fused],
        weights=weights,
        device=device,
        decay=decay,
        adapted=adapted,
        decayed=decayed,
    )


def split(optimizer, grads, variables):
    """Returns `(fused, others)`: `fused` holds `(g, v, rule)` for dense
    float32 gradients of updated float32 variables (`rule` is the
    variable's `VariableRule`), `others` the `(g, v)` left to the
    per-variable `update_step`."""
    fused, others = [], []
    for g, v in zip(grads, variables):
        if g is not None and not torch.is_tensor(g):
            g = keras.ops.convert_to_tensor(g)
        rule = optimizer.rule_for(v)
        dense = g is not None and not g.is_sparse
        float32 = v.dtype == "float32" and g is not None and g.dtype == torch.float32
        if dense and float32 and rule.updated:
            fused.append((g, v, rule))
        else:
            others.append((g, v))
    return fused, others


def flags(values, device, dtype=torch.float32):
    """A per-variable Python list (decay factors, masks) as one device
    vector: a constant under `torch.compile`."""
    return torch.tensor(values, dtype=dtype, device=device)


def rule_vectors(rules, weight_decay, device):
    """`(decay, adapted, decayed)` for the `VariableRule`s of a step: each
    variable's weight decay (0 where not decayed) and whether it is adapted,
    as device vectors, and the indices of the decayed ones. Made once per
    set of rules eagerly (a host-to-device copy per step otherwise), and
    as constants under `torch.compile`."""
    key = (tuple(rules), float(weight_decay), device)
    if torch.compiler.is_compiling():
        return _rule_vectors(*key)
    return _cached_rule_vectors(*key)


def _rule_vectors(rules, weight_decay, device):
    return (
        flags([weight_decay if r.decayed else 0.0 for r in rules], device),
        flags([r.adapted for r in rules], device, torch.bool),
        [i for i, r in enumerate(rules) if r.decayed and weight_decay > 0],
    )


_cached_rule_vectors = functools.lru_cache(maxsize=64)(_rule_vectors)


def scalar(value, device):
    """A step's scalar (learning rate, `1 / loss_scale`, bias correction)
    as a float32 device tensor: as a Python number it would sync with the
    host."""
    return keras.ops.convert_to_tensor(value, dtype="float32").to(device)


def norms(tensors, known=None):
    """The L2 norm of each tensor, as one float32 vector (one
    `_foreach_norm`, accumulated in float32 whatever the tensors' dtype);
    `known` holds the squared norms computed earlier in
    the step (None where not), and is used when it holds them all."""
    if known is not None and all(s is not None for s in known):
        return torch.stack(list(known)).sqrt()
    return torch.stack(torch._foreach_norm(tensors, dtype=torch.float32))


def norm_pair(first, second, known=None):
    """`(norms(first), norms(second, known))`; without the known squared
    norms, both from one `_foreach_norm` over the two lists."""
    if known is not None and all(s is not None for s in known):
        return norms(first), norms(second, known)
    both = norms(list(first) + list(second))
    return both[:len(first)], both[len(first):]


def where_finite(tensors, finite):
    """The float32 `tensors` where the 0-d boolean `finite` holds, else
    zeros, with no host read: compiled, a `where` each (which inductor fuses
    into the kernels that read the tensor); eagerly, one multi-tensor
    multiply of their bits as int32 by 1 or 0 (in float32, `0 * inf` is
    NaN). New tensors: the caller's are left as they are."""
    if torch.compiler.is_compiling():
        return [torch.where(finite, t, 0.0) for t in tensors]
    bits = torch._foreach_mul([t.view(torch.int32) for t in tensors],
                              finite.to(torch.int32))
    return [b.view(torch.float32) for b in bits]


def squared_norms(tensors):
    """The squared L2 norm of each tensor, as one float32 vector."""
    return norms(tensors).square()


def scalars(vector):
    """The 0-d slices of a device vector: per-tensor scalars for the
    `_foreach` ops, without a host sync."""
    return list(torch.unbind(vector))
