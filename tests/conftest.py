import contextlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
BENCH = Path(__file__).parents[1] / "bench"


@contextlib.contextmanager
def bench_on_path():
    """bench/ on sys.path for the block only, as the bench scripts put it there themselves: their
    bare module names (``common``, ``paper``) left importable could shadow PyPI packages in later
    tests."""
    path = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        yield
    finally:
        sys.path[:] = path
        sys.modules.pop("common", None)


def bench_module(name: str):
    """bench/NAME.py imported as ``bench_NAME`` (see ``bench_on_path``)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with bench_on_path():
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def avx512_target():
    """An AVX-512 x86 target, for tests whose schedules or rewrites are decided for 16-lane vectors
    (the code they produce still builds and runs for the host)."""
    import tvm
    return tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})


@pytest.fixture(scope="session")
def target():
    from adaptune.measure.target import host_target
    return host_target()


@pytest.fixture(scope="session")
def conv_space(target):
    from adaptune.search.space import KnobSpace
    from adaptune.model.workloads import get_workload
    return KnobSpace(get_workload("tiny-conv").mod(), target, seed=1)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """``adaptune ARGS`` in this process, in ``tmp_path``: (exit code, stdout, stderr).  ``main`` is
    what ``python -m adaptune.cli`` runs; a process per call paid 6-7 s of imports (test_cli keeps
    real processes where the process itself is the point)."""
    from adaptune.cli import main

    def run(*args):
        monkeypatch.chdir(tmp_path)
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err
    return run
