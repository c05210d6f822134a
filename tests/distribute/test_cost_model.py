import json
import math
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.distribute import cost_model as cm

# The cost model's arithmetic: the same on every backend (what it
# builds or measures under TensorFlow runs there).
pytestmark = pytest.mark.backend_independent

# Two nodes' worth of hand-computable numbers: g = 4, 16 GPUs.
NET = cm.Network(
    gpus_per_node=4,
    intra_alpha=2e-6,
    intra_beta=1e-10,
    inter_alpha=1e-5,
    inter_beta=2e-10,
)
ON_TF = keras.backend.backend() == "tensorflow"


def test_ring_matches_hand_computed_value():
    # 2 * 3 * 1e-5 + 2 * 3 / 4 * 1e6 * 1e-9
    assert cm.ring_allreduce_time(1e6, 4, 1e-5, 1e-9) == pytest.approx(1.56e-3)
    assert cm.ring_allreduce_time(1e6, 1, 1e-5, 1e-9) == 0.0


def test_flat_ring_across_nodes_pays_the_slowest_link():
    # alpha = 1e-5, beta = 2e-10: 2 * 15 * 1e-5 + 2 * 15 / 16 * 1e6 * 2e-10
    assert cm.flat_allreduce_time(1e6, 16, NET) == pytest.approx(6.75e-4)


def test_hierarchical_matches_hand_computed_value():
    # reduce = broadcast = 2 * 3 * 2e-6 + 2 * 3 / 4 * 1e6 * 1e-10 = 1.62e-4
    # leaders (4 nodes) = 2 * 3 * 1e-5 + 2 * 3 / 4 * 1e6 * 2e-10 = 3.6e-4
    assert cm.hierarchical_allreduce_time(1e6, 16, NET) == pytest.approx(6.84e-4)


def test_one_node_hierarchical_is_the_intra_node_ring():
    for gpus in (1, 2, 4):
        expected = cm.ring_allreduce_time(1e6, gpus, 2e-6, 1e-10)
        hier = cm.hierarchical_allreduce_time(1e6, gpus, NET)
        assert hier == pytest.approx(expected)
        assert cm.flat_allreduce_time(1e6, gpus, NET) == pytest.approx(expected)
    assert cm.crossover_bytes(4, NET) == 0


def test_best_threshold_is_where_the_curves_cross():
    net = cm.Network()
    for gpus in (16, 256, 1024):
        n = cm.crossover_bytes(gpus, net)
        ring, hier = (
            cm.flat_allreduce_time(n, gpus, net),
            cm.hierarchical_allreduce_time(n, gpus, net),
        )
        assert ring == pytest.approx(hier, rel=1e-6)
        for below, above in ((0.5 * n, 2 * n),):
            hier = cm.hierarchical_allreduce_time
            assert hier(below, gpus, net) < cm.flat_allreduce_time(below, gpus, net)
            assert hier(above, gpus, net) > cm.flat_allreduce_time(above, gpus, net)
    # Closed form at 1024 GPUs, g = 8, default alphas and betas.
    d_alpha = 2 * 1023 * 10e-6 - 4 * 7 * 5e-6 - 2 * 127 * 10e-6
    d_beta = 3.5e-10 + 2 * 127 / 128 * 0.08e-9 - 2 * 1023 / 1024 * 1e-10
    assert cm.crossover_bytes(1024, net) == pytest.approx(d_alpha / d_beta, abs=1)


def test_crossover_edge_cases():
    flat_wins = NET._replace(inter_alpha=0.0, intra_alpha=0.0)
    assert cm.crossover_bytes(16, flat_wins) == 0
    hier_wins = NET._replace(intra_beta=0.0, inter_beta=0.0)
    assert cm.crossover_bytes(16, hier_wins) == math.inf


def test_hybrid_is_never_worse_than_ring_or_hierarchical_per_bucket():
    rng = np.random.default_rng(0)
    net = cm.Network()
    for gpus in (8, 64, 1024, 2048):
        threshold = cm.crossover_bytes(gpus, net)
        for b in rng.integers(1, 2**28, size=50):
            hybrid = cm.hybrid_allreduce_time([b], gpus, net, threshold)
            best = min(
                cm.flat_allreduce_time(b, gpus, net),
                cm.hierarchical_allreduce_time(b, gpus, net),
            )
            assert hybrid == pytest.approx(best, rel=1e-12)


