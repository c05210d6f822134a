"""Every study as a plan, as data: one literal table, `TABLE`, read by the
engine (`bench/study/engine.py`, which makes each entry a `Plan`).

An entry names its record (`bench/results/<record>.json`, which the report
reads), says what it measures (`about`) and gives its arms in order of
value: each a builder of the engine (`arm`: `fixed`, `grown`, `ramp`,
`grid`, `depth_grid`, `nesterov_sweep`, `lbs`, `kills`) with its arguments,
and `set`, fields every spec of the arm gets. With `by_seed` the arms are
interleaved seed by seed (an arm's own `seeds` then keep only those).
`then` names the engine's rule for runs that wait on others (the best
rate of a sweep, measured on other seeds), with its arguments. The GPU
check's tasks are its own plans (`bench/gpu_campaign/plan.py`).

Seeds 0-9 were spent before the study chose rates by rule; new
measurements use seeds from 100 on, decided here before they run.
"""

from keras_largebatch.train.recipe import rates as recipe_rates

SMALL_BATCH, MICRO = 128, 256
R2 = 2 ** 0.5

# The command's defaults until 2026-11-26, spelled out, up to 4,096.
_PREVIOUS = dict(noise_scale_multiple=1.0, adaptive_learning_rate="sqrt",
                 adaptive_start_multiple=1, max_global_batch_size=4096)
_TODAYS = dict(_PREVIOUS, noise_scale_multiple=4.0,
               adaptive_learning_rate="linear", max_global_batch_size=1024)
# A grown variant: its command flags beside `--adaptive_batch=noise_scale`
# and the multiple of the small batch it starts at (the start's rate
# follows the variant's rule). "default" is the command's defaults on the
# day its run ran (`finished` in its record).
GROWN = {
    "default": ({}, 1),
    "previous": (_PREVIOUS, 1),
    "c2": (dict(_PREVIOUS, noise_scale_multiple=2.0), 1),
    "c4": (dict(_PREVIOUS, noise_scale_multiple=4.0), 1),
    "c8": (dict(_PREVIOUS, noise_scale_multiple=8.0), 1),
    "linear": (dict(_PREVIOUS, adaptive_learning_rate="linear"), 1),
    "start4": (_PREVIOUS, 4),
    "start4_c4_linear_1024": (_TODAYS, 4),
    "start4_c2_linear_1024": (dict(_TODAYS, noise_scale_multiple=2.0), 4),
    "anneal": (dict(_TODAYS, adaptive_anneal_fraction=0.25,
                    adaptive_anneal_multiple=1), 4),
    "anneal_half": (dict(_TODAYS, adaptive_anneal_fraction=0.5,
                         adaptive_anneal_multiple=1), 4),
    "start1_c4_unchanged_1024": (dict(
        noise_scale_multiple=4.0, adaptive_learning_rate="unchanged",
        adaptive_start_multiple=1, max_global_batch_size=1024), 1),
}

# The scaling study (Shallue et al.): each fixed batch's SGD rates 2x apart
# on seed 0, its best by updates to 0.90 with seeds 1-2 (1,024: 1-4); the
# 12-epoch second workload; LARSMixed's grid from 10 sqrt(2) at 128 scaled
# by sqrt(B/128); the grown variants. Seeds 0-9, as run 2026-11-24/26.
# {batch: {rate: seeds 0..n-1}} of each fixed grid.
SCALING_FIXED = {
    128: {0.1: 1, 0.2: 3, 0.4: 3}, 256: {0.1: 1, 0.2: 1, 0.4: 1, 0.8: 3, 1.6: 1},
    512: {0.2: 1, 0.4: 1, 0.8: 1, 1.6: 3, 3.2: 1},
    1024: {0.4: 1, 0.8: 5, 1.6: 1, 3.2: 1},
    2048: {0.4: 1, 0.8: 1, 1.6: 3, 3.2: 1}, 4096: {0.4: 1, 0.8: 3, 1.6: 1, 3.2: 1}}
SECOND_FIXED = {128: {0.2: 3}, 512: {0.8: 3, 1.6: 1, 3.2: 1},
                1024: {0.4: 1, 0.8: 3, 1.6: 1}}
