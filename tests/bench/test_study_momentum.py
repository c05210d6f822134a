"""Issue 60: momentum tuned as LARS was (the plan's choice within one
machine kind, the report's pairs), ramps written without peeking, the
Holm count over the page's verdicts, and records that name their code."""

import os
import re

from bench.core import provenance
from bench.core import runspec
from bench.study import audit
from bench.study import baselines
from bench.study import momentum
from bench.study import engine
from bench.study import plans
from bench.study import stats

CPU_TF, H200 = "CPU VM / TensorFlow", "H200 / JAX"
STAMP = {CPU_TF: "2-core x86_64 CPU VM, no GPU (TensorFlow 2.21.0), 2026-11-29",
         H200: "one NVIDIA H200 (JAX 0.11.2), 2026-11-29"}


def _nesterov(kind, warmup, rate, seed, reach, final=0.85):
    """A Nesterov run at 4,096: 0.95 after `reach` updates (None: never
    0.90)."""
    spec = engine.nesterov(rate, warmup, [seed])[0]
    return dict(spec, machine=STAMP[kind], kind_of_machine=kind,
                val_accuracy=final,
                evals=[[0, reach or 150, 0.95 if reach else 0.85]])


def _sweep(kind, best, reach=100):
    """The whole grid on seed 100; `best` (warmup, rate) alone reaches
    0.90."""
    return [_nesterov(kind, w, r, 100, reach if (w, r) == best else None)
            for w in plans.MOMENTUM_WARMUPS for r in plans.MOMENTUM_RATES]


def test_the_nesterov_sweep_is_both_warmups_by_five_rates_on_seed_100():
    specs = engine.PLANS["momentum"].all_specs()
    sweep = [s for s in specs if s.get("variant", "").startswith("nesterov")]
    assert {(round(s["warmup_epochs"], 2), s["rate"]) for s in sweep} == {
        (w, r) for w in (1.43, 2.9) for r in (0.1, 0.2, 0.4, 0.8, 1.6)}
    assert {s["seed"] for s in sweep} == {100}
    # The warmup LARSMixed had (5/42 of 12 epochs), Nesterov on, 4,096.
    assert abs(plans.MOMENTUM_WARMUPS[0] - 12 * 5 / 42) < 1e-12
    argv = dict(a[2:].split("=", 1) for a in runspec.command_line(sweep[0], "w"))
    assert argv["nesterov"] == "true" and argv["global_batch_size"] == "4096"
    assert argv["optimizer"] == "sgd" and argv["resnet_depth"] == "20"
    # LAMBMixed's 0.032 and 0.064 get a key of their own on TensorFlow
    # beside the H200 runs of those rates.
    keys = {runspec.run_key(s) for s in specs}
    assert "resnet20_w16|fixed|lamb_mixed|12|4096|0.064|100|tensorflow" in keys


def test_layerwise_bests_are_chosen_on_the_measuring_kind_then_measured(
        monkeypatch):
    monkeypatch.setattr(provenance, "machine",
                        lambda backend=None: STAMP[CPU_TF])
    # LARSMixed: 2.5, 5, 10 on the CPU kind, 5 first to 0.90; faster
    # H200 runs at 20 do not count there.
    lars = [_layerwise(CPU_TF, "lars_mixed", r, 100, reach)
            for r, reach in ((2.5, None), (5.0, 100), (10.0, 110))]
    lars.append(_layerwise(H200, "lars_mixed", 20.0, 100, 50))
    assert engine.layerwise_best(lars, "lars_mixed", CPU_TF) == (5.0, None)
    later = [s for s in engine.PLANS["momentum"].then(lars) if s["for_kind"] == CPU_TF]
    assert [(s["optimizer"], s["rate"], s["seed"]) for s in later] == [
        ("lars_mixed", 5.0, seed) for seed in range(101, 106)]
    # LAMBMixed best at the highest of its CPU rates: 2x beyond it first,
    # keyed by the backend it runs on.
    lamb = [_layerwise(CPU_TF, "lamb_mixed", r, 100, reach)
            for r, reach in ((0.016, 120), (0.032, 110), (0.064, 100))]
    assert engine.layerwise_best(lamb, "lamb_mixed", CPU_TF) == (0.064, 0.128)
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    (extend,) = engine.PLANS["momentum"].then(lamb)
    assert (extend["rate"], extend["seed"], extend["run_backend"]) == (
        0.128, 100, "tensorflow")
    # Two rates on the kind: nothing chosen yet.
    assert engine.layerwise_best(lamb[:2], "lamb_mixed", CPU_TF) == (None, None)


def _layerwise(kind, optimizer, rate, seed, reach, final=0.91):
    spec = engine.fixed(4096, rate, [seed], epochs=12, optimizer=optimizer,
                       workload="resnet20_w16")[0]
    return dict(spec, machine=STAMP[kind], kind_of_machine=kind,
                val_accuracy=final,
                evals=[[0, reach or 150, 0.95 if reach else 0.85]])


