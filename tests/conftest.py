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