LARS_FIXED = {
    256: {5.0: 1, 10.0: 2, 20.0: 1, 40.0: 1},
    512: {2.5 * R2: 1, 5 * R2: 2, 10 * R2: 1, 20 * R2: 1, 40 * R2: 1},
    1024: {10.0: 1, 20.0: 2, 40.0: 1, 80.0: 1},
    2048: {5 * R2: 1, 10 * R2: 2, 20 * R2: 1, 40 * R2: 1, 80 * R2: 1},
    4096: {5.0: 1, 10.0: 2, 20.0: 1, 40.0: 1, 80.0: 1, 160.0: 1}}
# (variant, rate, seeds) of the grown arms at 24 epochs.
SCALING_GROWN = (
    ("default", 0.2, range(3)), ("default", 0.4, range(5)),
    ("start4_c4_linear_1024", 0.2, range(10)), ("c4", 0.2, range(5)),
    *((v, 0.2, range(2)) for v in (
        "previous", "c2", "c8", "linear", "start4", "start4_c2_linear_1024",
        "anneal", "anneal_half")))

# The decisive comparison, fixed before it ran: the command's defaults at
# the small batch's 24-epoch rate (0.4, chosen on seeds 0-2) against fixed
# 1,024 at 0.8 (the H200 / JAX front's best for 0.90: its rate chosen on
# seed 0, one seed a rate, then repeated on seeds 1-4), on 10 seeds no rate
# was chosen on, one machine kind.
DECISIVE_SEEDS = tuple(range(100, 110))

# The grown batch against fair baselines (issue 51), on the decisive seeds
# and machine kind (CPU VM / TensorFlow), each paired with the decisive
# arms' runs. The fixed ramp is the schedule the defaults' grown runs at
# 0.4 followed on the scaling plan's seeds 0-4 (CPU VM / JAX; every one
# 512 for 4 epochs, then 1,024: `schedule_of` their `batch_per_epoch`),
# seeds the measurement does not use, written here before it runs: one
# schedule for every seed. (The decisive seeds' own grown runs took 512
# for 4 or 5 epochs.) Fixed 512 at 1.6: the CPU / JAX front's best for
# 0.90 and 0.905 (seeds 0-2; rates not rechosen on TensorFlow). Fixed
# 1,024 at 0.8 over 36 epochs: the decisive baseline with a decay that no
# longer ends before the grown runs' (1,410 updates in 24 epochs against
# their 1,642-1,701); seeds 100-104 first (`LONG_FIRST_SEEDS`), 105-109
# only if their verdicts differ from the 24-epoch arm's (the report's
# `baselines.long_rule` says whether they do). They did (2026-11-28, n = 5:
# final accuracy, 0.90 and 0.905 went from "ahead" to "cannot tell"), so
# the arm runs all 10 seeds.
RAMP_SCHEDULE = "0:512,4:1024"
LONG_FIRST_SEEDS = DECISIVE_SEEDS[:5]
BASELINE_LONG_SEEDS = DECISIVE_SEEDS

# Ramps written without peeking (issue 60): schedules fixed from their
# shape alone, before any run of theirs, not read from the grown runs;
# against the same defaults on the decisive seeds and machine kind. A
# linear ramp from 128 to 1,024 over the first quarter of the samples
# (Megatron-LM's `--rampup-batch-size 128 128 360000`, read at epoch
# starts: `engine.megatron_ramp(128, 128, 1024, 24 * FASHION_TRAIN // 4,
# FASHION_TRAIN, 24)`, a test keeps them equal), and doubling 128 -> 256 ->
# 512 -> 1,024 at epochs 2, 4 and 6. Rate 0.4 at 128, linear in the batch,
# as the grown defaults.
FASHION_TRAIN = 60000
LINEAR_RAMP = "0:128,1:256,2:384,3:512,4:640,5:768,6:1024"
DOUBLING_RAMP = "0:128,2:256,4:512,6:1024"
# The start separated from the measurement (issue 74), fixed before it ran:
# the defaults' start (512 from the first update, rate 1.6) with no noise
# scale, 1,024 from a quarter of the samples (epoch 6), rate 0.4 x B / 128.
START_RAMP = "0:512,6:1024"
UNPEEKED_RAMPS = {"linear_ramp": LINEAR_RAMP, "doubling": DOUBLING_RAMP,
                  "start512": START_RAMP}