def test_the_best_is_chosen_within_one_machine_kind_and_extends_at_an_edge():
    best = (plans.MOMENTUM_WARMUPS[1], 0.4)
    cpu = _sweep(CPU_TF, best)
    assert engine.momentum_best(cpu, CPU_TF) == (best, None)
    # The same grid on the H200 with another best does not move the CPU's.
    h200 = _sweep(H200, (plans.MOMENTUM_WARMUPS[0], 0.8), reach=10)
    assert engine.momentum_best(cpu + h200, CPU_TF) == (best, None)
    # Until the whole grid has run on the kind: nothing.
    assert engine.momentum_best(cpu[:-1] + h200, CPU_TF) == (None, None)
    # A best at the highest rate runs 2x beyond it first.
    edge = _sweep(CPU_TF, (plans.MOMENTUM_WARMUPS[0], 1.6))
    assert engine.momentum_best(edge, CPU_TF)[1] == (plans.MOMENTUM_WARMUPS[0], 3.2)


def test_the_plan_measures_the_best_on_seeds_101_to_105_once_chosen(
        monkeypatch):
    monkeypatch.setattr(provenance, "machine", lambda backend=None: STAMP[CPU_TF])
    best = (plans.MOMENTUM_WARMUPS[0], 0.2)
    later = engine.PLANS["momentum"].then(_sweep(CPU_TF, best))
    # The best at the shortest warmup: 2.9 bounds it, so it is measured,
    # and plain momentum at its warmup and rate beside it.
    assert [(s["seed"], s["rate"], s["variant"], s["for_kind"])
            for s in later] == [(seed, 0.2, variant, CPU_TF)
                                for variant in ("nesterov_w1.43",
                                                "momentum_w1.43")
                                for seed in range(101, 106)]
    # Another kind's sweep: its seeds are that kind's, not started here.
    h200 = engine.PLANS["momentum"].then(_sweep(H200, best))
    assert {s["for_kind"] for s in h200} == {H200}
    assert not [s for s in engine.PLANS["momentum"].specs_here(_sweep(H200, best))
                if s["for_kind"] == H200]


def test_a_gpu_runs_the_whole_comparison_keyed_apart(monkeypatch):
    """On another kind than the CPU's (a GPU's), the plan's runner starts
    that kind's own sweep, keyed by its backend, and none of the CPU
    kind's runs (TensorFlow's LAMBMixed points included)."""
    monkeypatch.setattr(provenance, "machine",
                        lambda backend=None: STAMP[H200])
    cpu = _sweep(CPU_TF, (plans.MOMENTUM_WARMUPS[1], 0.4))
    here = engine.PLANS["momentum"].specs_here(cpu)
    assert {s["for_kind"] for s in here} == {H200}
    assert sorted((s["rate"], round(s["warmup_epochs"], 2), s["run_backend"])
                  for s in here) == sorted(
        (r, w, "jax") for r in (0.1, 0.2, 0.4, 0.8, 1.6) for w in (1.43, 2.9))
    done = {runspec.run_key(r) for r in cpu}
    assert not done & {runspec.run_key(s) for s in here}
    # Its sweep done on the GPU: its own best on its measuring seeds.
    gpu = [dict(r, run_backend="jax") for r in
           _sweep(H200, (plans.MOMENTUM_WARMUPS[0], 0.8))]
    later = [s for s in engine.PLANS["momentum"].specs_here(cpu + gpu)
             if runspec.run_key(s) not in {runspec.run_key(r) for r in gpu}]
    assert [(s["seed"], s["rate"], s["run_backend"]) for s in later] == [
        (seed, 0.8, "jax") for _ in range(2) for seed in range(101, 106)]
    assert {s["variant"] for s in later} == {"nesterov_w1.43",
                                             "momentum_w1.43"}


def test_recorded_follow_ups_are_regenerated_under_any_backend(monkeypatch):
    """The waiting runs follow from the records, not from the backend of
    the process that reads the plan (the tests run on JAX; the CPU kind's
    runs on TensorFlow): else the CPU's measuring runs would be orphans."""
    best = (plans.MOMENTUM_WARMUPS[0], 0.2)
    sweep = _sweep(CPU_TF, best)
    lamb = [_layerwise(CPU_TF, "lamb_mixed", r, 100, reach)
            for r, reach in ((0.016, 120), (0.032, 110), (0.064, 100))]
    keys = {}
    for stamp in (STAMP[CPU_TF], STAMP[H200],
                  "2-core x86_64 CPU VM, no GPU (JAX 0.10.2), 2026-11-29"):
        monkeypatch.setattr(provenance, "machine", lambda b=None, s=stamp: s)
        later = [s for s in engine.PLANS["momentum"].then(sweep + lamb)
                 if s["for_kind"] == CPU_TF]
        keys[stamp] = sorted(runspec.run_key(s) for s in later)
        here = engine.PLANS["momentum"].specs_here(sweep + lamb)
        assert any(s.get("for_kind") == CPU_TF for s in here) == (
            stamp == STAMP[CPU_TF])
    assert len(set(map(tuple, keys.values()))) == 1
    assert ("resnet20_w16|fixed|lamb_mixed|12|4096|0.128|100|tensorflow"
            in keys[STAMP[H200]])
    # 5 seeds of the best, 5 of plain momentum there, LAMBMixed beyond.
    assert len(keys[STAMP[H200]]) == 11


