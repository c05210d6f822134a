"""`bench/batch_scaling_study.py`: the seeds aggregated as the study page
reads them (hand-computed values), the crossing of a target interpolated
between evaluations, and the plan's order (sweeps, then a bracket extended
at an edge, then seeds of the best rate)."""

import math

import pytest


@pytest.fixture(scope="module")
def study(bench_module):
    return bench_module("batch_scaling_study")


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
    s = study.summarize(runs)[("fixed", 24, 512, 0.4, None, "sgd")]
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
    one = study.summarize(runs[:1])[("fixed", 24, 512, 0.4, None, "sgd")]
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
             and s["epochs"] == study.EPOCHS and s["optimizer"] == "sgd"]
    assert [(s["rate"], s["seed"]) for s in specs] == [
        (pytest.approx(1.6), 1), (pytest.approx(1.6), 2)]
    # `--tuned_seeds 4`: seed 3 too.
    study.configure(TUNED_SEEDS=[0, 1, 2, 3])
    try:
        specs = [s for s in study.plan(runs) if s["batch"] == batch
                 and s["epochs"] == study.EPOCHS and s["optimizer"] == "sgd"]
        assert [s["seed"] for s in specs] == [1, 2, 3]
    finally:
        study.configure(TUNED_SEEDS=list(study.SEEDS))
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
    assert "--adaptive_start_multiple=1" in argv  # the previous defaults
    default = study.train_argv(study.grown_spec("default", 0), "runs")
    # Today's defaults: nothing but the policy beside the small batch.
    assert [a for a in default if "adaptive" in a or "noise" in a
            or "max_global" in a] == ["--adaptive_batch=noise_scale"]
    capped = study.train_argv(
        study.grown_spec("start4_c4_linear_1024", 0), "runs")
    assert [a for a in capped if a.startswith("--max_global_batch_size")] \
        == ["--max_global_batch_size=1024"]
    assert "--adaptive_learning_rate=linear" in capped
    # Starting at 4 x 128 under the linear rule: the rate 4 x 0.2.
    assert "--global_batch_size=512" in capped
    assert "--base_learning_rate=0.8" in capped
    assert "--gradient_accumulation_steps=8" in capped
    fixed = study.train_argv(study.fixed_spec(2048, 0.8, 1), "runs")
    assert "--gradient_accumulation_steps=8" in fixed
    assert "--global_batch_size=2048" in fixed


def test_plan_ends_with_the_normalised_optimizer_swept_seeded_and_grown(study):
    # LARSMixed's sweep at 512: 14.14 * sqrt(512 / 128) = 28.28, 2x apart.
    assert study.sweep_rates(512, "lars_mixed") == pytest.approx(
        [7.071, 14.142, 28.284, 56.569], rel=1e-3)
    specs = list(study.plan([]))
    kinds = [s["optimizer"] for s in specs]
    # Every SGD step comes first.
    assert kinds == sorted(kinds, key=lambda o: o != "sgd")
    lars = [s for s in specs if s["optimizer"] == "lars_mixed"]
    assert {(s["batch"], round(s["rate"], 3)) for s in lars
            if s["kind"] == "fixed"} == {
        (b, round(r, 3)) for b in study.BATCHES
        for r in study.sweep_rates(b, "lars_mixed")}
    grown = [s for s in lars if s["kind"] == "grown"]
    assert [(s["variant"], s["seed"], s["rate"]) for s in grown] == [
        (variant, seed, pytest.approx(study.NORMALISED_RATE))
        for variant, _ in study.NORMALISED_GROWN
        for seed in study.NORMALISED_GROWN_SEEDS]
    start1 = study.train_argv(grown[-1], "runs")
    assert "--adaptive_start_multiple=1" in start1
    assert "--adaptive_learning_rate=unchanged" in start1
    argv = study.train_argv(grown[0], "runs")
    assert "--optimizer=lars_mixed" in argv
    assert "--adaptive_batch=noise_scale" in argv
    assert not any(a.startswith("--adaptive_learning_rate") for a in argv)
    # A swept LARSMixed batch whose best is inside: its seed 1 follows.
    rates = study.sweep_rates(1024, "lars_mixed")
    runs = [dict(study.fixed_spec(1024, r, 0, optimizer="lars_mixed"),
                 val_accuracy=0.9, num_train=60000, updates=None,
                 evals=[(1, 100 * (1 + abs(i - 1)), 0.905)])
            for i, r in enumerate(rates)]
    seeded = [s for s in study.plan(runs) if s["optimizer"] == "lars_mixed"
              and s["batch"] == 1024]
    assert [(s["rate"], s["seed"]) for s in seeded] == [
        (pytest.approx(rates[1]), 1)]


