"""git am numbers the mails of its own run ("Patch failed at 0001 ..."), not the queue's patches:
skippy's messages name the stopped patch by its label (issue 43, item 7)."""

from __future__ import annotations

import pytest

from skippy.core.errors import ConflictError
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.integration.test_change_loop import QUIET, two_core_patches_prepared

pytestmark = pytest.mark.integration


def two_core_patches(project: Project) -> tuple[str, str]:
    """core/0001 adds a file, core/0002 edits line 5; the next upstream commit edits line 5 too."""
    up = project.upstream
    pin = two_core_patches_prepared(project)
    target = up.commit(
        "upstream: rework line 5", {"src/llama-model.cpp": up.read("src/llama-model.cpp").replace("line 5\n", "u5\n")}
    )
    return pin, target


def test_a_session_stopped_at_the_second_patch_names_it(project: Project) -> None:
    _pin, target = two_core_patches(project)
    with pytest.raises(ConflictError) as info:
        prepare(project.settings(), Target.at(target), console=QUIET, interactive=True)
    details = info.value.details or ""
    assert "Patch failed at 0001" not in details
    assert "Patch failed at core/0002-core-line-5.patch (core: line 5)" in details


def test_a_re_prepare_applying_from_the_second_patch_names_it(project: Project) -> None:
    pin, _target = two_core_patches(project)
    # core/0002 changed (core/0001's commit is reused): one mail in git am's run, and it fails
    up = project.upstream
    other = up.read("src/llama-model.cpp", pin).replace("// model line 7\n", "// not there\n")
    broken = project.patch(pin, "core: line 5", {"src/llama-model.cpp": other}).replace(
        b"-// model line 7", b"-// model line 7 as it never was"
    )
    project.add_patch("core", "0002-core-line-5.patch", broken)
    with pytest.raises(ConflictError) as info:
        prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    details = info.value.details or ""
    assert "core/0002-core-line-5.patch does not apply" in info.value.what
    assert "Patch failed at 0001" not in details
    assert "Patch failed at core/0002-core-line-5.patch (core: line 5)" in details