def _measured(kind, optimizer, rate, finals, variant=None, warmup=None):
    runs = []
    for seed, final in zip(plans.MOMENTUM_MEASURE, finals):
        spec = engine.fixed(4096, rate, [seed], epochs=12, optimizer=optimizer,
                           workload="resnet20_w16", warmup_epochs=warmup)[0]
        if variant:
            spec = dict(spec, variant=variant, flags=dict(nesterov="true"))
        runs.append(dict(spec, machine=STAMP[kind], kind_of_machine=kind,
                         val_accuracy=final,
                         evals=[[0, 100 + seed, 0.95 if final > 0.9 else 0.85]]))
    return runs


def test_the_report_compares_each_layerwise_optimizer_with_the_tuned_nesterov():
    best = (plans.MOMENTUM_WARMUPS[0], 0.4)
    runs = _sweep(CPU_TF, best)
    assert momentum.momentum_findings(runs)["pairs"][0]["status"].startswith(
        "not run yet")
    runs += _measured(CPU_TF, "sgd", 0.4, [0.80, 0.81, 0.82, 0.83, 0.84],
                      "nesterov_w1.43", best[0])
    runs += [_layerwise(CPU_TF, o, r, 100, reach)
             for o, rates in (("lars_mixed", (2.5, 5.0, 10.0)),
                              ("lamb_mixed", (0.016, 0.032, 0.064)))
             for r, reach in zip(rates, (120, 100, 110))]
    runs += _measured(CPU_TF, "lars_mixed", 5.0, [0.91, 0.912, 0.914, 0.916,
                                                   0.918])
    runs += _measured(CPU_TF, "lamb_mixed", 0.032, [0.82, 0.80, 0.84, 0.81,
                                                     0.83])
    # Plain momentum's runs at the same rate are not the Nesterov arm.
    runs += _measured(CPU_TF, "sgd", 0.4, [0.99] * 5)
    found = momentum.momentum_findings(runs)
    assert found["best"] == best and found["arms"]["nesterov"]["n"] == 5
    lars, lamb, plain = found["pairs"]
    # SGD without a variant is not plain momentum's arm (`momentum_w1.43`).
    assert plain["status"] == "not run yet (n = 0)"
    assert lars["n"] == (5, 5) and lars["result"]["accuracy"]["verdict"] == "ahead"
    assert abs(lars["result"]["accuracy"]["diff"] - 0.094) < 1e-9
    assert lamb["result"]["accuracy"]["verdict"] == "cannot tell"
    lines = momentum.momentum_lines(found)
    assert lines[0].endswith("the grid's best 0.4 at warmup 1.43; bracketed, "
                             "the best is 0.4 at warmup 1.43.")
    assert "**ahead**" in lines[1] and "n = 5 vs 5" in lines[1]
    assert ("LARSMixed at 5, its best on seed 100 on that kind; Nesterov SGD "
            "at 0.4 at warmup 1.43 epochs, its rate and warmup bracketed"
            in lines[1])
    # Five seeds a side: the exact rank test beside the updates' verdict.
    assert "exact rank test p = " in lines[1]


def test_the_unpeeked_ramps_are_megatrons_shape_and_the_doubling():
    assert plans.LINEAR_RAMP == "0:128,1:256,2:384,3:512,4:640,5:768,6:1024"
    # Megatron's formula at sample s: 128 + 128 * floor(s / (360000 / 7)).
    assert engine.megatron_ramp(128, 128, 1024, 360000, 60000, 8) == \
        plans.LINEAR_RAMP
    # 3 increments of 64 over 100 samples, 50 an epoch: 64, 128, then 256.
    assert engine.megatron_ramp(64, 64, 256, 100, 50, 4) == "0:64,1:128,2:256"
    assert engine.megatron_ramp(
        plans.SMALL_BATCH, plans.SMALL_BATCH, 1024, 24 * plans.FASHION_TRAIN // 4,
        plans.FASHION_TRAIN, 24) == plans.LINEAR_RAMP
    specs = engine.PLANS["ramps"].all_specs()
    assert len(specs) == 30 and {s["seed"] for s in specs} == set(
        plans.DECISIVE_SEEDS)
    schedules = {s["variant"]: s["flags"]["batch_schedule"] for s in specs}
    assert schedules == {"linear_ramp": plans.LINEAR_RAMP,
                         "doubling": "0:128,2:256,4:512,6:1024",
                         "start512": "0:512,6:1024"}
    # Their keys are apart from the peeked ramp's, which selects no variant.
    peeked = {runspec.run_key(s) for s in engine.PLANS["baselines"].all_specs()}
    assert not peeked & {runspec.run_key(s) for s in specs}
    arms = [(n, sel) for n, sel, _ in baselines.BASELINE_ARMS
            if sel["kind"] == "ramp"]
    assert len(arms) == 4 and "written without the noise scale" in arms[1][0]
    assert [baselines.ramp_start(sel) for _, sel in arms] == [
        "peeked", "small", "small", "start"]
    assert arms[3][0].startswith("the ramp from 512 written without")