# LARS against SGD at 4,096 (32 x 128) on ResNet-8 w4, one seed per rate
# (2026-11-22/23): 8-epoch sweeps, the best with seed 1, and 24-96 epochs.
# (phase, optimizer, epochs, batch, rates).
LBS = (
    ("short", "sgd", 8, 128, [0.0125, 0.025, 0.05, 0.1, 0.2, 0.4]),
    ("short", "sgd", 8, 4096, [0.4, 0.8, 1.6, 3.2]),
    ("short", "lars_mixed", 8, 128, [x * R2 for x in (
        0.3125, 0.625, 1.25, 2.5, 5, 10, 20)]),
    ("short", "lars_mixed", 8, 4096, [2.5, 5.0, 10.0, 20.0]),
    ("short", "lamb_mixed", 8, 128, [0.0005 * R2 * 2 ** k for k in range(-1, 7)]),
    ("short", "lamb_mixed", 8, 4096, [0.002 * 2 ** k for k in range(8)]),
    ("seed", "sgd", 8, 128, [0.2]), ("seed", "sgd", 8, 4096, [0.8]),
    ("seed", "lars_mixed", 8, 128, [10 * R2]),
    ("seed", "lars_mixed", 8, 4096, [10.0]),
    ("seed", "lamb_mixed", 8, 128, [0.016 * R2]),
    ("seed", "lamb_mixed", 8, 4096, [0.128]),
    ("long", "sgd", 24, 128, [0.2]), ("long", "sgd", 48, 128, [0.2]),
    ("long", "sgd", 96, 128, [0.2]), ("long", "sgd", 24, 4096, [0.8]),
    ("long", "sgd", 48, 4096, [0.8]), ("long", "sgd", 96, 4096, [0.8]),
    ("long", "lars_mixed", 24, 128, [10 * R2]),
    ("long", "lars_mixed", 24, 4096, [5.0, 10.0, 20.0]),
    ("long", "lars_mixed", 48, 4096, [10.0]),
    ("long", "lars_mixed", 96, 4096, [10.0]),
    ("long", "lamb_mixed", 24, 128, [0.016 * R2]),
    ("long", "lamb_mixed", 24, 4096, [0.128]),
    ("long", "lamb_mixed", 48, 4096, [0.128]))

# LARS at depth: ResNet-20 of width 16 (about 270k weights), SGD,
# LARSMixed and LAMBMixed at 128, 1,024 and 4,096; 4 rates 2x apart each
# around the recipe's (SGD: 0.2 x B/128 capped at 1.6; LARS/LAMB: the
# 128 rate x sqrt(B/128)), chosen on seed 100, the best measured on seeds
# 101-103 (a best at the sweep's edge first extends it, `then`).
# `DEPTH_EPOCHS` on a GPU (12: the 36-run sweep took 13 min of an H200,
# 12 processes side by side); the CPU's reduced plan (`depth_reduced`) is
# 6 epochs, batches 1,024 and 4,096.
DEPTH_OPTIMIZERS = {"sgd": 0.2, "lars_mixed": 10 * R2, "lamb_mixed": 0.016 * R2}
DEPTH_BATCHES, DEPTH_EPOCHS = (128, 1024, 4096), 12
DEPTH_CHOOSE, DEPTH_MEASURE = (100,), (101, 102, 103)
DEPTH_EXTEND = 3

