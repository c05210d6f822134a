"""`python -m keras_largebatch.distribute.cost_model`: the table, from flags."""

import json
import math

from keras_largebatch._shared import atomic_write
from keras_largebatch._shared import require
from keras_largebatch.distribute.cost_model.alpha_beta import MiB
from keras_largebatch.distribute.cost_model.alpha_beta import Network
from keras_largebatch.distribute.cost_model.alpha_beta import _check_gpus
from keras_largebatch.distribute.cost_model.alpha_beta import compare
from keras_largebatch.distribute.cost_model.alpha_beta import (
    inter_alpha_for_speedup,
)
from keras_largebatch.distribute.cost_model.fit import fit_alpha_beta
from keras_largebatch.distribute.cost_model.fit import load_timings
from keras_largebatch.distribute.cost_model.fit import measure_localhost
from keras_largebatch.distribute.cost_model.gradients import gradient_bytes

# Headline runs of the paper (abstract): ResNet-50, 90 epochs in 6.6 min on
# 2,048 P40s; AlexNet-BN, 95 epochs in 4 min on 1,024 P40s; we assume a 64K
# global batch for both. Their end-to-end time per step bounds the compute
# time per step from above: 32 / (90 * 1,281,167 / 396 s / 2048) = 225 ms and
# 64 / (95 * 1,281,167 / 240 s / 1024) = 129 ms.
DEFAULT_COMPUTE_MS = {"resnet50": 225.0, "alexnet_bn": 129.0}
PAPER_SPEEDUP_AT_1024 = {"resnet50": 11.0, "alexnet_bn": 3.0}


def describe(network):
    """One line: GPUs per node, latency and bandwidth of both links."""
    return (
        f"{network.gpus_per_node} GPUs/node, intra {network.intra_alpha * 1e6:g} us "
        f"{1e-9 / network.intra_beta:g} GB/s, inter {network.inter_alpha * 1e6:g} us "
        f"{1e-9 / network.inter_beta:g} GB/s"
    )


def format_table(rows):
    """A Markdown table of `compare` rows (milliseconds, MiB)."""
    lines = [
        "| GPUs | nodes | buckets | per-tensor ring (ms) | fused ring (ms) "
        "| fused hierarchical (ms) | hybrid (ms) | comm speedup "
        "| step speedup | best threshold (MiB) | top-k (ms) "
        "| top-k beats ring below density | ... hybrid below density |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        th = r["threshold"]
        th = "inf" if th == math.inf else f"{th / MiB:.1f}"
        lines.append(
            f"| {r['gpus']} | {r['nodes']} | {r['buckets']} "
            f"| {r['per_tensor'] * 1e3:.1f} | {r['ring'] * 1e3:.1f} "
            f"| {r['hierarchical'] * 1e3:.1f} | {r['hybrid'] * 1e3:.1f} "
            f"| {r['comm_speedup']:.1f}x | {r['step_speedup']:.1f}x | {th} "
            f"| {r['topk'] * 1e3:.1f} | {r['topk_crossover']:.3g} "
            f"| {r['topk_crossover_hybrid']:.3g} |"
        )
    return "\n".join(lines)


def define_flags(flag_values=None):
    """Defines the command's flags on `flag_values` (absl's global FLAGS)."""
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    gpus = [str(2**k) for k in range(3, 12)]
    for kind, name, default, help_ in (
        ("string", "model", "resnet50", "resnet50, alexnet_bn or a saved model path."),
        ("list", "gpus", gpus, "GPU counts (multiples of gpus_per_node)."),
        ("integer", "gpus_per_node", 8, "GPUs per node, g."),
        ("float", "intra_gbytes_per_s", 10.0, "Intra-node GB/s (PCIe 3.0 x16)."),
        ("float", "inter_gbytes_per_s", 12.5, "Inter-node GB/s (100 Gb/s EDR IB)."),
        ("float", "intra_latency_us", 5.0, "Intra-node latency per message, us."),
        ("float", "inter_latency_us", 10.0, "Inter-node latency per message, us."),
        ("integer", "fusion_threshold_bytes", 64 * MiB, "Fusion bucket size."),
        ("integer", "hierarchical_threshold_bytes", -1, "Hybrid's; -1: best."),
        ("float", "compute_ms", -1.0, "Compute per step, ms; -1: model default."),
        ("float", "overlap", 0.0, "Fraction of backward that hides comm."),
        ("float", "topk_density", 0.01, "Density of the top-k scheme."),
        ("string", "fit_from_json", None, "Fit alpha, beta from timings JSON."),
        ("bool", "measure_localhost", False, "Fit from a 2-worker TF loopback run."),
        ("string", "json_out", None, "Also write the rows as JSON here."),
    ):
        getattr(flags, f"DEFINE_{kind}")(name, default, help_, flag_values=fv)
    flags.DEFINE_enum(
        "dtype", "float32", ["float32", "float16"], "Gradient dtype on the wire.",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "fit_applies_to", "both", ["both", "intra", "inter"],
        "Links whose alpha, beta the fit replaces.", flag_values=fv,
    )
    return fv


def _parse_gpus(value):
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"`gpus` must be a list of ints. Received: gpus={value}"
        ) from None