def test_the_ramp_from_512_starts_where_the_defaults_start(tmp_path):
    """The ramp of issue 74: the defaults' first batch (4 x 128) and its
    rate (1.6 = 0.4 x 512 / 128) from the first update, nothing measured,
    1,024 from epoch 6; the command's checks pass."""
    from keras_largebatch.adaptive_batch import defaults
    from keras_largebatch.train import config as train_config

    (spec,) = [s for s in engine.PLANS["ramps"].all_specs()
               if s["variant"] == "start512" and s["seed"] == 100]
    assert baselines.START == defaults.START_MULTIPLE * plans.SMALL_BATCH
    assert engine.batch_steps(plans.START_RAMP)[0] == (0, baselines.START)
    assert baselines.START_RATE == 1.6
    config = train_config.parse(
        ["prog"] + runspec.command_line(spec, str(tmp_path)))
    assert (config.adaptive.adaptive_batch, config.adaptive.batch_schedule,
            config.adaptive.adaptive_learning_rate) == (
        "schedule", ((0, 512), (6, 1024)), "linear")


def test_a_ramp_sentence_credits_the_measurement_only_against_its_start():
    result = {"accuracy": {"verdict": "cannot tell"},
              "targets": {t: {"verdict": "ahead" if t == 0.90 else
                              "cannot tell"} for t in (0.88, 0.89, 0.90, 0.905)}}
    # From 128: the start and the measurement are not told apart, and the
    # noise scale is not credited.
    said = baselines.ramp_sentence(result, "small")
    assert said.startswith("The grown batch is ahead of this ramp on 0.90: "
                           "this ramp starts at 128 where the defaults start "
                           "at 512")
    assert "do not tell the start's share from the measurement's" in said
    assert "noise scale" not in said
    # From the defaults' start: ahead there, the measurement adds something.
    said = baselines.ramp_sentence(result, "start")
    assert "shares the defaults' start (512 from the first update, at 1.6)" \
        in said
    assert said.endswith("so there the measurement adds something beyond "
                         "the start.")
    for word in result["targets"].values():
        word["verdict"] = "cannot tell"
    said = baselines.ramp_sentence(result, "small")
    assert "could not be told apart" in said and "matches" not in said
    # Not told apart from a ramp that shares the start: the gap over the
    # ramps from 128 is not shown to come from the measurement.
    said = baselines.ramp_sentence(result, "start")
    assert ("the updates the grown batch saves over the ramps from 128 are "
            "not shown to come from the measurement") in said


def test_holm_steps_down_unlike_bonferroni_or_no_correction():
    # Holm keeps all three (0.01 <= .05/3, 0.02 <= .05/2, 0.04 <= .05);
    # Bonferroni would keep only the first.
    assert stats.holm([0.04, 0.01, 0.02]) == [True, True, True]
    # It stops at the first failure: 0.03 > 0.05/3, so 0.04 falls too.
    assert stats.holm([0.01, 0.03, 0.04, 0.2]) == [True, False, False, False]


def test_the_p_values_agree_with_the_intervals_that_give_the_verdicts():
    a, b = [0.91, 0.912, 0.915, 0.913, 0.909], [0.90, 0.903, 0.899, 0.901, 0.902]
    low = stats.mean_difference(a, b)[1]
    assert low > 0 and stats.welch_p(a, b) < 0.05
    assert stats.welch_p(a, a[::-1]) == 1.0
    fast, slow = [100, 110, 120, 105, 115], [200, 210, 220, 205, 215]
    assert stats.ratio_of_medians(fast, slow)[2] < 1
    assert stats.ratio_p(fast, slow) < 0.05
    assert stats.ratio_p(fast, fast) == 1.0
    # Never reaching on both sides counts as a tie, never as a difference.
    assert stats.ratio_p([None] * 5, [None] * 5) == 1.0


def _finding(verdict, p, commits=("", "")):
    result = {"a": {"n": 10}, "b": {"n": 10},
              "accuracy": {"verdict": verdict, "p": p},
              "targets": {}, "commits": {"a": [commits[0]], "b": [commits[1]]}}
    return {"name": "x", "result": result, "interim": False}