# Momentum tuned as LARS was (issue 60): ResNet-20 w16 at 4,096, 12 epochs.
# SGD with Nesterov momentum 0.9 at LARSMixed's warmup (5/42 of the run,
# 1.43 epochs) and at 2.9 epochs, rates 0.1-1.6 on seed 100; the best of
# the ten (fewest updates to 0.90, then final accuracy), chosen within
# one machine kind (`provenance.machine_kind`), for every kind with runs
# (each waiting run names its kind, `for_kind`; a runner starts its own
# kind's, `Plan.specs_here`), and while it lies at the sweep's lowest or
# highest rate, 2x beyond it first (at most `DEPTH_EXTEND`); then the best
# on seeds 101-105. LARSMixed and LAMBMixed likewise: each one's best on
# seed 100 within the kind (`engine.layerwise_best`; LARSMixed ran 2.5, 5,
# 10 on the CPU kind, LAMBMixed 0.016 there, and here 0.032 and 0.064 on
# TensorFlow, keyed apart from the H200 / JAX runs of those rates), then
# measured on seeds 101-105, so every arm has n = 5. A sweep's extensions
# are replayed from the runs no extension made (`engine.replay`), so each
# stays a run of the plan once the best it found is interior.
# The warmup bracketed (issue 74), fixed before it ran: once the grid's best
# is bracketed along the rate, while the best lies at the longest warmup
# run, the next warmup of `MOMENTUM_LONGER` at the best rate and its two
# neighbours (x 1/2, x 2) on seed 100, that row's best extended along the
# rate as the grid's is; 5.8 is 2 x 2.9, and 9 (not 11.6) leaves a quarter
# of the 12-epoch run to decay: a best at 9 is measured as it is, its
# warmup bounded below only. The bracketed best is measured on seeds
# 101-105 (the grid's best too, issue 60's arm), and SGD with plain
# momentum (no Nesterov) at its warmup and rate on the same seeds.
MOMENTUM_BATCH, MOMENTUM_RATES = 4096, (0.1, 0.2, 0.4, 0.8, 1.6)
MOMENTUM_WARMUPS = (recipe_rates.warmup_epochs_for(
    "lars_mixed", "auto", MOMENTUM_BATCH, DEPTH_EPOCHS), 2.9)
MOMENTUM_LONGER = (5.8, 9.0)
MOMENTUM_MEASURE = (101, 102, 103, 104, 105)
LAYERWISE = ("lars_mixed", "lamb_mixed")
SWEEP_ORDER = (0.4, 0.8, 0.2, 1.6, 0.1)  # The likeliest bests first.
# The decisive machine kind (issue 60), whose sweep and LAMBMixed points
# are the plan's own specs; another kind (a GPU's) runs the whole
# comparison through `then`, keyed apart by its backend.
MOMENTUM_KIND = "CPU VM / TensorFlow"

# A kill costs at most the updates since the last checkpoint, and the rerun
# ends bit for bit where the uninterrupted run ends (`kills.py`): per setup
# of `kills.SETUPS`, `KILLS` runs killed at steps drawn from seed 0; on one
# process of each backend (`FAULT_SETUPS`), `KILLS` more whose newest
# checkpoint file is then truncated or deleted (`fault="damage"`): the rerun
# falls back to the newest checkpoint that loads whole.
KILLS = 10
FAULT_SETUPS = ("jax", "torch", "tensorflow")

