"""`bench/batch_scaling_study.py`: the seeds aggregated as the study page
reads them (hand-computed values), the crossing of a target interpolated
between evaluations, and the plan's order (sweeps, then a bracket extended
at an edge, then seeds of the best rate)."""

import importlib.util
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


@pytest.fixture(scope="module")
def study():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    spec = importlib.util.spec_from_file_location(
        "batch_scaling_study", os.path.join(ROOT, "bench",
                                            "batch_scaling_study.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(study, batch, rate, seed, final, evals, kind="fixed"):
    spec = (study.fixed_spec(batch, rate, seed) if kind == "fixed"
            else study.grown_spec(kind, seed))
    return dict(spec, val_accuracy=final, evals=evals, num_train=60000,
                updates=None)


def test_target_crossing_is_interpolated_between_evaluations(study):
    evals = [(0.25, 100, 0.80), (0.5, 200, 0.86), (0.75, 300, 0.91),
             (1.0, 400, 0.89)]
    # 0.90 lies 4/5 of the way from 0.86 (200) to 0.91 (300): 280.
    assert study.updates_to(evals, 0.90) == pytest.approx(280.0)
    # 0.88: 1/3 of the way: 233.33.
    assert study.updates_to(evals, 0.88) == pytest.approx(200 + 100 / 2.5)
    # Reached at the first evaluation: from (0 updates, accuracy 0).
    assert study.updates_to(evals, 0.40) == pytest.approx(50.0)
    assert study.updates_to(evals, 0.92) is None


def test_median_counts_a_seed_that_never_gets_there_as_infinite(study):
    assert study.median_updates([300.0, None, 100.0]) == 300.0
    assert study.median_updates([300.0, None, 100.0, 200.0]) == 250.0
    # Two of three never: the median itself is infinite.
    assert study.median_updates([None, None, 100.0]) is None
    assert study.median_updates([]) is None


def test_seeds_are_aggregated_with_mean_spread_and_median(study):
    curve = {0: [(1, 100, 0.85), (2, 200, 0.905)],
             1: [(1, 100, 0.89), (2, 200, 0.90)],
             2: [(1, 100, 0.80), (2, 200, 0.87)]}
    finals = {0: 0.905, 1: 0.90, 2: 0.87}
    runs = [_run(study, 512, 0.4, s, finals[s], curve[s]) for s in (2, 0, 1)]
    s = study.summarize(runs)[("fixed", 24, 512, 0.4, None)]
    assert s["n"] == 3 and s["seeds"] == [0, 1, 2]
    assert s["mean"] == pytest.approx((0.905 + 0.90 + 0.87) / 3)
    # Sample standard deviation: deviations 0.13/3, 0.115/3 and -0.245/3
    # ... computed by hand from the three finals.
    m = (0.905 + 0.90 + 0.87) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in finals.values()) / 2)
    assert s["sd"] == pytest.approx(sd)
    # Updates to 0.90: seed 0 crosses at 100 + 100 * 0.05/0.055, seed 1 at
    # 100 + 100 * 0.01/0.01 = 200 (0.89 -> 0.90), seed 2 never.
    to0 = 100 + 100 * (0.05 / 0.055)
    assert s["updates_to"][0.90][0] == pytest.approx(to0)
    assert s["updates_to"][0.90][1] == pytest.approx(200.0)
    assert s["updates_to"][0.90][2] is None
    assert s["median_to"][0.90] == pytest.approx(200.0)
    assert s["reached"] == {0.88: 2, 0.90: 2}
    # One seed: no spread.
    one = study.summarize(runs[:1])[("fixed", 24, 512, 0.4, None)]
    assert one["sd"] is None and one["n"] == 1


def test_plan_extends_a_bracket_at_its_edge_then_seeds_the_best(study):
    batch = 512
    rates = study.sweep_rates(batch)
    assert rates == pytest.approx([0.2, 0.4, 0.8, 1.6])
    # The highest rate reaches 0.90 first: the sweep is extended upwards.
    runs = [_run(study, batch, r, 0, 0.90, [(1, 100 * (5 - i), 0.905)])
            for i, r in enumerate(rates)]
    specs = [s for s in study.plan(runs) if s["batch"] == batch]
    assert (specs[0]["rate"], specs[0]["seed"]) == (pytest.approx(3.2), 0)
    # Bracketed (3.2 worse than 1.6): seeds 1 and 2 of 1.6.
    runs.append(_run(study, batch, 3.2, 0, 0.85, [(1, 400, 0.86)]))
    specs = [s for s in study.plan(runs) if s["batch"] == batch
             and s["epochs"] == study.EPOCHS]
    assert [(s["rate"], s["seed"]) for s in specs] == [
        (pytest.approx(1.6), 1), (pytest.approx(1.6), 2)]
    # A sweep with a run in flight waits.
    busy = [study.fixed_spec(1024, 0.4, 0)]
    assert all(s != busy[0] for s in study.plan(runs, busy))


def test_grown_runs_carry_the_adaptive_flags(study):
    argv = study.train_argv(study.grown_spec("c2", 0), "runs")
    assert "--global_batch_size=128" in argv
    assert "--gradient_accumulation_steps=2" in argv
    assert "--adaptive_batch=noise_scale" in argv
    assert "--max_global_batch_size=4096" in argv
    assert "--noise_scale_multiple=2.0" in argv
    assert "--evals_per_epoch=4" in argv
    fixed = study.train_argv(study.fixed_spec(2048, 0.8, 1), "runs")
    assert "--gradient_accumulation_steps=8" in fixed
    assert "--global_batch_size=2048" in fixed