def test_the_audit_counts_verdicts_and_marks_those_holm_undoes():
    found = [_finding("ahead", 0.001), _finding("ahead", 0.03),
             _finding("cannot tell", 0.4, ("abc", "def"))]
    entries = audit.verdicts(found, [], [])
    lines = audit.audit_lines(entries)
    assert "compute 3 verdicts" in lines[0] and "2 say ahead or behind" in lines[0]
    assert "1 would not survive" in lines[0]
    assert found[0]["result"]["accuracy"]["holm"] is True
    assert found[1]["result"]["accuracy"]["holm"] is False
    assert "holm" not in found[2]["result"]["accuracy"]
    assert "the arms of 1 ran different commits" in lines[1]


def test_the_page_lists_each_recheck_with_both_commits():
    def kept(key, differences):
        return {"plan": "ramps", "key": key, "epochs": len(differences),
                "recorded": {"commit": "a" * 40, "machine": STAMP[CPU_TF]},
                "machine": STAMP[CPU_TF],
                "code": {"commit": "b" * 40},
                "identical": not any(differences),
                "compared": [{"epoch": i, "field": "loss", "difference": d}
                             for i, d in enumerate(differences)]}

    assert audit.recheck_lines([]) == []
    unnamed = dict(kept("k3", [0.0]),
                   recorded={"commit": None, "machine": STAMP[CPU_TF]})
    gpu = dict(kept("k4", [0.0]), machine=STAMP[H200])
    (line,) = audit.recheck_lines([kept("k1", [0.0, 0.0]),
                                   kept("k2", [0.0, -2.5e-4]), unnamed, gpu])
    assert "4 recorded runs" in line and "3 came out identical" in line
    assert "`k4` (ramps, 1 epoch, rerun on H200 / JAX, aaaaaaa" in line
    assert "`k3` (ramps, 1 epoch, no commit -> bbbbbbb): identical" in line
    assert "`k1` (ramps, 2 epochs, aaaaaaa -> bbbbbbb): identical" in line
    assert "`k2` (ramps, 2 epochs, aaaaaaa -> bbbbbbb): differs, loss of " \
        "epoch 1 by -0.00025; recorded 2026-11-29 before records named " \
        "their processor" in line


def test_a_record_names_its_commit_tree_and_versions():
    code = provenance.code("jax")
    assert code["commit"] is None or re.fullmatch(r"[0-9a-f]{40}",
                                                  code["commit"])
    assert isinstance(code["dirty"], bool)
    assert set(code["versions"]) == {"keras-largebatch", "keras", "jax"}
    assert code["versions"]["keras"]
    stamp = provenance.stamp({"run_backend": "jax"})
    assert stamp["code"] == code
    # The processor and boot: bit-identical reruns hold on one processor.
    here = provenance.processor()
    assert stamp["cpu"] == here["cpu"] and stamp["boot"] == here["boot"]
    if os.path.exists("/proc/cpuinfo"):
        assert re.fullmatch(r".+, flags [0-9a-f]{8}", here["cpu"])
        assert re.fullmatch(r"[0-9a-f-]{36}", here["boot"])


def _then_made(kind, optimizer, rate, reach, final=0.91):
    """A layer-wise run on seed 100 that the plan's `then` made on `kind`
    (tagged with it, keyed by its backend)."""
    return dict(_layerwise(kind, optimizer, rate, 100, reach, final),
                for_kind=kind, run_backend="jax")


def test_a_sweeps_extensions_stay_runs_of_the_plan_once_the_best_is_inside(
        monkeypatch):
    """The H200's LARSMixed: the depth plan's 20-160 (none reaches 0.90),
    so 10 ran, then at 10's edge 5; 10 is best and interior. The chain is
    replayed from the runs no extension made, so 10 and 5 on seed 100 stay
    runs of the plan (a record's runs all come from its plans), and 10 is
    measured on seeds 101-105."""
    monkeypatch.setattr(provenance, "machine",
                        lambda backend=None: STAMP[CPU_TF])
    base = [_layerwise(H200, "lars_mixed", r, 100, None, final)
            for r, final in ((20.0, 0.72), (40.0, 0.45), (80.0, 0.2),
                             (160.0, 0.21))]
    assert engine.layerwise_best(base, "lars_mixed", H200) == (20.0, 10.0)
    ten = _then_made(H200, "lars_mixed", 10.0, 127)
    assert engine.layerwise_best(base + [ten], "lars_mixed", H200) == (
        10.0, 5.0)
    five = _then_made(H200, "lars_mixed", 5.0, 131)
    runs = base + [ten, five]
    assert engine.layerwise_chain(runs, "lars_mixed", H200) == (
        (plans.MOMENTUM_WARMUPS[0], 10.0), None,
        [(plans.MOMENTUM_WARMUPS[0], 10.0), (plans.MOMENTUM_WARMUPS[0], 5.0)])
    later = [(s["rate"], s["seed"]) for s in engine.PLANS["momentum"].then(runs)
             if s["for_kind"] == H200 and s["optimizer"] == "lars_mixed"]
    assert later == [(10.0, 100), (5.0, 100)] + [
        (10.0, seed) for seed in plans.MOMENTUM_MEASURE]
    # A run the plan did not extend to counts from the start: the same 5
    # in the base makes 10 interior at once, with nothing to replay.
    untagged = base + [_layerwise(H200, "lars_mixed", r, 100, reach)
                       for r, reach in ((10.0, 127), (5.0, 131))]
    assert engine.layerwise_chain(untagged, "lars_mixed", H200)[2] == []