def test_second_workload_sweeps_around_the_24_epoch_best_then_seeds(study):
    # 1,024's 24-epoch best is 0.8 (inside its bracket, seeds done).
    rates = study.sweep_rates(1024)
    runs = [_run(study, 1024, r, s, 0.90, [(1, 100 * (1 + abs(i - 1)), 0.905)])
            for i, r in enumerate(rates) for s in (0, 1, 2) if s == 0 or i == 1]
    second = [s for s in study.plan(runs) if s["epochs"] == study.SECOND_EPOCHS
              and s["batch"] == 1024 and s["optimizer"] == "sgd"]
    assert [(s["rate"], s["seed"]) for s in second] == [
        (pytest.approx(0.4), 0), (pytest.approx(0.8), 0),
        (pytest.approx(1.6), 0)]
    twelve = [dict(study.fixed_spec(1024, r, 0, study.SECOND_EPOCHS),
                   val_accuracy=0.89, num_train=60000, updates=None,
                   evals=[(1, 100 * (3 - i), 0.905)])
              for i, r in enumerate((0.4, 0.8, 1.6))]
    second = [s for s in study.plan(runs + twelve)
              if s["epochs"] == study.SECOND_EPOCHS and s["batch"] == 1024]
    # 1.6 reached the target first at 12 epochs: its seeds 1 and 2.
    assert [(s["rate"], s["seed"]) for s in second] == [
        (pytest.approx(1.6), 1), (pytest.approx(1.6), 2)]
    grown = [s for s in study.plan(runs) if s["kind"] == "grown"
             and s["epochs"] == study.SECOND_EPOCHS]
    assert [(s["variant"], s["seed"]) for s in grown] == [
        ("default", 0), ("default", 1), ("default", 2)]
    # The small batch at 12 epochs: the accuracy the floor keeps there.
    small = [s for s in study.plan(runs) if s["kind"] == "fixed"
             and s["batch"] == study.SMALL_BATCH
             and s["epochs"] == study.SECOND_EPOCHS]
    assert [(s["rate"], s["seed"]) for s in small] == [
        (study.SMALL_RATE, 0), (study.SMALL_RATE, 1), (study.SMALL_RATE, 2)]


def test_accuracy_by_epoch_is_the_mean_over_seeds(study):
    # Two configurations at 24 epochs: fixed 512 with 3 seeds (listed), a
    # grown one with 2 (left out: fewer than 3 seeds).
    curves = {0: 0.80, 1: 0.83, 2: 0.89}
    runs = [dict(_run(study, 512, 1.6, seed, 0.9, []),
                 val_accuracy_per_epoch=[base + e / 1000 for e in range(24)])
            for seed, base in curves.items()]
    runs += [dict(_run(study, 128, 0.2, seed, 0.9, [], kind="default"),
                  val_accuracy_per_epoch=[0.5] * 24) for seed in (0, 1)]
    lines = study._by_epoch(runs)
    row = next(line for line in lines if line.startswith("| fixed 512"))
    # Epoch 4 is index 3: mean(0.803, 0.833, 0.893) = 0.843; epoch 24 is
    # index 23: 0.863.
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "3"
    assert cells[2] == "0.8430" and cells[-1] == "0.8630"
    assert not any(line.startswith("| grown") for line in lines)


def test_paired_differences_are_seed_by_seed_on_one_machine(study):
    def run(variant, seed, final, crossing, machine="cpu"):
        return dict(_run(study, 128, 0.2, seed, final,
                         [(1, crossing - 100, 0.85), (2, crossing, 0.90)],
                         kind=variant), machine=machine)

    runs = [run("start4_c4_linear_1024", 0, 0.9050, 900),
            run("start4_c4_linear_1024", 1, 0.9020, 1000),
            run("start4_c4_linear_1024", 2, 0.9100, 800),
            run("anneal", 0, 0.9080, 900), run("anneal", 1, 0.9030, 1100),
            # Another machine's seed 2: not the base's twin, left out.
            run("anneal", 2, 0.9000, 800, machine="gpu")]
    row = next(line for line in study._paired(runs)
               if line.startswith("| anneal |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # +0.0030 and +0.0010: mean +0.0020, sample sd 0.0014142.
    assert cells[3] == "0, 1"
    assert cells[4] == "+0.0030, +0.0010"
    assert cells[5] == "+0.0020 ± 0.0014"
    assert cells[6] == "+0, +100"
