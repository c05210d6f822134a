"""What the fused torch paths (`torch_lars`, `torch_lamb`) share: which
variables go through `torch._foreach_*`, the norms, the finiteness check."""

import keras
import torch


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


def squared_norms(tensors):
    """The squared L2 norm of each tensor, as one float32 vector."""
    if tensors[0].is_cuda:
        norms = torch.stack(torch._foreach_norm(tensors))
        return norms * norms
    # On CPU a BLAS dot per tensor reads it once; `_foreach_norm` is a loop
    # of `vector_norm` calls there (docs/benchmarks.md compares them).
    return torch.stack([torch.dot(t.reshape(-1), t.reshape(-1)) for t in tensors])


def norms(tensors, known=None):
    """The L2 norm of each tensor, as one float32 vector; `known` holds the
    squared norms computed earlier in the step (None where not), and is
    used when it holds them all."""
    if known is not None and all(s is not None for s in known):
        return torch.stack(list(known)).sqrt()
    return squared_norms(tensors).sqrt()


@torch.no_grad()
def check_finite(grads):
    """Returns `(finite, squares)`: whether every gradient is finite, from
    one read of each (a NaN or an infinity makes its squared norm
    non-finite; so does a finite one whose square overflows float32, which
    only skips a step), and each gradient's squared norm (None for a
    missing gradient)."""
    tensors = [keras.ops.convert_to_tensor(g) for g in grads if g is not None]
    if not tensors:
        return torch.tensor(True), [None] * len(grads)
    squares = squared_norms(tensors)
    found = iter(torch.unbind(squares))
    return (
        torch.isfinite(squares.sum()),
        [None if g is None else next(found) for g in grads],
    )


@torch.no_grad()
def unscale_and_check(grads, inverse):
    """Multiplies the float32 `grads` by `inverse` in place and returns
    whether all are finite: one pass, the kernel `torch.amp.GradScaler`
    uses."""
    tensors = [g for g in grads if g is not None]
    if not tensors:
        return torch.tensor(True)
    found_inf = torch.zeros(1, device=tensors[0].device)
    inverse = torch.as_tensor(inverse, dtype=torch.float32).reshape(1).to(found_inf.device)
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inverse)
    return found_inf[0] == 0
