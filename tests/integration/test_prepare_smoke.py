from __future__ import annotations

import pytest

from skippy.prepare import Target, prepare
from skippy.ui import Console
from tests.conftest import Project


@pytest.mark.integration
def test_smoke(queued_project: Project) -> None:
    s = queued_project.settings()
    r = prepare(s, Target.pinned(), console=Console(verbose=True))
    print(r)
    r2 = prepare(s, Target.pinned(), console=Console(verbose=True))
    print(r2)
    assert r2.action == "noop"
