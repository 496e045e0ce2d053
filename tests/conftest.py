import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


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
