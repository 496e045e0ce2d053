"""``torch.compile(model, backend="adaptune")`` (issue 32, item 6): a tiny model with a graph
break tunes, compiles and matches eager; the same work dir a second time measures nothing."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from adaptune.measure import run as measure


class Broken(nn.Module):
    """conv+bias+ReLU, a graph break, then a dense layer with an integer-indexed embedding added."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 6 * 6, 10)
        self.emb = nn.Embedding(7, 10)

    def forward(self, x, ids):
        y = torch.relu(self.conv(x))
        torch._dynamo.graph_break()
        return {"logits": self.fc(y.flatten(1)) + self.emb(ids).sum(1), "features": y}


def _no_record_lines(err: str) -> list[str]:
    """The missing-record warnings' lines."""
    return [line for line in err.splitlines() if "no record in the tuning database" in line]


def _no_record(err: str) -> list[str]:
    """The missing-record warnings' lines, each up to the kernels it names."""
    return [line.split("): they run")[0] for line in _no_record_lines(err)]


def _compiled(model, work_dir):
    torch._dynamo.reset()
    return torch.compile(model, backend="adaptune", options={"trials": 2, "work_dir": str(work_dir), "library": False})


@pytest.mark.slow
def test_the_dynamo_backend_tunes_each_graph_and_reuses_its_work_dir(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    model = Broken().eval()
    x, ids = torch.randn(1, 3, 6, 6), torch.tensor([[1, 4, 6]])
    with torch.no_grad():
        want = model(x, ids)
        got = _compiled(model, tmp_path)(x, ids)
    assert set(got) == {"logits", "features"}
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err
    assert err.count("trials measured") == 2, err             # one line per graph: both pieces were compiled
    untuned = _no_record(err)                                 # 2 trials leave kernels untuned: named once each
    assert untuned and all(f"removing {tmp_path / 'graph-'}" in line and "a larger `trials` option" in line
                           for line in _no_record_lines(err)), err
    assert len(list(tmp_path.glob("graph-*/compiled.json"))) == 2

    def refuse(*_a, **_k):
        raise AssertionError("the second call measured a kernel")
    monkeypatch.setattr(measure.Measurer, "measure", refuse)
    x2 = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        got = _compiled(model, tmp_path)(x2, ids)
        want = model(x2, ids)
    torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err
    assert err.count("nothing measured") == 2 and _no_record(err) == untuned, err

    # a work dir whose records are gone (tuned on another CPU, say) still runs, with one warning for that graph
    emptied = sorted(tmp_path.glob("graph-*/database_tuning_record.json"))[0]
    emptied.write_text("")
    with torch.no_grad():
        got = _compiled(model, tmp_path)(x2, ids)
    torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err
    assert err.count("nothing measured") == 2, err
    assert any(re.search(r"for (\d+) of the model's \1 kernels", line) for line in _no_record(err)), err
    assert f"removing {emptied.parent} tunes them afresh" in err, err


def test_unknown_backend_options_are_refused():
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown adaptune backend option"):
        torch.compile(nn.Linear(2, 2), backend="adaptune", options={"trails": 2})(torch.randn(1, 2))
