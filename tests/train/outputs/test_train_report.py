"""The command's closing line on the gradient noise scale (`report.describe`):
what the measured B_simple means for the batch, in one line."""

import pytest

from keras_largebatch.train.outputs import report

# Text from numbers: the same on every backend.
pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize(
    "b_simple, batch, words",
    [
        (4096.0, 128, "room to grow"),
        (200.0, 128, "near the critical batch"),
        (100.0, 4096, "mostly wasted"),
        (float("nan"), 128, "not measured"),
        (-3.0, 128, "not measured"),
    ],
)
def test_describe_says_in_one_line_what_the_batch_gains(b_simple, batch,
                                                        words):
    line = report.describe(b_simple, batch)
    assert words in line and "\n" not in line


def test_describe_gives_steps_relative_to_minimum():
    # B = B_simple: S = 2 S_min, E = 2 E_min; doubling B: 1.5/2 = 75%.
    line = report.describe(512.0, 512)
    assert "steps 2.00x the minimum, examples 2.00x" in line
    assert "takes 75% of the steps" in line