def _network_from_flags(fv):
    for name in ("intra_gbytes_per_s", "inter_gbytes_per_s"):
        require(getattr(fv, name) > 0, name, getattr(fv, name), "> 0")
    return Network(
        gpus_per_node=fv.gpus_per_node,
        intra_alpha=fv.intra_latency_us * 1e-6,
        intra_beta=1 / (fv.intra_gbytes_per_s * 1e9),
        inter_alpha=fv.inter_latency_us * 1e-6,
        inter_beta=1 / (fv.inter_gbytes_per_s * 1e9),
    )


def run(fv):
    """Computes and prints the table for parsed flags `fv`; returns rows."""
    network = _network_from_flags(fv)
    gpus = [_parse_gpus(p) for p in fv.gpus]
    for p in gpus:
        _check_gpus(p, network)
    tensor_bytes = gradient_bytes(fv.model, 2 if fv.dtype == "float16" else 4)
    timings = None
    if fv.measure_localhost:
        timings = measure_localhost()
    elif fv.fit_from_json:
        timings = load_timings(fv.fit_from_json)
    if timings is not None:
        alpha, beta = fit_alpha_beta(timings)
        print(
            f"fitted alpha = {alpha * 1e6:.1f} us, 1/beta = {1e-9 / beta:.3f} "
            f"GB/s from {len(timings)} timings"
        )
        if fv.fit_applies_to in ("both", "intra"):
            network = network._replace(intra_alpha=alpha, intra_beta=beta)
        if fv.fit_applies_to in ("both", "inter"):
            network = network._replace(inter_alpha=alpha, inter_beta=beta)
    compute_ms = fv.compute_ms
    if compute_ms < 0:
        compute_ms = DEFAULT_COMPUTE_MS.get(fv.model, 0.0)
    threshold = fv.hierarchical_threshold_bytes
    kwargs = dict(
        fusion_threshold_bytes=fv.fusion_threshold_bytes,
        compute_seconds=compute_ms * 1e-3,
        overlap=fv.overlap,
        hierarchical_threshold_bytes=None if threshold < 0 else threshold,
        topk_density=fv.topk_density,
        element_bytes=2 if fv.dtype == "float16" else 4,
    )
    rows = [compare(tensor_bytes, p, network, **kwargs) for p in gpus]
    print(
        f"{fv.model}: {len(tensor_bytes)} tensors, "
        f"{sum(tensor_bytes) / MiB:.1f} MiB ({fv.dtype}); {describe(network)}; "
        f"compute {compute_ms:g} ms/step, overlap {fv.overlap:g}"
    )
    print(format_table(rows))
    for r in rows:
        th = "inf" if r["threshold"] == math.inf else r["threshold"]
        print(f"best hierarchical_threshold_bytes at {r['gpus']} GPUs: {th}")
    for r in rows:
        print(
            f"top-k ({r['topk'] * 1e3:.1f} ms at density {fv.topk_density:g})"
            f" beats the fused ring at {r['gpus']} GPUs below density "
            f"{r['topk_crossover']:.4g}, the hybrid below "
            f"{r['topk_crossover_hybrid']:.4g}; step speedup over the "
            f"hybrid {r['topk_step_speedup']:.2f}x"
        )
    claim = PAPER_SPEEDUP_AT_1024.get(fv.model)
    if claim and compute_ms > 0 and 1024 % network.gpus_per_node == 0:
        alpha = inter_alpha_for_speedup(tensor_bytes, 1024, network, claim, **kwargs)
        where = "none in [0, 1 ms]" if alpha is None else f"{alpha * 1e6:.1f} us"
        print(
            f"paper: {claim:g}x at 1024 GPUs; inter-node latency that "
            f"reproduces it here: {where}"
        )
    if fv.json_out:
        finite = [
            {k: (None if v == math.inf else v) for k, v in r.items()} for r in rows
        ]
        atomic_write(fv.json_out, json.dumps(
            {"network": network._asdict(), "timings": timings, "rows": finite},
            indent=1,
        ))
    return rows


def main(argv):
    """absl main: runs on the global FLAGS (see `__main__.py`)."""
    from absl import app
    from absl import flags

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    run(flags.FLAGS)
