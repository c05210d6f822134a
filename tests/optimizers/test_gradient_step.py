"""What LARSMixed hands its inner rule: one `GradientStep` argument per step,
and no attribute written on the rule (or on itself) during a step."""

import dataclasses
import dis
import os
import sys
import threading
import types

import keras
import numpy as np
import pytest

import keras_largebatch as klb
from keras_largebatch.optimizers import layerwise

SCALE = 2.0**10


def _model_and_grads(seed=3):
    model = keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3),
    ])
    rng = np.random.default_rng(seed)
    grads = [rng.normal(0, 1e-3, v.shape).astype("float32")
             for v in model.trainable_variables]
    return model.trainable_variables, grads


def _record_steps(optimizer):
    """Records every `gradient_step` the inner rule's `apply` receives."""
    seen = []
    inner = optimizer.inner_optimizer
    original = inner.apply

    def apply(grads, trainable_variables=None, gradient_step=None):
        seen.append(gradient_step)
        return original(grads, trainable_variables, gradient_step)

    inner.apply = apply
    return seen


def test_rule_gets_the_inverse_scale_and_the_norms_of_the_scaled_gradients():
    variables, grads = _model_and_grads()
    optimizer = klb.LARSMixed(0.1, weight_decay=1e-4, initial_scale=SCALE)
    seen = _record_steps(optimizer)
    optimizer.apply([keras.ops.convert_to_tensor(g * np.float32(SCALE))
                     for g in grads], variables)
    (step,) = seen
    assert isinstance(step, layerwise.GradientStep)
    assert not step.unscaled
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(step.inverse_scale), 1 / SCALE)
    assert step.reduced == (keras.backend.backend() == "tensorflow")
    inner = optimizer.inner_optimizer
    for v, g in zip(variables, grads):
        expected = np.sum((g.astype("float64") * SCALE) ** 2)
        key = optimizer._var_key(v)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(step.squared_norms[key]), expected,
            rtol=1e-5)
    assert not hasattr(inner, "gradient_step")
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.inverse_scale = 1.0


def test_clipping_rule_gets_unscaled_gradients_and_no_norms():
    variables, grads = _model_and_grads()
    optimizer = klb.LARSMixed(0.1, initial_scale=SCALE, clipnorm=1.0)
    seen = _record_steps(optimizer)
    optimizer.apply([keras.ops.convert_to_tensor(g * np.float32(SCALE))
                     for g in grads], variables)
    (step,) = seen
    assert step.unscaled and not step.squared_norms


def _held_objects(*roots):
    """Every object of keras_largebatch, Keras or this test that `roots`
    hold, through attributes and containers, but for the variables (whose
    values are the state a step writes)."""
    seen, visited, stack = {}, set(), list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in visited or isinstance(obj, (keras.Variable, type)):
            continue
        visited.add(id(obj))
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
            continue
        if isinstance(obj, (dict, types.MappingProxyType)):
            stack.extend(obj.values())
            continue
        module = type(obj).__module__ or ""
        if not module.startswith(("keras_largebatch", "keras", __name__)):
            continue
        seen[id(obj)] = obj
        if hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
        if dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    return list(seen.values())


