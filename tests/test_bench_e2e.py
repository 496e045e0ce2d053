"""bench/e2e.py's verdict on the e2e issue's targets, from one model's evaluation."""
from adaptune.model.evaluate import Evaluation, Row

from conftest import bench_module

e2e = bench_module("e2e")


def _evaluation(own: list[float], anchors: dict[str, list[float]]) -> Evaluation:
    """adaptune's samples beside each anchor's (seconds, round by round); rows by their medians."""
    samples = {"adaptune": own, **anchors}
    rows = [Row(name, 1e3 * sorted(s)[len(s) // 2], 1e3 * min(s), 0.0) for name, s in samples.items()]
    return Evaluation("m", rows, samples=samples)


def test_a_ratio_target_needs_the_median_and_the_paired_ratio():
    # Medians: 7.9 / 10 = 0.79 meets 0.8; round by round 0.7, 0.9, 0.85: paired 0.85 misses it.
    ev = _evaluation([7.0, 7.9, 8.5], {"onnxruntime": [10.0, 8.8, 10.0],
                                       "torch-compile": [20.0, 20.0, 20.0], "pytorch-eager": [30.0, 30.0, 30.0]})
    t = e2e.targets(ev, tuning_s=600.0)
    assert t["onnxruntime"]["median_ratio"] < 0.8 < t["onnxruntime"]["paired"]
    assert not t["onnxruntime"]["met"]
    assert t["torch-compile"]["met"] and t["pytorch-eager"]["met"] and t["tuning"]["met"]
    line = e2e.verdict("m", 7.9, t)
    assert "vs onnxruntime <= 0.8x: 0.790x median, 0.850x paired MISSED" in line
    assert "tuning 10.0 min met" in line


def test_every_target_met_and_what_cannot_be_judged():
    ev = _evaluation([7.0, 7.0, 7.0], {"onnxruntime": [10.0, 10.0, 10.0], "torch-compile": [9.0, 9.0, 9.0]})
    t = e2e.targets(ev, tuning_s=31 * 60.0)
    assert t["onnxruntime"]["met"] and t["torch-compile"]["met"]
    assert not t["pytorch-eager"]["met"] and "vs pytorch-eager <= 1.0x: not timed MISSED" in e2e.verdict("m", 7.0, t)
    assert not t["tuning"]["met"]
    reused = e2e.targets(ev, tuning_s=0.0)
    assert not reused["tuning"]["met"] and "tuning not timed (work dir reused)" in e2e.verdict("m", 7.0, reused)
