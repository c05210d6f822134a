"""The report of `bench/gpu_campaign.py`: `<out>.md` from the record.

A table of the calls (device, host, versions, command), then one section
per part: a's images/s and its targets, b's optimizer-step times and
ratios, c's study report (`bench/large_batch_study.py`'s `report`, also
written to `<out>_study.md`) and the grown-batch runs.
"""

import gpu_campaign_parts as parts


def markdown(record, study_path):
    """The tables of `record`; part c's study report is also written to
    `study_path`."""
    lines = ["# GPU campaign (`bench/gpu_campaign.py`)", ""]
    if record.get("smoke"):
        lines += ["**Smoke run**: tiny sizes on whatever machine ran it; the "
                  "numbers measure nothing.", ""]
    lines += ["| started (UTC) | seconds | GPU | host | Python | versions "
              "| parts done | command |", "|---|---|---|---|---|---|---|---|"]
    for s in record.get("sessions", []):
        versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items() if v)
        lines.append(
            f"| {s['started']} | {s.get('seconds', '')} | "
            f"{s['gpu'] or 'none'} | {s['host']} | {s['python']} | "
            f"{versions} | {', '.join(s['finished']) or '–'}"
            f"{_not_installed(s)} | `{s['command']}` |")
    a = record.get("a")
    if a:
        s = a["settings"]
        lines += [
            "", "## a. ResNet-50 training throughput", "",
            f"{s['size']}x{s['size']}, batch {s['batch']}, {s['precision']}, "
            f"one synthetic batch on the device, the step `fit` compiles, "
            f"median of {s['steps']} steps after {s['warmup']} warm-up steps.",
            "", "| backend | device | model | optimizer | images/s | median "
            "step ms | vs the backend's Keras ResNet50 + LSO(SGD) |",
            "|---|---|---|---|---|---|---|"]
        results = a["results"]
        for key, r in results.items():
            backend = key.split("|")[0]
            base = results.get(f"{backend}|keras|lso_sgd")
            ratio = f"{r['images_per_s'] / base['images_per_s']:.3f}" if base else "–"
            lines.append(
                f"| {backend} | {r['device']} | {r['model']} | "
                f"{r['optimizer']} | {r['images_per_s']:,.1f} | "
                f"{1000 * r['median_step_s']:.1f} | {ratio} |")
        lines += ["", "Targets:"]
        for backend, target in (("jax", 0.99), ("torch", 0.97)):
            lso = results.get(f"{backend}|keras|lso_sgd")
            lars = results.get(f"{backend}|keras|lars_mixed")
            if lso and lars:
                ratio = lars["images_per_s"] / lso["images_per_s"]
                lines.append(f"- LARSMixed / LSO(SGD) on {backend} >= {target}:"
                             f" {ratio:.3f}, **{_verdict(ratio >= target)}**")
            else:
                lines.append(f"- LARSMixed / LSO(SGD) on {backend} >= {target}:"
                             " not measured")
        ours = [r for k, r in results.items()
                if k.startswith("jax|v") and k.endswith("|lso_sgd")]
        if ours:
            top = max(ours, key=lambda r: r["images_per_s"])
            lines.append(f"- our ResNet-50 on jax >= 6,500 images/s: best "
                         f"{top['images_per_s']:,.1f} ({top['model']}), "
                         f"**{_verdict(top['images_per_s'] >= 6500)}**")
        else:
            lines.append("- our ResNet-50 on jax >= 6,500 images/s: not "
                         "measured")
    b = record.get("b")
    if b:
        pairs = [("LARS", "SGD"), ("LARSMixed", "LSO(SGD)"), ("LAMB", "Adam"),
                 ("LAMBMixed", "LSO(Adam)")]
        names = [n for pair in pairs for n in pair]
        lines += [
            "", "## b. Optimizer step (`bench/optimizer_step.py`)", "",
            f"ResNet-50's trainable variables, median of "
            f"{b['settings']['steps']} steps, wall-clock ms.", "",
            "| backend | device | " + " | ".join(names) + " | "
            + " | ".join(f"{x}/{y}" for x, y in pairs) + " |",
            "|---" * (2 + len(names) + len(pairs)) + "|"]
        floors = []
        for backend, r in b["results"].items():
            ms = [f"{r[n]:.2f}" if n in r else "–" for n in names]
            ratios = [f"{r[x] / r[y]:.2f}" if x in r and y in r else "–"
                      for x, y in pairs]
            lines.append(f"| {backend} | {r['device']} | " + " | ".join(ms)
                         + " | " + " | ".join(ratios) + " |")
            for rule, base in (("LARS", "SGD"), ("LAMB", "Adam")):
                if f"floor_{rule}" in r:
                    x, y = r[f"floor_{rule}"], r[f"floor_{base}"]
                    floors.append(f"- floor on {backend}, minimal jitted JAX "
                                  f"{rule}/{base}: {x:.2f} / {y:.2f} ms = "
                                  f"{x / y:.2f}")
        lines += [""] + floors if floors else []
    c = record.get("c")
    if c and c.get("runs"):
        study = parts.bench_module("large_batch_study")
        s = c["settings"]
        lines += [
            "", "## c. Large-batch study", "",
            f"Passes: {s['passes']}; "
            f"{'complete' if c.get('complete') else 'not complete'}.", ""]
        text = study.report(c, study_path)
        lines += ["#" + line if line.startswith("#") else line
                  for line in text.splitlines()]
    if c and c.get("grown_runs"):
        lines += grown(c)
    return "\n".join(lines) + "\n"


def grown(c):
    """The grown-batch runs of part c, one row each."""
    g, s = c["settings"]["grown"], c["settings"]
    lines = [
        "", "### c. Grown batches", "",
        f"From {s['small_batch']} ({g['accumulation']} micro-batches) up to "
        f"{s['small_batch'] * g['max_factor']}: `--adaptive_batch` "
        f"{' and '.join(g['policies'])}.", "",
        "| policy | optimizer | phase | epochs | peak rate | seed | final val "
        "acc | updates | batch by epoch | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(c["grown_runs"], key=lambda r: (
            r["policy"], r["optimizer"], r["epochs"], r["rate"], r["seed"])):
        batches = ", ".join(str(b) for b in r.get("batch_per_epoch") or [])
        updates = "–" if r.get("updates") is None else f"{r['updates']:,}"
        lines.append(
            f"| {r['policy']} | {r['optimizer']} | "
            f"{r['phase'].rsplit('_', 1)[1]} | {r['epochs']} | "
            f"{r['rate']:.4g} | {r['seed']} | {r['val_accuracy']:.4f} | "
            f"{updates} | {batches} | {r['wall_seconds']:.0f} |")
    return lines


def _not_installed(session):
    missing = session.get("not_installed") or {}
    return "".join(f"; {backend} not installed: {', '.join(p)}"
                   for backend, p in missing.items())


def _verdict(holds):
    return "met" if holds else "not met"


def brief(r):
    """One result in a few words, for the progress lines."""
    if "images_per_s" in r:
        return f"{r['images_per_s']:.1f} images/s on {r['device']}"
    return ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()
                     if isinstance(v, float) and not k.endswith("_cpu"))
