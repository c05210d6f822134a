"""The report of the GPU check: `<out>.md` from the record (written by
bench's process pool, `bench/core/pool.py`), a table of the calls, then
each part's numbers against its targets."""


def by_part(record):
    """The record's tasks by part: {part: {"settings", "results": {name:
    result}, "failed": {name: {"error", "finished"}}}}, a task named
    'backend|model|optimizer' (part compiled's, and part layers' with
    `jit_compile=True`, with '|compiled'; part b's: its backend), a result with the `seconds` it took and when it
    `finished`, in the order they ended."""
    parts = {}
    for r in record.get("runs", []) + record.get("failed", []):
        part = parts.setdefault(r["part"], dict(
            settings=r.get("settings"), results={}, failed={}))
        name = "|".join(r[k] for k in ("run_backend", "model", "optimizer")
                        if k in r) + (
            "|compiled" if r["part"] == "compiled"
            or r.get("jit_compile") is True else "")
        if "error" in r:
            part["failed"][name] = dict(error=r["error"],
                                        finished=r["finished"])
        else:
            part["results"][name] = dict(r["result"], seconds=r[
                "wall_seconds"], finished=r["finished"])
    return parts


def markdown(record):
    """The tables of `record`."""
    parts = by_part(record)
    lines = ["# GPU campaign (`python -m bench.gpu_campaign`)", ""]
    if record.get("smoke"):
        lines += ["**Smoke run**: tiny sizes on whatever machine ran it; the "
                  "numbers measure nothing.", ""]
    lines += ["| started (UTC) | seconds | GPU | host | Python | versions "
              "| parts done | command |", "|---|---|---|---|---|---|---|---|"]
    for s in record.get("sessions", []):
        versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items() if v)
        missing = "".join(f"; {backend} not installed: {', '.join(p)}" for
                          backend, p in s.get("not_installed", {}).items())
        lines.append(
            f"| {s['started']} | {s.get('seconds', '')} | "
            f"{s['gpu'] or 'none'} | {s['host']} | {s['python']} | "
            f"{versions} | {', '.join(s['finished']) or '–'}"
            f"{missing} | `{s['command']}` |")
    if "layers" in parts:
        lines += _layers(parts["layers"])
    a = parts.get("a")
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
            lines.append(_target(
                f"LARSMixed / LSO(SGD) on {backend} >= {target}", lars and lso
                and lars["images_per_s"] / lso["images_per_s"], target))
        ours = [r for k, r in results.items()
                if k.startswith("jax|v") and k.endswith("|lso_sgd")]
        top = max(ours, key=lambda r: r["images_per_s"], default=None)
        lines.append("- our ResNet-50 on jax >= 6,500 images/s: " + (
            f"best {top['images_per_s']:,.1f} ({top['model']}), "
            f"**{_verdict(top['images_per_s'] >= 6500)}**" if top
            else "not measured"))
    b = parts.get("b")
    if b:
        from bench.micro.optimizer_step import PAIRS as pairs

        names = [n for pair in pairs for n in pair]
        lines += [
            "", "## b. Optimizer step (`bench/micro/optimizer_step.py`)", "",
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
    if "cuda" in parts:
        lines += ["", "## cuda. The fusion kernels' device test", "",
                  _cuda(parts["cuda"])]
    compiled = parts.get("compiled")
    if compiled:
        lines += _compiled(compiled, (a or {}).get("results", {}))
    c = record.get("c")
    if c and c.get("lines"):
        lines += ["", f"## c. The study plan `{c['plan']}` (record "
                  f"`{c['record']}.json`; complete: {c['complete']})", ""]
        lines += [f"- {line}" for line in c["lines"]]
    return "\n".join(lines) + "\n"


def _layers(layers):
    """Part layers' section: ResNet-50 of keras_largebatch.layers with
    LARSMixed, images/s on torch eager and compiled against JAX, and the
    issue's target (torch >= 0.7x JAX, on the same GPU)."""
    s = layers["settings"]
    lines = ["", "## layers. keras_largebatch.layers on torch against JAX "
             "(issue #59)", "",
             f"ResNet-50 of keras_largebatch.applications (v1) with "
             f"LARSMixed, {s['size']}x{s['size']}, batch {s['batch']}, "
             f"{s['precision']}, `fit` on one synthetic batch, median of "
             f"{s['steps']} steps after {s['warmup']}.", "",
             "| item | device | first step s | images/s | vs JAX |",
             "|---|---|---|---|---|"]
    results = layers.get("results", {})
    jax = next((r for k, r in results.items() if k.startswith("jax|")),
               None)
    lines += _items(layers, lambda key, r: [_ratio(r, jax)])
    lines += ["", "Targets (a JAX ratio only where both ran on the same "
              "GPU):"]
    for name, key in (("eager", "torch|v1|lars_mixed"),
                      ("compiled", "torch|v1|lars_mixed|compiled")):
        lines.append(_target(f"torch {name} / JAX >= 0.7",
                             _ratio(results.get(key), jax), 0.7))
    return lines


def _cuda(cuda):
    """Part cuda's line: the device test's command, status and last line."""
    if cuda["failed"]:
        return f"failed: {_error(next(iter(cuda['failed'].values())))}"
    cuda = next(iter(cuda["results"].values()))
    if cuda.get("skipped"):
        return "Skipped (the smoke run without nvcc or the Eigen headers)."
    return (f"`{cuda['command']}`: exit {cuda['returncode']}"
            f"{' (compiled only)' if cuda.get('compile_only') else ''}"
            f", {cuda['summary']}")


def _compiled(compiled, eager):
    """Part compiled's section: images/s and the time to the first step,
    against eager torch and JAX (part a), and its targets."""
    lines = ["", "## compiled. torch with `jit_compile=True`", "",
             "Part a's settings; the step Keras compiles with torch.compile. "
             "First step: from `fit`'s start to the end of its first step, "
             "compilation included; images/s: the steady steps after it.", "",
             "| item | device | first step s | images/s | vs eager torch "
             "(part a) | vs JAX (part a) |", "|---|---|---|---|---|---|"]
    results = compiled.get("results", {})

    def vs(key, r):
        _, model, optimizer, _ = key.split("|")
        return [_ratio(r, eager.get(f"{backend}|{model}|{optimizer}"))
                for backend in ("torch", "jax")]

    lines += _items(compiled, vs, columns=2)
    lso = results.get("torch|keras|lso_sgd|compiled")
    lars = results.get("torch|keras|lars_mixed|compiled")
    lines += ["", "Targets (ratios of images/s; a JAX ratio only where "
              "both ran on the same GPU):",
              _target("LARSMixed / LSO(SGD), compiled torch >= 0.97",
                      _ratio(lars, lso), 0.97)]
    for name, key, r in (("LSO(SGD)", "lso_sgd", lso),
                         ("LARSMixed", "lars_mixed", lars)):
        lines.append(_target(
            f"compiled torch / JAX, {name} >= 0.9 (the moonshot)",
            _ratio(r, eager.get(f"jax|keras|{key}")), 0.9))
    return lines


def _items(part, ratios, columns=1):
    """The rows of part layers' or compiled's items: each item's device,
    first step and images/s, and its `columns` `ratios(key, result)`; a
    failed item's error (its last line)."""
    lines = [f"| {key} | {r['device']} | {_number(r.get('first_step_s'))} | "
             f"{r['images_per_s']:,.1f} | "
             + " | ".join(_number(x, 3) for x in ratios(key, r)) + " |"
             for key, r in part.get("results", {}).items()]
    return lines + [f"| {key} | – | – | failed: {_error(r)[:200]} |"
                    + " – |" * columns
                    for key, r in part.get("failed", {}).items()]


def _error(failed):
    """A failed task's error, its last line."""
    return failed["error"].strip().splitlines()[-1]


def _ratio(r, base):
    """r's images/s over base's to 3 digits where both ran on the same GPU,
    else None."""
    if not r or not base or _gpu(r["device"]) != _gpu(base["device"]):
        return None
    return round(r["images_per_s"] / base["images_per_s"], 3)


def _target(claim, ratio, floor):
    """'- claim: ratio, **met**' (or 'not met'; 'not measured': no ratio)."""
    if ratio is None:
        return f"- {claim}: not measured"
    return f"- {claim}: {ratio:.3f}, **{_verdict(ratio >= floor)}**"


def _gpu(device):
    # JAX names it "gpu: NVIDIA H200", torch "NVIDIA H200".
    return device.split(": ", 1)[-1].strip().lower()


def _number(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def _verdict(holds):
    return "met" if holds else "not met"