def test_crossover_threshold_minimises_the_hybrid_total():
    net = cm.Network()
    buckets = cm.fuse(cm.gradient_bytes("resnet50"), 4 * cm.MiB)
    best = cm.crossover_bytes(1024, net)
    at_best = cm.hybrid_allreduce_time(buckets, 1024, net, best)
    for threshold in (0, 2**20, 2**24, 2**26, 2**30, math.inf):
        other = cm.hybrid_allreduce_time(buckets, 1024, net, threshold)
        assert at_best <= other + 1e-15


def test_fusion_packs_reverse_order_up_to_threshold():
    assert cm.fuse([1, 2, 3, 4, 10], 6) == [10, 4, 6]
    assert cm.fuse([5, 1, 1], 7) == [7]
    assert cm.fuse([1, 2, 3], 0) == [3, 2, 1]
    assert cm.fuse([], 10) == []
    sizes = cm.gradient_bytes("resnet50")
    assert sum(cm.fuse(sizes, 25 * cm.MiB)) == sum(sizes)
    with pytest.raises(ValueError, match="`fusion_threshold_bytes`"):
        cm.fuse([1], -1)


def test_fusion_cuts_per_tensor_latencies():
    sizes = cm.gradient_bytes("alexnet_bn")
    row = cm.compare(sizes, 1024, cm.Network(), fusion_threshold_bytes=0)
    assert row["buckets"] == 26
    assert row["ring"] == pytest.approx(row["per_tensor"])
    expected = sum(cm.flat_allreduce_time(n, 1024, cm.Network()) for n in sizes)
    assert row["per_tensor"] == pytest.approx(expected)


def test_step_speedup_follows_the_overlap_formula():
    sizes = cm.gradient_bytes("resnet50")
    row = cm.compare(sizes, 512, cm.Network(), compute_seconds=0.2)
    assert row["step_speedup"] == pytest.approx(
        (0.2 + row["per_tensor"]) / (0.2 + row["hybrid"])
    )
    # Half of backward (2/3 of 0.3 s) hides 0.1 s of communication.
    assert cm.step_time(0.25, 0.3, overlap=0.5) == pytest.approx(0.45)
    assert cm.step_time(0.05, 0.3, overlap=0.5) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="`overlap`"):
        cm.step_time(0.1, 0.1, overlap=1.5)


def test_inter_alpha_for_speedup_reproduces_the_target():
    sizes = cm.gradient_bytes("resnet50")
    alpha = cm.inter_alpha_for_speedup(
        sizes, 1024, cm.Network(), 11.0, compute_seconds=0.225
    )
    net = cm.Network()._replace(inter_alpha=alpha)
    row = cm.compare(sizes, 1024, net, compute_seconds=0.225)
    assert row["step_speedup"] == pytest.approx(11.0, rel=1e-6)
    assert cm.inter_alpha_for_speedup(sizes, 1024, cm.Network(), 1e6) is None


def test_bad_cluster_arguments_raise():
    with pytest.raises(ValueError, match="Received: gpus=12"):
        cm.flat_allreduce_time(1, 12, cm.Network())
    with pytest.raises(ValueError, match="`gpus_per_node`"):
        cm.flat_allreduce_time(1, 8, cm.Network(gpus_per_node=0))
    with pytest.raises(ValueError, match="`inter_beta`"):
        cm.hierarchical_allreduce_time(1, 16, NET._replace(inter_beta=-1.0))


def test_alexnet_bn_has_60967976_parameters():
    shapes = cm.alexnet_bn_shapes()
    assert len(shapes) == 26
    assert sum(int(np.prod(s)) for s in shapes) == 60_967_976
    assert sum(cm.gradient_bytes("alexnet_bn", 2)) == 2 * 60_967_976


