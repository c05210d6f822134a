"""The layers' torch path: torch's own kernels on channels_last views.

An NHWC-contiguous tensor permuted to NCHW, `x.permute(0, 3, 1, 2)`, is an
NCHW tensor in torch's channels_last memory format: no data moves, and
torch's convolution, batch norm and pooling take it as it is and give
channels_last results, which `permute(0, 2, 3, 1)` turns back into NHWC
views. Keras 3.15's torch backend instead copies every activation into
NCHW, back into channels_last, and computes batch norm in five elementwise
ops after separately computed moments.

Imported only on the torch backend (`backend.torch_ops`).
"""

import torch
import torch.nn.functional as F


def same_padding(size, kernel, stride, dilation=1):
    """`(before, after)` of Keras' (and TensorFlow's) `"same"` padding:
    the output has `ceil(size / stride)` entries, the odd one is after."""
    effective = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + effective - size)
    return total // 2, total - total // 2


def conv2d(x, kernel, bias, strides, padding, dilation, groups):
    """`keras.ops.conv` of NHWC `x` with a `(kh, kw, in / groups, out)`
    kernel, plus `bias`, in one `F.conv2d`; an NHWC view back.

    `"same"` padding that is as long before as after is the convolution's
    own; an uneven one (a stride over an input it does not divide) pads `x`
    first, as Keras does.
    """
    pad = 0
    if padding == "same":
        pads = [same_padding(x.shape[1 + i], kernel.shape[i], strides[i],
                             dilation[i]) for i in range(2)]
        if all(a == b for a, b in pads):
            pad = tuple(a for a, _ in pads)
        else:
            (top, bottom), (left, right) = pads
            x = F.pad(x, (0, 0, left, right, top, bottom))
    # The layout the convolution wants for a channels_last input; converted
    # here, the backward pass reuses it instead of converting again.
    weight = kernel.permute(3, 2, 0, 1).contiguous(
        memory_format=torch.channels_last)
    y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, tuple(strides), pad,
                 tuple(dilation), groups)
    return y.permute(0, 2, 3, 1)


def batch_norm_train(x, axis, gamma, beta, epsilon):
    """Batch norm with the batch's statistics over all axes but `axis`:
    `(outputs, mean, variance)`, the variance biased (divided by the count,
    as Keras') and recovered from the inverse standard deviation
    `native_batch_norm` returns, `1 / invstd**2 - epsilon` (exact to float32
    rounding of `variance + epsilon`)."""
    perm = channels_second(x.ndim, axis)
    y, mean, invstd = torch.native_batch_norm(
        x.permute(perm), gamma, beta, None, None, True, 0.0, epsilon)
    variance = torch.reciprocal(invstd * invstd).sub_(epsilon)
    return y.permute(inverse(perm)), mean, variance


def batch_norm_infer(x, axis, mean, variance, gamma, beta, epsilon):
    """Batch norm with the given statistics, in one kernel."""
    perm = channels_second(x.ndim, axis)
    y = F.batch_norm(x.permute(perm), mean, variance, gamma, beta, False,
                     0.0, epsilon)
    return y.permute(inverse(perm))


def channels_second(ndim, axis):
    """The permutation that brings `axis` to 1, the others in order: for
    NHWC and `axis=-1`, `(0, 3, 1, 2)`."""
    axis %= ndim
    rest = [i for i in range(ndim) if i != axis]
    return (rest[0], axis, *rest[1:])


def inverse(perm):
    return tuple(sorted(range(len(perm)), key=perm.__getitem__))


def moving_average(moving, batch, momentum):
    """`moving * momentum + batch * (1 - momentum)`, in one op."""
    return torch.lerp(batch, moving, momentum)


def max_pool2d(x, pool_size, strides, pad):
    """Max pooling of NHWC `x` with symmetric (implicit `-inf`) padding
    `pad`; an NHWC view back."""
    y = F.max_pool2d(x.permute(0, 3, 1, 2), tuple(pool_size), tuple(strides),
                     tuple(pad))
    return y.permute(0, 2, 3, 1)