_TINY = dict(micro=16, flags=dict(steps_per_epoch=4), evals=2)
_R20 = dict(epochs=DEPTH_EPOCHS, workload="resnet20_w16")
TABLE = {
    "scaling": dict(
        record="batch_scaling_study", compared=True,
        about="Updates to 0.88/0.90 against the batch, rates tuned per "
              "batch; the grown batch's variants (ResNet-8 w4, "
              "Fashion-MNIST, seeds 0-9)",
        arms=(dict(arm="grid", grid=SCALING_FIXED),
              dict(arm="grid", grid=SECOND_FIXED, epochs=12),
              dict(arm="grid", grid=LARS_FIXED, optimizer="lars_mixed"),
              *(dict(arm="grown", variant=v, rate=r, seeds=s)
                for v, r, s in SCALING_GROWN),
              dict(arm="grown", variant="default", rate=0.2, seeds=range(3),
                   epochs=12),
              dict(arm="grown", variant="default", rate=10 * R2,
                   seeds=range(5), optimizer="lars_mixed"),
              dict(arm="grown", variant="start1_c4_unchanged_1024",
                   rate=10 * R2, seeds=range(3), optimizer="lars_mixed"))),
    "decisive": dict(
        record="batch_scaling_study", compared=True,
        about="The grown batch's defaults against fixed 1,024 at 0.8, "
              "seeds 100-109",
        by_seed=DECISIVE_SEEDS,
        arms=(dict(arm="grown", variant="default", rate=0.4),
              dict(arm="fixed", batch=1024, rate=0.8))),
    "baselines": dict(
        record="batch_scaling_study", compared=True,
        about="The defaults' baselines: a ramp written in advance, fixed "
              "512 at 1.6, fixed 1,024 at 0.8 over 36 epochs, seeds 100-109",
        by_seed=DECISIVE_SEEDS,
        arms=(dict(arm="ramp", schedule=RAMP_SCHEDULE, rate=0.4),
              dict(arm="fixed", batch=512, rate=1.6),
              dict(arm="fixed", batch=1024, rate=0.8, epochs=36,
                   seeds=BASELINE_LONG_SEEDS))),
    "ramps": dict(
        record="batch_scaling_study", compared=True,
        about="Ramps written without the noise scale (linear over a quarter "
              "of the samples; doubling at epochs 2, 4, 6) against the "
              "defaults, seeds 100-109",
        by_seed=DECISIVE_SEEDS,
        arms=tuple(dict(arm="ramp", schedule=s, rate=0.4, variant=v)
                   for v, s in UNPEEKED_RAMPS.items())),
    "lars_vs_sgd": dict(
        record="large_batch_study", compared=True,
        about="LARSMixed, LAMBMixed and SGD at 128 and 4,096 (ResNet-8 w4), "
              "one seed a rate",
        arms=(dict(arm="lbs", rows=LBS),)),
    "depth": dict(
        record="lars_depth_study", compared=True,
        about="SGD, LARSMixed, LAMBMixed on ResNet-20 w16, 12 epochs",
        arms=(dict(arm="depth_grid", epochs=DEPTH_EPOCHS,
                   batches=DEPTH_BATCHES),),
        then=("depth", dict(epochs=DEPTH_EPOCHS, batches=DEPTH_BATCHES))),
    "depth_reduced": dict(
        record="lars_depth_study", compared=True,
        about="SGD, LARSMixed, LAMBMixed on ResNet-20 w16, 6 epochs",
        arms=(dict(arm="depth_grid", epochs=6, batches=(1024, 4096)),),
        then=("depth", dict(epochs=6, batches=(1024, 4096)))),
    "momentum": dict(
        record="lars_depth_study", compared=True,
        about="Nesterov SGD, its rate and warmup bracketed, against "
              "LARSMixed, LAMBMixed and plain momentum, ResNet-20 w16 at "
              "4,096, n = 5 a side",
        arms=(dict(arm="nesterov_sweep", set=dict(for_kind=MOMENTUM_KIND)),
              *(dict(arm="fixed", batch=MOMENTUM_BATCH, rate=rate,
                     seeds=DEPTH_CHOOSE, optimizer="lamb_mixed", **_R20,
                     set=dict(run_backend="tensorflow",
                              for_kind=MOMENTUM_KIND))
                for rate in (0.032, 0.064))),
        then=("momentum", {})),
    # A rehearsal of the runner and the report in seconds (the GPU check's
    # `--smoke`, the tests): a fixed and a grown batch, 2 epochs of 4 steps.
    "smoke": dict(
        record="smoke_study",
        about="A rehearsal: tiny runs, 2 epochs of 4 steps",
        arms=(dict(arm="fixed", batch=32, rate=0.1, seeds=(0,), epochs=2,
                   **_TINY),
              dict(arm="grown", variant="default", rate=0.1, seeds=(0,),
                   epochs=2, set=dict(batch=8, micro=16, evals=2,
                                      flags=dict(steps_per_epoch=4))))),
    # Which backend runs the study's network fastest on a machine: fixed 128
    # and 1,024 for 2 epochs (the second's images/s: the first compiles) on
    # each backend, two side by side as the study runs them.
    "backend_speed": dict(
        record="backend_speed",
        about="Training images/s of the study's network per backend",
        arms=tuple(dict(arm="fixed", batch=b, rate=0.2, seeds=(0, 1),
                        epochs=2, set=dict(evals=1, run_backend=k))
                   for k in ("tensorflow", "jax", "torch")
                   for b in (128, 1024))),
    "kills": dict(
        record="kill_campaign",
        about="Kills of the command at random steps, resumed bit for bit; "
              "with a damaged newest checkpoint, resumed from the one before",
        arms=(dict(arm="kills", count=KILLS),
              dict(arm="kills", count=KILLS, setups=FAULT_SETUPS,
                   fault="damage"))),
}
