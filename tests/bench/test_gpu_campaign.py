"""`bench/gpu_campaign.py --smoke`: every part runs, on JAX and torch, and
lands in the JSON and the Markdown (the GPU numbers need a GPU; this only
proves the code that measures them runs)."""

import json
import os
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="the campaign drives JAX and torch in processes of its own; "
           "run once, under the JAX suite")


def test_smoke_campaign_fills_every_part(tmp_path):
    out = tmp_path / "campaign"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu_campaign.py"),
         "--smoke", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "campaign complete" in proc.stdout

    record = json.loads(out.with_suffix(".json").read_text())
    assert record["smoke"] and record["sessions"][-1]["finished"] == [
        "a", "b", "c"]
    a = record["a"]["results"]
    assert {k.split("|")[0] for k in a} == {"jax", "torch"}
    assert all(r["images_per_s"] > 0 for r in a.values())
    assert {"lso_sgd", "lars_mixed", "lamb_mixed"} == {
        k.split("|")[2] for k in a}
    b = record["b"]["results"]
    assert set(b) == {"jax", "torch"}
    assert all(r["LARSMixed"] > 0 and r["LSO(SGD)"] > 0 for r in b.values())
    c = record["c"]
    assert c["complete"]
    assert {r["optimizer"] for r in c["runs"]} == {
        "sgd", "lars_mixed", "lamb_mixed"}
    assert {r["phase"] for r in c["runs"]} == {"short", "long"}
    assert all(r["backend"] == "jax" for r in c["runs"])

    table = out.with_suffix(".md").read_text()
    for heading in ("## a. ResNet-50 training throughput",
                    "## b. Optimizer step", "## c. Large-batch study"):
        assert heading in table
    assert "LARSMixed / LSO(SGD) on torch >= 0.97:" in table

    # A rerun finds every part done and measures nothing again.
    again = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu_campaign.py"),
         "--smoke", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(out.with_suffix(".json").read_text())["a"] == record["a"]
    assert len(json.loads(out.with_suffix(".json").read_text())["c"][
        "runs"]) == len(c["runs"])