class _AttributeWrites:
    """Records, while active, every attribute written or deleted on one of
    `watched`, by any Python code of keras_largebatch, Keras or this test.

    A trace function sees each `STORE_ATTR`/`DELETE_ATTR` and each call of
    `setattr`/`delattr`/`object.__setattr__`; after it, the watched objects'
    `__dict__` entries are compared with their last values, so the write is
    seen whatever expression named the object (a holder restored after the
    step, such as a slot set for the step's duration, is seen too).
    """

    _OPS = {dis.opmap["STORE_ATTR"], dis.opmap["DELETE_ATTR"]}
    _SETTERS = (setattr, delattr, object.__setattr__, object.__delattr__)

    def __init__(self, watched):
        self.watched = [o for o in watched if hasattr(o, "__dict__")]
        self.last = [dict(vars(o)) for o in self.watched]
        self.written = []
        self.pending = set()
        self.roots = tuple(
            os.path.dirname(m.__file__) for m in (keras, klb)
        ) + (__file__,)

    def _compare(self):
        for obj, last in zip(self.watched, self.last):
            now = vars(obj)
            for name in set(now) | set(last):
                if now.get(name, last) is not last.get(name, last):
                    self.written.append((type(obj).__name__, name))
            last.clear()
            last.update(now)

    def _trace(self, frame, event, arg):
        if event == "call":
            if not frame.f_code.co_filename.startswith(self.roots):
                return None
            frame.f_trace_opcodes = True
            return self._trace
        if event == "opcode":
            if frame in self.pending:
                self.pending.discard(frame)
                self._compare()
            if frame.f_code.co_code[frame.f_lasti] in self._OPS:
                self.pending.add(frame)
        elif event == "return" and frame in self.pending:
            self.pending.discard(frame)
            self._compare()
        return self._trace

    def _profile(self, frame, event, arg):
        if event == "c_return" and any(arg is f for f in self._SETTERS):
            self._compare()

    def __enter__(self):
        sys.settrace(self._trace)
        threading.settrace(self._trace)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        threading.settrace(None)
        sys.setprofile(None)
        self._compare()


class _Holder:
    step = None


class _HoldingLARS(klb.LARS):
    """Hands its step to the rule through a helper, restored after the
    step: what the watcher must see."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.holder = _Holder()

    def apply(self, grads, trainable_variables=None):
        self.holder.step = "in progress"
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self.holder.step = None


def test_the_watcher_sees_a_write_on_a_helper_restored_after_the_step(
        apply_step):
    variables, grads = _model_and_grads()
    optimizer = _HoldingLARS(0.1)
    apply_step(optimizer, grads, variables)
    watched = _held_objects(optimizer)
    assert optimizer.holder in watched
    with _AttributeWrites(watched) as watcher:
        apply_step(optimizer, grads, variables)
    assert ("_Holder", "step") in watcher.written
    assert optimizer.holder.step is None  # Restored: invisible afterwards.


def test_a_step_writes_no_attribute_on_the_optimizers_or_their_helpers(
        apply_step):
    variables, grads = _model_and_grads()
    optimizer = klb.LARSMixed(0.1, weight_decay=1e-4, initial_scale=SCALE)
    scaled = [g * np.float32(SCALE) for g in grads]
    apply_step(optimizer, scaled, variables)  # Builds.
    watched = _held_objects(optimizer)
    assert optimizer.inner_optimizer in watched
    assert len(watched) > 2  # Helpers too.
    before = keras.ops.convert_to_numpy(variables[0])
    with _AttributeWrites(watched) as watcher:
        apply_step(optimizer, scaled, variables)
        apply_step(
            optimizer, [g * np.float32(np.inf) for g in scaled], variables)
    assert watcher.written == []
    after = keras.ops.convert_to_numpy(variables[0])
    assert not np.array_equal(before, after)  # The finite step did update.


def test_rule_of_each_variable_has_named_fields():
    variables, _ = _model_and_grads()
    optimizer = klb.LARS(0.1, weight_decay=1e-4)
    optimizer.build(variables)
    kernel, bias = variables[:2]
    assert optimizer.rule_for(kernel) == layerwise.VariableRule(
        updated=True, decayed=True, adapted=True)
    assert optimizer.rule_for(bias) == layerwise.VariableRule(
        updated=True, decayed=False, adapted=False)


def test_fused_update_is_declared_by_the_rule_class_and_kept_by_subclasses():
    class MyLARS(klb.LARS):
        pass

    found = [layerwise.fused_update_step(opt(0.1))
             for opt in (klb.LARS, MyLARS, klb.LAMB)]
    if keras.backend.backend() == "torch":
        from keras_largebatch.optimizers import torch_lamb
        from keras_largebatch.optimizers import torch_lars

        assert found == [torch_lars.update_step, torch_lars.update_step,
                         torch_lamb.update_step]
    elif keras.backend.backend() == "tensorflow":
        from keras_largebatch.optimizers import tf_lars

        assert found == [tf_lars.update_step, tf_lars.update_step, None]
    else:
        assert found == [None, None, None]