def test_the_depth_study_reads_its_own_runs_only():
    """The momentum plan writes the depth plan's record; its runs of the
    same network, batch and seed (tagged `for_kind`) change neither the
    depth sweep's best nor its arms."""
    from bench.study import depth

    base = [_layerwise(H200, "lars_mixed", r, 100, reach, 0.9)
            for r, reach in ((2.5, None), (5.0, 101), (10.0, 102))]
    grid = [_layerwise(H200, "lars_mixed", r, 100, None, 0.7 - r / 1000)
            for r in engine.depth_rates("lars_mixed", 4096)]
    own = grid + base
    before = depth.depth_best(own, 4096)["lars_mixed"]
    assert before == (5.0, None)
    # Faster momentum-plan runs at 10 on seed 100: the depth study's best
    # stays 5, and its waiting runs do not change.
    theirs = [_then_made(H200, "lars_mixed", 10.0, 60)]
    assert depth.depth_best(own + theirs, 4096)["lars_mixed"] == before
    assert [runspec.run_key(s) for s in engine.PLANS["depth"].then(own + theirs)] == [
        runspec.run_key(s) for s in engine.PLANS["depth"].then(own)]


def test_each_machine_kind_is_its_own_comparison_the_decisive_first():
    """The page shows every kind's comparison, the CPU's first, each claim
    naming its kind (the Holm list tells them apart)."""
    cpu = _sweep(CPU_TF, (plans.MOMENTUM_WARMUPS[1], 0.4))[:7]
    h200 = _sweep(H200, (plans.MOMENTUM_WARMUPS[1], 0.4))
    found = momentum.momentum_all(h200 + cpu)
    assert [f["machine"] for f in found] == [CPU_TF, H200]
    assert found[0]["best"] is None and found[0]["swept"] == 7
    assert found[1]["best"] == (plans.MOMENTUM_WARMUPS[1], 0.4)
    claims = [p["claim"] for f in found for p in f["pairs"]]
    assert claims[0].endswith("at 4,096 on CPU VM / TensorFlow")
    assert claims[3].endswith("at 4,096 on H200 / JAX")
    assert momentum.momentum_all([])[0]["machine"] == CPU_TF
    lines = momentum.sweep_lines([dict(r, train_loss_per_epoch=[0.7])
                                  for r in h200 + cpu])
    assert lines.index("CPU VM / TensorFlow, seed 100:") < lines.index(
        "H200 / JAX, seed 100:")
    assert sum("| best |" in x for x in lines) == 1  # the H200's 0.4


def _row(kind, warmup, rates, reach):
    """Nesterov on seed 100 at `warmup` over `rates`; {rate: updates to
    0.90} in `reach` (the others never get there)."""
    return [_nesterov(kind, warmup, r, 100, reach.get(r)) for r in rates]


def _seed_100(specs, kind=H200):
    """The Nesterov points beyond the grid (another kind's `then` gives
    the grid too) on seed 100."""
    return sorted((round(s["warmup_epochs"], 2), s["rate"]) for s in specs
                  if s["for_kind"] == kind and s["seed"] == 100
                  and s["optimizer"] == "sgd" and engine.momentum_key(
                      s["warmup_epochs"], s["rate"]) not in
                  engine.momentum_grid())


def _measuring(specs, kind=H200):
    return sorted({(s["variant"], s["rate"]) for s in specs
                   if s["for_kind"] == kind and s["seed"] != 100
                   and s["optimizer"] == "sgd"})


def test_a_best_at_the_longest_warmup_runs_a_longer_warmup_first(
        monkeypatch):
    """Issue 74: the grid's best at 2.9 epochs, the grid's longest warmup,
    is not bracketed: 5.8 at its rate and both neighbours run on seed 100
    first; meanwhile the grid's best is measured (issue 60's arm), and
    plain momentum waits for the bracket."""
    monkeypatch.setattr(provenance, "machine", lambda backend=None: STAMP[CPU_TF])
    grid = _sweep(H200, (2.9, 0.4))
    chain = engine.momentum_chain(grid, H200)
    assert chain.grid_best == (2.9, 0.4) and chain.best == (2.9, 0.4)
    assert chain.next == [(5.8, 0.2), (5.8, 0.4), (5.8, 0.8)]
    later = engine.PLANS["momentum"].then(grid)
    assert _seed_100(later) == [(5.8, 0.2), (5.8, 0.4), (5.8, 0.8)]
    assert _measuring(later) == [("nesterov_w2.9", 0.4)]
    # The longer warmup loses (never 0.90): bracketed at 2.9, measured
    # there (once), and plain momentum at 2.9 and 0.4 beside it.
    lost = grid + _row(H200, 5.8, (0.2, 0.4, 0.8), {})
    chain = engine.momentum_chain(lost, H200)
    assert (chain.best, chain.next) == ((2.9, 0.4), [])
    assert chain.ran == [(5.8, 0.2), (5.8, 0.4), (5.8, 0.8)]
    later = engine.PLANS["momentum"].then(lost)
    assert _measuring(later) == [("momentum_w2.9", 0.4),
                                 ("nesterov_w2.9", 0.4)]
    assert len([s for s in later if s["variant"] == "nesterov_w2.9"
                and s["seed"] != 100]) == 5


