"""The adaptive batch's policies: each registered one passes its closed-form
check (the batch grows to c * B_simple, or follows its schedule), and no
module lists their names but the registries; on the backend of the run."""

import ast
import os
import pathlib
import sys

import numpy as np
import pytest

import keras_largebatch as klb
from keras_largebatch.adaptive_batch import policies
from keras_largebatch.adaptive_batch import rules

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
from adaptive_problem import B_SIMPLE  # noqa: E402
from adaptive_problem import NOISE_POLICIES  # noqa: E402
from adaptive_problem import OPTIMIZERS  # noqa: E402
from adaptive_problem import SCHEDULE_POLICIES  # noqa: E402
from adaptive_problem import fit  # noqa: E402
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


@pytest.mark.backend_independent
def test_every_registered_policy_has_a_closed_form_check():
    assert set(NOISE_POLICIES) | set(SCHEDULE_POLICIES) == set(
        policies.POLICIES)


@pytest.mark.parametrize("policy", NOISE_POLICIES)
@pytest.mark.parametrize("name, c", [(name, 1.0) for name in sorted(OPTIMIZERS)]
                         + [("sgd", 4.0)])
def test_noise_scale_policy_grows_to_b_simple_and_stops_there(name, c,
                                                              policy):
    x, y, w = regression(d=64, n=8192, sigma=1.0)
    model = linear_model(w)
    model.compile(OPTIMIZERS[name](), "mse")
    callback = klb.AdaptiveBatch(16, max_batch_size=2048, beta=0.98,
                                 policy=policy, c=c, start_multiple=1)
    history = fit(model, x, y, callback, epochs=3, batch=16, shuffle=True)
    batches = history["global_batch_size"]
    # Starts at 16 * 2, far below c * B_simple; one epoch measures it.
    assert batches[0] == 32
    assert c * B_SIMPLE / 2 <= batches[1] <= 2 * c * B_SIMPLE
    assert batches[2] == batches[1]
    np.testing.assert_allclose(history["gradient_noise_scale"][-1], B_SIMPLE,
                               rtol=0.25)


def _listed_names(tree):
    """The string sets of every tuple, list, set and dict literal in
    `tree`."""
    for node in ast.walk(tree):
        items = (node.keys if isinstance(node, ast.Dict) else node.elts
                 if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else ())
        yield {i.value for i in items
               if isinstance(i, ast.Constant) and isinstance(i.value, str)}


@pytest.mark.backend_independent
def test_policies_and_rules_are_listed_only_in_their_registries():
    # A second list of the names (the command's flag choices, a check) is
    # one a new entry would miss: everything reads POLICIES and RULES. A
    # copy holds all the names, or all but one once an entry is added
    # (`--lr_scaling`'s 'auto', 'linear', 'sqrt' are another concept).
    package = pathlib.Path(klb.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for names in _listed_names(ast.parse(path.read_text())):
            for registry in (policies.POLICIES, rules.RULES):
                if len(names & set(registry)) >= max(2, len(registry) - 1):
                    found.append((str(path.relative_to(package)),
                                  sorted(names)))
    assert not found
