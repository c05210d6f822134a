"""`python -m bench.gpu_campaign --smoke`: every part runs, on JAX and
torch, through bench's process pool, and lands in the record and the
Markdown (the GPU numbers need a GPU; this only proves the code that
measures them runs). A backend that is not installed is said and left for
later; part c hands a study plan to the pool (LARS at depth on a GPU)."""

import json
import re
import subprocess

import keras
import pytest

import bench
from bench.core import records
from bench.core import runspec
from bench.gpu_campaign import plan as gpu_plan
from bench.gpu_campaign.report import by_part
from bench.gpu_campaign.report import markdown
from bench.study import engine
from keras_largebatch.train import data

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="the campaign drives JAX and torch in processes of its own; "
           "run once, under the JAX suite")


@pytest.fixture
def campaign_module():
    """The GPU check's command (`bench/gpu_campaign/__main__.py`)."""
    from bench.gpu_campaign import __main__ as campaign

    return campaign


@pytest.mark.skipif(data.find_fashion_mnist() is None,
                    reason="the smoke's study trains on Fashion-MNIST "
                           "(dataset-fashion-mnist)")
def test_smoke_campaign_fills_every_part(tmp_path):
    out = tmp_path / "campaign"
    command = bench.command("bench.gpu_campaign", "--smoke", "--out", out)
    proc = subprocess.run(command, cwd=tmp_path, env=bench.environ(),
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "campaign complete" in proc.stdout

    record = json.loads(out.with_suffix(".json").read_text())
    # The layers' part first, then the compiled torch step before any
    # eager torch item of part a.
    assert record["smoke"] and record["sessions"][-1]["finished"] == [
        "layers", "compiled", "a", "b", "cuda", "c"]
    # Each task is the smoke plan's, recorded by the runner with its machine.
    planned = {runspec.run_key(s) for s in gpu_plan.GPU_SMOKE.specs}
    assert {runspec.run_key(r) for r in record["runs"]} == planned
    assert all(r["machine"] for r in record["runs"])
    parts = by_part(record)
    a = parts["a"]["results"]
    assert {k.split("|")[0] for k in a} == {"jax", "torch"}
    assert all(r["images_per_s"] > 0 for r in a.values())
    assert {"lso_sgd", "lars_mixed", "lamb_mixed"} == {
        k.split("|")[2] for k in a}
    b = parts["b"]["results"]
    assert set(b) == {"jax", "torch"}
    assert all(r["LARSMixed"] > 0 and r["LSO(SGD)"] > 0 for r in b.values())
    compiled = parts["compiled"]
    assert not compiled["failed"], compiled["failed"]
    first = compiled["results"]["torch|cifar8|lars_mixed|compiled"]
    assert first["images_per_s"] > 0
    # The time to the first step (compilation) is kept apart.
    assert first["first_step_s"] > 0
    assert all(r["first_step_s"] > 0 for r in a.values())
    c = record["c"]
    assert c["complete"] and c["plan"] == "smoke"
    # Part c's runs are the study runner's, in the plan's own record.
    runs = json.loads((tmp_path / "smoke_study.json").read_text())["runs"]
    assert {r["kind"] for r in runs} == {"fixed", "grown"}
    assert all(r["backend"] == "jax" and r["evals"] for r in runs)

    table = out.with_suffix(".md").read_text()
    for heading in ("## a. ResNet-50 training throughput",
                    "## b. Optimizer step", "## cuda.", "## compiled.",
                    "## c. The study plan `smoke`"):
        assert heading in table
    assert "LARSMixed / LSO(SGD) on torch >= 0.97:" in table
    assert "LARSMixed / LSO(SGD), compiled torch >= 0.97:" in table
    assert "compiled torch / JAX, LSO(SGD) >= 0.9 (the moonshot):" in table

    # A rerun finds every part done and measures nothing again.
    again = subprocess.run(command, cwd=tmp_path, env=bench.environ(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not re.search(r"^(compiled|a|b|cuda|c) start ", again.stdout,
                         re.M), again.stdout
    path = str(out.with_suffix(".json"))
    assert records.load(path) == record["runs"] and not records.failures(path)
    assert json.loads((tmp_path / "smoke_study.json").read_text())[
        "runs"] == runs


def test_backend_not_installed_is_said_and_its_items_wait(
        tmp_path, capsys, monkeypatch, campaign_module):
    args = campaign_module.parse_args(["--smoke", "--out", str(tmp_path / "c")])
    spec = dict(gpu_plan.GPU_SMOKE.specs[1], run_backend="no_such_backend")
    monkeypatch.setattr(campaign_module, "part_specs", lambda part, a: [spec])
    session = dict(started="", command="", gpu=None, host="", python="",
                   versions={}, finished=[])

    assert campaign_module.run_part("a", args, float("inf"), None, session)
    assert "no_such_backend is not installed here: its 1 run(s) wait" \
        in capsys.readouterr().out
    assert records.read(str(tmp_path / "c.json")) == {}
    assert session["not_installed"] == {"no_such_backend": ["a"]}
    assert session["finished"] == []
    assert "no_such_backend not installed: a" in markdown(
        dict(sessions=[session]))


def test_the_layers_measurement_of_issue_59_comes_first_in_the_check(
        campaign_module):
    args = campaign_module.parse_args(["--out", "c", "--compiled_seconds",
                                       "300"])
    assert args.parts[0] == "layers"
    first = gpu_plan.GPU_CHECK.specs[:3]
    assert all(s["part"] == "layers" for s in first)
    assert {(s["run_backend"], s["jit_compile"]) for s in first} == {
        ("torch", "auto"), ("torch", True), ("jax", "auto")}
    for s in first:
        assert (s["model"], s["optimizer"]) == ("v1", "lars_mixed")
        assert (s["settings"]["size"], s["settings"]["batch"],
                s["settings"]["precision"]) == (224, 256, "mixed_float16")
    assert len({runspec.run_key(s) for s in first}) == 3
    specs = campaign_module.part_specs("layers", args)
    assert [s.get("limit_seconds") for s in specs] == [None, 300, None]
    # The smoke runs the eager items at tiny sizes; the compiled one at
    # those sizes is part compiled's smoke item, the same run.
    smoke = [s for s in gpu_plan.GPU_SMOKE.specs if s["part"] == "layers"]
    assert [(s["run_backend"], s["jit_compile"]) for s in smoke] == [
        (s["run_backend"], s["jit_compile"]) for s in first
        if s["jit_compile"] is not True]
    (compiled,) = [s for s in gpu_plan.GPU_SMOKE.specs
                   if s["part"] == "compiled"]
    assert (compiled["run_backend"], compiled["model"],
            compiled["optimizer"], compiled["settings"]) == (
        "torch", smoke[0]["model"], smoke[0]["optimizer"],
        smoke[0]["settings"])


def test_report_compares_the_layers_on_torch_with_jax():
    runs = [_run("layers", "jax|v1|lars_mixed", 4000.0, "gpu: NVIDIA H200"),
            _run("layers", "torch|v1|lars_mixed", 2000.0, "NVIDIA H200"),
            dict(_run("layers", "torch|v1|lars_mixed", 3000.0, "NVIDIA H200",
                      60.0), jit_compile=True)]
    table = markdown(dict(runs=runs))
    assert "| torch|v1|lars_mixed|compiled | NVIDIA H200 | 60.0 | 3,000.0 "         "| 0.750 |" in table
    assert "- torch eager / JAX >= 0.7: 0.500, **not met**" in table
    assert "- torch compiled / JAX >= 0.7: 0.750, **met**" in table


def test_compiled_part_runs_first_with_a_time_limit_for_torch_compile(
        campaign_module):
    args = campaign_module.parse_args(["--out", "c", "--compiled_seconds",
                                       "300"])
    assert args.parts.index("compiled") < args.parts.index("a")
    assert gpu_plan.COMPILED_SECONDS >= 300  # torch.compile of ResNet-50.
    specs = campaign_module.part_specs("compiled", args)
    assert specs and all(s["limit_seconds"] == 300 for s in specs)
    assert "limit_seconds" not in campaign_module.part_specs("a", args)[0]


def _run(part, name, images, device, first=None):
    backend, model, optimizer = name.split("|")
    return dict(part=part, run_backend=backend, model=model,
                optimizer=optimizer, settings=gpu_plan.A_SETTINGS,
                wall_seconds=1.0, finished="2026-11-27T00:00:00+00:00",
                result=dict(images_per_s=images, median_step_s=256 / images,
                            device=device, model="m", optimizer="o",
                            first_step_s=first))


def test_report_compares_compiled_torch_with_eager_and_jax():
    record = dict(runs=[
        _run("a", "jax|keras|lso_sgd", 6000.0, "gpu: NVIDIA H200"),
        _run("a", "torch|keras|lso_sgd", 1000.0, "NVIDIA H200"),
        _run("a", "torch|keras|lars_mixed", 1010.0, "NVIDIA H200"),
        _run("compiled", "torch|keras|lso_sgd", 5500.0, "NVIDIA H200", 95.0),
        _run("compiled", "torch|keras|lars_mixed", 5000.0, "NVIDIA H100",
             80.0)])
    table = markdown(record)
    assert ("| torch|keras|lso_sgd|compiled | NVIDIA H200 | 95.0 | 5,500.0 | "
            "5.500 | 0.917 |") in table
    assert "compiled torch / JAX, LSO(SGD) >= 0.9 (the moonshot): 0.917, " \
        "**met**" in table
    # Another GPU's numbers are not compared.
    assert "LARSMixed / LSO(SGD), compiled torch >= 0.97: not measured" in table
    assert "compiled torch / JAX, LARSMixed >= 0.9 (the moonshot): not " \
        "measured" in table


# A record of before the runner (2026-11-26): each part's results and
# failures by name, part cuda one dict.
def test_part_c_runs_lars_at_depth_side_by_side_by_default(campaign_module):
    args = campaign_module.parse_args(["--out", "c"])
    assert (args.study_plan, args.study_workers) == ("depth", 12)
    smoke = campaign_module.parse_args(["--smoke", "--out", "c"])
    assert (smoke.study_plan, smoke.study_workers) == ("smoke", 2)
    assert args.study_plan in engine.PLANS