def test_a_longer_warmup_that_wins_extends_until_a_worse_one_bounds_it(
        monkeypatch):
    monkeypatch.setattr(provenance, "machine", lambda backend=None: STAMP[CPU_TF])
    grid = _sweep(H200, (2.9, 0.4), reach=130)
    # 5.8 at 0.4 wins, interior along the rate: 9 epochs next (the cap),
    # at 0.4 and its neighbours.
    won = grid + _row(H200, 5.8, (0.2, 0.4, 0.8), {0.4: 110, 0.8: 120})
    chain = engine.momentum_chain(won, H200)
    assert chain.best == (5.8, 0.4)
    assert chain.next == [(9.0, 0.2), (9.0, 0.4), (9.0, 0.8)]
    # 9 loses: bracketed at 5.8; both Nesterov points and plain momentum
    # at 5.8 measured.
    bounded = won + _row(H200, 9.0, (0.2, 0.4, 0.8), {0.4: 150})
    chain = engine.momentum_chain(bounded, H200)
    assert (chain.grid_best, chain.best, chain.next) == (
        (2.9, 0.4), (5.8, 0.4), [])
    later = engine.PLANS["momentum"].then(bounded)
    assert _seed_100(later) == sorted(
        (w, r) for w in (5.8, 9.0) for r in (0.2, 0.4, 0.8))
    assert _measuring(later) == [("momentum_w5.8", 0.4),
                                 ("nesterov_w2.9", 0.4),
                                 ("nesterov_w5.8", 0.4)]
    # 9 wins: no longer warmup is tried (a quarter of the run left to
    # decay); measured at 9, its warmup bounded below only.
    capped = won + _row(H200, 9.0, (0.2, 0.4, 0.8), {0.4: 90})
    chain = engine.momentum_chain(capped, H200)
    assert (chain.best, chain.next) == ((9.0, 0.4), [])
    # A longer row's best at its highest rate: 2x beyond it first.
    edge = grid + _row(H200, 5.8, (0.2, 0.4, 0.8), {0.8: 100})
    assert engine.momentum_chain(edge, H200).next == [(5.8, 1.6)]
    # The chain's runs are the plan's own: none is an orphan (the H200's
    # keyed by its backend).
    ran = [dict(r, run_backend="jax") for r in bounded]
    keys = {runspec.run_key(s) for s in engine.PLANS["momentum"].all_specs(ran)}
    assert {runspec.run_key(r) for r in ran} <= keys


def test_plain_momentum_is_the_same_run_without_nesterov(tmp_path):
    from keras_largebatch.train import config as train_config

    (plain,) = engine.nesterov(0.4, 2.9, [101], on=False)
    (nest,) = engine.nesterov(0.4, 2.9, [101])
    assert plain["variant"] == "momentum_w2.9"
    assert {k: v for k, v in plain.items() if k not in ("variant", "flags")} \
        == {k: v for k, v in nest.items() if k not in ("variant", "flags")}
    assert runspec.run_key(plain) != runspec.run_key(nest)
    flags = [train_config.parse(["prog"] + runspec.command_line(
        s, str(tmp_path))).optimization.nesterov for s in (plain, nest)]
    assert flags == [False, True]


def test_an_arm_short_of_its_seeds_is_interim_and_counted_nowhere():
    """A layer-wise arm with 4 of its 5 measuring seeds (one left out as
    incomplete): its comparison is shown, every verdict "interim", and the
    audit counts none of them."""
    best = (plans.MOMENTUM_WARMUPS[0], 0.4)
    runs = _sweep(CPU_TF, best)
    runs += _measured(CPU_TF, "sgd", 0.4, [0.80, 0.81, 0.82, 0.83, 0.84],
                      "nesterov_w1.43", best[0])
    runs += [_layerwise(CPU_TF, "lars_mixed", r, 100, reach)
             for r, reach in zip((2.5, 5.0, 10.0), (120, 100, 110))]
    runs += _measured(CPU_TF, "lars_mixed", 5.0, [0.91, 0.912, 0.914,
                                                   0.916])
    found = momentum.momentum_findings(runs)
    lars = found["pairs"][0]
    assert lars["n"] == (4, 5) and lars["interim"] and not lars["status"]
    assert lars["result"]["accuracy"]["verdict"] == "interim"
    line = momentum.momentum_lines(found)[1]
    assert "n = 4 vs 5 of 5 planned: interim" in line and "ahead" not in line
    assert audit.verdicts([], found["pairs"], []) == []