def test_resnet50_has_214_tensors_of_97_6_mib():
    shapes = cm.resnet50_shapes()
    assert len(shapes) == 214
    assert sum(int(np.prod(s)) for s in shapes) == 25_583_592
    assert sum(cm.gradient_bytes("resnet50")) / cm.MiB == pytest.approx(97.59, abs=0.01)


# Shapes do not depend on the backend; TF builds ResNet-50 fastest here.
@pytest.mark.backend_independent(home="tensorflow")
@pytest.mark.skipif(not ON_TF, reason="built once, under TensorFlow")
def test_resnet50_table_matches_keras_applications_in_order():
    shapes = cm.resnet50_shapes()
    model = keras.applications.ResNet50(weights=None)
    assert shapes == [tuple(w.shape) for w in model.trainable_weights]


def test_saved_model_gradient_bytes(tmp_path):
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(3), keras.layers.Dense(2)]
    )
    path = str(tmp_path / "m.keras")
    model.save(path)
    assert cm.gradient_bytes(path) == [60, 12, 24, 8]
    with pytest.raises(ValueError, match="`model`"):
        cm.gradient_bytes(str(tmp_path / "missing.keras"))
    with pytest.raises(ValueError, match="`bytes_per_element`"):
        cm.gradient_bytes("resnet50", 3)


def test_fit_recovers_alpha_and_beta_from_synthetic_timings():
    alpha, beta = 37e-6, 1 / 3.2e9
    timings = [
        dict(bytes=n, workers=p, seconds=cm.ring_allreduce_time(n, p, alpha, beta))
        for n in (4096, 2**20, 2**24)
        for p in (2, 4, 8)
    ]
    fitted = cm.fit_alpha_beta(timings)
    np.testing.assert_allclose(fitted, (alpha, beta), rtol=1e-9)


def test_fit_rejects_too_few_sizes_and_bad_rows(tmp_path):
    with pytest.raises(ValueError, match="`timings`"):
        cm.fit_alpha_beta([{"bytes": 8, "seconds": 1.0, "workers": 2}] * 3)
    with pytest.raises(ValueError, match="`workers`"):
        cm.fit_alpha_beta([{"bytes": 8, "seconds": 1.0, "workers": 1}])
    with pytest.raises(ValueError, match="`timings` file"):
        cm.load_timings(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"bytes": 8}]))
    with pytest.raises(ValueError, match="`timings`"):
        cm.load_timings(str(bad))
    good = tmp_path / "good.json"
    rows = [{"bytes": 8, "seconds": 1.0, "workers": 2}]
    good.write_text(json.dumps({"timings": rows}))
    assert cm.load_timings(str(good)) == rows


def _parse(*argv):
    from absl import flags

    fv = cm.define_flags(flags.FlagValues())
    fv(["cost_model", *argv])
    return fv


def test_run_prints_table_and_writes_rows(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rows = cm.run(_parse("--model=alexnet_bn", "--gpus=8,1024", f"--json_out={out}"))
    printed = capsys.readouterr().out
    assert "| GPUs | nodes | buckets |" in printed
    assert "best hierarchical_threshold_bytes at 1024 GPUs" in printed
    expected = cm.compare(
        cm.gradient_bytes("alexnet_bn"), 1024, cm.Network(), compute_seconds=0.129
    )
    assert rows[1] == pytest.approx(expected)
    saved = json.loads(out.read_text())["rows"]
    assert [r["gpus"] for r in saved] == [8, 1024]
    assert saved[1]["hybrid"] == pytest.approx(expected["hybrid"])


def test_run_fits_links_from_a_timings_file(tmp_path, capsys):
    alpha, beta = 50e-6, 1e-9
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps([
        dict(bytes=n, workers=2, seconds=cm.ring_allreduce_time(n, 2, alpha, beta))
        for n in (1000, 10**6)
    ]))
    fv = _parse(
        "--model=alexnet_bn", "--gpus=16", f"--fit_from_json={path}",
        "--fit_applies_to=inter",
    )
    rows = cm.run(fv)
    net = cm.Network(inter_alpha=alpha, inter_beta=beta)
    expected = cm.compare(
        cm.gradient_bytes("alexnet_bn"), 16, net, compute_seconds=0.129
    )
    assert rows[0]["hybrid"] == pytest.approx(expected["hybrid"], rel=1e-6)
    assert "fitted alpha = 50.0 us" in capsys.readouterr().out
    with pytest.raises(ValueError, match="Received: gpus=x"):
        cm.run(_parse("--gpus=x"))


