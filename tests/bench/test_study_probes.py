"""`bench/study/probes.py`: a batch's efficiency read off the small
batch's validation-loss curve (hand-computed), McCandlish's B_noise
recovered from its own closed form, the critical batch at a tolerance and
the batch the defaults ask for from B_simple."""

import pytest

from bench.study import engine
from bench.study import probes


@pytest.fixture(scope="module")
def probe():
    return probes


def _small(seed, start, curve):
    """The small batch's probes of one seed, one per point of `curve`,
    the last the whole epoch."""
    return [dict(phase="probe", epoch_at=3, batch=128, seed=seed,
                 start_val_loss=start,
                 val_loss=loss, examples=x, b_simple=float("nan"),
                 steps=None if x == 60000 else x // 128)
            for x, loss in curve]


def _large(batch, end, b_simple=float("nan"), seed=1):
    return dict(phase="probe", epoch_at=3, batch=batch, seed=seed,
                start_val_loss=0.60,
                val_loss=end, examples=60000, b_simple=b_simple, steps=None)


def test_examples_to_a_loss_interpolates_the_first_crossing(probe):
    curve = [(15000, 0.50), (30000, 0.45), (45000, 0.47), (60000, 0.40)]
    # 0.48 lies 2/5 of the way from 0.50 to 0.45: 15,000 + 6,000.
    assert probe.examples_to(curve, 0.48, 0.60) == pytest.approx(21000)
    # 0.55: from the start (0, 0.60) halfway to 0.50: 7,500.
    assert probe.examples_to(curve, 0.55, 0.60) == pytest.approx(7500)
    # 0.46: crossed between 15,000 (0.50) and 30,000 (0.45), 4/5 of the
    # way: 27,000 (the later rise and fall do not count).
    assert probe.examples_to(curve, 0.46, 0.60) == pytest.approx(27000)
    assert probe.examples_to(curve, 0.39, 0.60) is None
    # At or above the start: reached at 0 examples.
    assert probe.examples_to(curve, 0.61, 0.60) == 0.0


def test_efficiency_is_the_small_batchs_examples_over_the_batchs(probe):
    a = _small(1, 0.60, [(30000, 0.50), (60000, 0.40)])
    b = _small(2, 0.60, [(30000, 0.52), (60000, 0.44)])
    # A seed whose whole epoch has not run yet is left out.
    c = _small(3, 0.60, [(30000, 0.30)])
    summary = probe.analyse([*c, *a, *b, _large(512, 0.45),
                             _large(1024, 0.56), _large(2048, 0.35)])[3]
    # 512 ends at 0.45: seed 1's curve reaches it at 45,000 (0.75), seed
    # 2's at 30,000 + 30,000 * 0.07 / 0.08 = 56,250 (0.9375).
    assert summary["efficiency_each"][512] == pytest.approx([0.75, 0.9375])
    assert summary["efficiency"][512] == pytest.approx((0.75 + 0.9375) / 2)
    # 1,024 ends at 0.56: 12,000 (0.2) and 30,000 * 0.04 / 0.08 (0.25).
    assert summary["efficiency"][1024] == pytest.approx(0.225)
    # 2,048 ends below both curves: capped at 1.
    assert summary["efficiency"][2048] == 1.0
    assert summary["efficiency"][128] == 1.0
    # The small batch against its other seed: seed 1's 0.40 is never
    # reached on seed 2's curve (1); seed 2's 0.44 on seed 1's at 30,000 +
    # 30,000 * 0.06 / 0.10 = 48,000 (0.8).
    assert sorted(summary["small_own"]) == pytest.approx([0.8, 1.0])
    # The loss after the epoch above the small batch's mean (0.42): 512
    # +0.03, 1,024 +0.14, 2,048 -0.07. Within 0.05: 512; 2,048 is past a
    # batch that is not, so it does not count.
    assert summary["excess"][512] == pytest.approx(0.03)
    assert summary["excess"][2048] == pytest.approx(-0.07)
    assert probe.analyse([*a, *b, _large(512, 0.45), _large(1024, 0.56),
                          _large(2048, 0.35)], tolerance=0.05)[3][
        "critical"] == 512
    # A second seed of 512 ending at 0.41: its loss is the mean (0.43,
    # +0.01), its efficiency the mean over both probes on both curves
    # (0.75, 0.9375; 0.4 / 0.44 reached at 57,000 / never: 0.95, 1).
    two = probe.analyse([*a, *b, _large(512, 0.45),
                         _large(512, 0.41, seed=2)])[3]
    assert two["excess"][512] == pytest.approx(0.01)
    assert two["efficiency"][512] == pytest.approx(
        (0.75 + 0.9375 + 0.95 + 1.0) / 4)
    assert summary["critical"] == 128  # the default tolerance, 0.02
    # No probe ended above the start (0.60): all three are fitted.
    assert summary["rose"] == []
    # The checkpoint evaluated as the probes are replaces the trajectory's
    # start: 1,024's 0.56 now lies between the start (0.58) and seed 1's
    # first point (0.50): 30,000 * 0.02 / 0.08 = 7,500 (0.125), and on seed
    # 2's, 30,000 * 0.02 / 0.06 = 10,000 (1/6).
    start = dict(engine.probe(3, 128, 1, 1, start=True), val_loss=0.58,
                 examples=128,
                 start_val_loss=0.60, b_simple=float("nan"))
    again = probe.analyse([start, *a, *b, _large(1024, 0.56)])[3]
    assert again["start_val_loss"] == 0.58
    assert again["efficiency"][1024] == pytest.approx((0.125 + 1 / 6) / 2)
    # A probe that ends above the checkpoint's loss rose: efficiency 0, and
    # left out of the fit (which the other two points alone decide).
    rose = probe.analyse([start, *a, *b, _large(512, 0.45),
                          _large(1024, 0.56), _large(2048, 0.70)])[3]
    assert rose["rose"] == [2048] and rose["efficiency"][2048] == 0.0
    assert rose["b_noise"] == pytest.approx(probe.fit_b_noise(
        [(512, rose["efficiency"][512]), (1024, rose["efficiency"][1024])],
        128))


def test_b_noise_is_recovered_from_mccandlishs_closed_form(probe):
    for b_noise in (90.0, 600.0, 5000.0):
        points = [(b, probe.mccandlish_efficiency(b, b_noise, 128))
                  for b in (256, 512, 1024, 2048)]
        assert probe.fit_b_noise(points, 128) == pytest.approx(b_noise,
                                                               rel=1e-6)
    # The closed form itself: at B = B_noise the examples double against
    # the limit of small batches, (1 + 128/600) / (1 + 1) here.
    assert probe.mccandlish_efficiency(600, 600, 128) == pytest.approx(
        (1 + 128 / 600) / 2)


def test_critical_batch_needs_every_smaller_batch_within_tolerance(probe):
    excess = {128: 0.0, 256: 0.005, 512: 0.021, 1024: 0.015}
    assert probe.critical_batch(excess, 0.02) == 256
    assert probe.critical_batch(excess, 0.025) == 1024
    assert probe.critical_batch(excess, 0.001) == 128
    assert probe.critical_batch({128: 0.01}, 0.001) is None


def test_the_defaults_batch_from_b_simple(probe):
    # 4 x B_simple on 512 x 2**j, the nearest in log scale, up to 1,024:
    # 4 x 150 = 600 rounds to 512, 4 x 200 = 800 to 1,024 (past 724).
    assert probe.policy_batch(150.0) == 512
    assert probe.policy_batch(200.0) == 1024
    assert probe.policy_batch(5000.0) == 1024
    assert probe.policy_batch(10.0) == 512
    assert probe.policy_batch(float("nan")) == 512