def test_an_updates_verdict_at_five_seeds_survives_holm_only_with_its_rank_test():
    """5 vs 5, fully apart: the bootstrap's p is 0, the exact rank test's
    2 / 252; among 10 verdicts Holm asks the smallest p for 0.005, which
    the rank test's 0.0079 misses."""
    a, b = [100, 101, 102, 103, 104], [200, 201, 202, 203, 204]
    arms = [stats.Arm(name, "m", tuple(range(5)), (0.9,) * 5,
                      {0.90: tuple(v)}) for name, v in (("a", a), ("b", b))]
    result = stats.compare(*arms, (0.90,))
    x = result["targets"][0.90]
    assert x["p"] == 0.0 and abs(x["rank_p"] - 2 / 252) < 1e-12
    assert x["verdict"] == "ahead"
    others = [("other", {"verdict": "cannot tell", "p": 0.5}, {}, {})] * 9
    entries = [("updates", x, {"a": [""], "b": [""]},
                {"a": {}, "b": {}})] + others
    audit.audit_lines(entries)
    assert x["holm"] is False
    # Ten seeds a side: no rank test beside it, the bootstrap's p alone.
    ten = [stats.Arm(name, "m", tuple(range(10)), (0.9,) * 10,
                     {0.90: tuple(range(s, s + 10))})
           for name, s in (("a", 100), ("b", 200))]
    assert "rank_p" not in stats.compare(*ten, (0.90,))["targets"][0.90]


def test_a_bracket_away_from_the_grid_compares_the_two_warmups(monkeypatch):
    """Issue 74: the warmup bracketed at 5.8 where the grid's best was 2.9
    (both at 0.4): the report compares the two Nesterov points on the
    measuring seeds (what the bracket bought), with the rank test beside
    the updates; a bracket that stays at the grid's best adds no pair."""
    monkeypatch.setattr(provenance, "machine", lambda backend=None: STAMP[CPU_TF])
    from bench.study import headline

    runs = (_sweep(CPU_TF, (2.9, 0.4), reach=130)
            + _row(CPU_TF, 5.8, (0.2, 0.4, 0.8), {0.4: 110, 0.8: 120})
            + _row(CPU_TF, 9.0, (0.2, 0.4, 0.8), {0.4: 150}))
    found = momentum.momentum_findings(runs, CPU_TF)
    assert found["bracketed"] and found["grid_at"] == (2.9, 0.4)
    *_, grid = found["pairs"]
    assert (grid["a"], grid["b"], grid["n"]) == ("nesterov", "grid", (0, 0))
    assert grid["status"] == "not run yet (n = 0)"
    # The bracketed best reaches 0.90 on every measuring seed (after 201-205
    # updates), the grid's best on none; its finals 0.02 lower.
    runs += _measured(CPU_TF, "sgd", 0.4, [0.91, 0.912, 0.914, 0.916, 0.918],
                      "nesterov_w5.8", 5.8)
    runs += _measured(CPU_TF, "sgd", 0.4, [0.89, 0.892, 0.894, 0.896, 0.898],
                      "nesterov_w2.9", 2.9)
    found = momentum.momentum_findings(runs, CPU_TF)
    *_, grid = found["pairs"]
    assert grid["n"] == (5, 5) and not grid["status"] and not grid["interim"]
    acc, x = grid["result"]["accuracy"], grid["result"]["targets"][0.90]
    assert abs(acc["diff"] - 0.02) < 1e-9 and acc["verdict"] == "ahead"
    assert x["verdict"] == "ahead" and abs(x["rank_p"] - 2 / 252) < 1e-12
    line = momentum.momentum_lines(found)[-1]
    assert ("0.4 at warmup 5.8 epochs, the bracketed best, against 0.4 at "
            "warmup 2.9, the grid's best" in line)
    rows = headline.table_lines([], [], {"pairs": []}, [found], 1)
    assert sum("vs its grid's best (0.4, warmup 2.9)" in r for r in rows) == 2
    # The audit counts its verdicts as the others' (accuracy and each target).
    assert len(audit.verdicts([], [grid], [])) == 1 + len(
        grid["result"]["targets"])
    # Bracketed at the grid's best: no second Nesterov arm to compare.
    stayed = (_sweep(CPU_TF, (2.9, 0.4), reach=100)
              + _row(CPU_TF, 5.8, (0.2, 0.4, 0.8), {0.4: 140}))
    found = momentum.momentum_findings(stayed, CPU_TF)
    assert found["bracketed"] and found["grid_at"] is None
    assert [p["b"] for p in found["pairs"]] == ["nesterov", "nesterov", "plain"]
