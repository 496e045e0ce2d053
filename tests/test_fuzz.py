"""Bad input, fuzzed (hypothesis): CLI arguments, workload specs and model files always end in a
clear error or a valid object, never a traceback."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptune.cli as cli
import adaptune.cli.models as cli_models
import adaptune.cli.ops as cli_ops
from adaptune.model.frontends import ModelError, load_model
from adaptune.model.workloads import WorkloadError, get_workload

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class _WouldWork(Exception):
    """Raised instead of starting real work: the arguments were accepted."""


WORDS = ["tune-op", "tune", "compile", "bench", "report", "workloads", "models", "--trials", "--target",
         "--strategy", "--work-dir", "--resume", "--seed", "--batch-size", "--timeout", "--db", "-o",
         "--input-shape", "--rpc", "--device-key", "L8", "tiny-dense", "demo-cnn", "x.onnx", "0", "-3", "7",
         "1,3,8,8", "llvm", "cuda", '{"kind": "llvm"}', "{", "sa", "chameleon", "nope", "conv2d:1,2", "",
         "looptune", "--search", "--time-limit", "--steps", "greedy1", "nan", "64", "--policy"]


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=7))
def test_cli_arguments_never_crash(tmp_path_factory, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))

    def would_work(*a, **k):
        raise _WouldWork
    import adaptune.model.evaluate as evaluate
    for mod, name in ((cli_models, "_build_best"), (evaluate, "evaluate"), (cli_ops, "make_measurer"),
                      (cli_models, "make_measurer")):
        monkeypatch.setattr(mod, name, would_work)
    import adaptune.looptune.evaluate as lt_evaluate
    import adaptune.scheduler as scheduler
    monkeypatch.setattr(lt_evaluate, "Evaluator", would_work)
    import adaptune.tuner as tuner
    monkeypatch.setattr(tuner, "tune_tir", would_work)
    monkeypatch.setattr(scheduler, "tune_model", would_work)
    try:
        code = cli.main(argv)
    except _WouldWork:
        return
    except SystemExit as e:          # only --help may leave through argparse
        assert e.code == 0
        return
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    if code != 0:
        lines = out.err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("adaptune: error:"), out.err


@FUZZ
@given(st.one_of(
    st.text(max_size=30),
    st.builds(lambda kind, dims: f"{kind}:{','.join(map(str, dims))}",
              st.sampled_from(["conv2d", "depthwise", "dense", "matmul", "pool"]),
              st.lists(st.integers(-5, 1 << 40), max_size=10))))
def test_workload_specs_give_a_workload_or_a_workload_error(spec):
    try:
        wl = get_workload(spec)
    except WorkloadError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert wl.flops > 0 and all(d >= 0 for d in wl.shape)     # padding may be 0


def _valid_onnx_bytes() -> bytes:
    from test_models import _onnx_model
    return _onnx_model().SerializeToString()


@FUZZ
@given(st.one_of(st.binary(max_size=300),
                 st.integers(0, 2000).map(lambda n: _valid_onnx_bytes()[:n]),
                 st.tuples(st.integers(0, 2000), st.binary(min_size=1, max_size=8)).map(
                     lambda t: _valid_onnx_bytes()[:t[0]] + t[1] + _valid_onnx_bytes()[t[0] + len(t[1]):])))
def test_model_files_load_or_fail_with_a_model_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("m") / "fuzzed.onnx"
    path.write_bytes(data)
    try:
        load_model(str(path))
    except ModelError as e:
        assert str(e) and "\n" not in str(e)


def test_an_onnx_weight_that_does_not_fill_its_shape_is_a_malformed_file(tmp_path):
    """Hypothesis once flipped the byte that holds the first weight's third dimension: ONNX's checker
    passes such a file, and its weights failed to decode in a graph pass, as a traceback."""
    import onnx
    from test_models import _onnx_model
    proto = _onnx_model()
    del proto.graph.initializer[0].dims[1:]            # W: 216 floats, now said to be 8
    path = tmp_path / "damaged.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(ModelError, match=r"malformed ONNX file .*tensor 'W' does not decode"):
        load_model(str(path))


def test_fuzz_helpers_really_reject(capsys):
    """The harness itself: a known-bad command is caught as exit 2 with one line."""
    assert cli.main(["tune-op", "--trials", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    with pytest.raises(ModelError):
        load_model("no-such-model")