@pytest.mark.backend_independent(home="tensorflow")
@pytest.mark.skipif(not ON_TF, reason="one subprocess run is enough")
def test_python_dash_m_entry_point_prints_the_table():
    result = subprocess.run(
        [sys.executable, "-m", "keras_largebatch.distribute.cost_model",
         "--model=resnet50", "--gpus=8,1024"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    assert "| 1024 | 128 | 2 |" in result.stdout
    assert "paper: 11x at 1024 GPUs" in result.stdout


def test_localhost_measurement_rejects_bad_sizes_before_starting_workers():
    with pytest.raises(ValueError, match="`sizes`"):
        cm.measure_localhost(sizes=(4096,))
    with pytest.raises(ValueError, match="Received: sizes=\\[6, 8\\]"):
        cm.measure_localhost(sizes=(6, 8))


@pytest.mark.backend_independent(home="tensorflow")
@pytest.mark.skipif(not ON_TF, reason="measures TF collectives")
def test_localhost_measurement_returns_two_worker_timings():
    timings = cm.measure_localhost(sizes=(2**12, 2**20), repeats=2, timeout=180)
    assert [t["bytes"] for t in timings] == [2**12, 2**20]
    assert all(t["workers"] == 2 and t["seconds"] > 0 for t in timings)


def test_sparse_exchange_matches_hand_computed_values():
    # One node (4 GPUs): all-gather of 8 k bytes, k = 0.01 * 1e6 / 4 = 2,500:
    # 3 * 2e-6 + 3 * 20,000 * 1e-10
    assert cm.sparse_allreduce_time(1e6, 0.01, 4, NET) == pytest.approx(1.2e-5)
    # 16 GPUs: dense reduce and broadcast in each node (1.62e-4 each), then
    # the leaders' all-gather: 3 * 1e-5 + 3 * 20,000 * 2e-10
    assert cm.sparse_allreduce_time(1e6, 0.01, 16, NET) == pytest.approx(
        2 * 1.62e-4 + 4.2e-5
    )


def test_sparse_crossover_is_one_over_the_peers_without_latency():
    # alpha = 0: the ring moves 2 (p - 1) / p * n bytes, top-k 2 d (p - 1) n
    # (value + index per entry): they cross at d = 1 / p; across nodes with
    # free intra-node links, against the hierarchy, at d = 1 / nodes.
    flat = cm.Network(gpus_per_node=8, intra_alpha=0.0, intra_beta=1e-10,
                      inter_alpha=0.0, inter_beta=1e-10)
    buckets = [4 * 2**20, 2**20]
    assert cm.sparse_crossover_density(buckets, 8, flat) == pytest.approx(
        1 / 8, rel=1e-6
    )
    free_intra = flat._replace(intra_beta=0.0)
    hier = sum(cm.hierarchical_allreduce_time(b, 64, free_intra)
               for b in buckets)
    assert cm.sparse_crossover_density(
        buckets, 64, free_intra, dense_seconds=hier
    ) == pytest.approx(1 / 8, rel=1e-6)


def test_compare_reports_the_sparse_scheme_and_its_crossovers():
    row = cm.compare([2**20] * 10, 64, cm.Network(), topk_density=0.001)
    assert row["topk"] == pytest.approx(sum(
        cm.sparse_allreduce_time(b, 0.001, 64, cm.Network())
        for b in cm.fuse([2**20] * 10, 64 * 2**20)
    ))
    assert 0 <= row["topk_crossover_hybrid"] <= 1
    assert 0 <= row["topk_crossover"] <= 1


@pytest.mark.parametrize("density", [0.0, 1.5, -0.01])
def test_sparse_density_out_of_range_is_refused(density):
    with pytest.raises(ValueError, match=f"density={density}"):
        cm.sparse_allreduce_time(1e6, density, 8, NET)
