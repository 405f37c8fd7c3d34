"""Steps of prepare read and tested alone: the decision, the target check, the leftovers of killed runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.core.errors import SettingsError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.checkout import OLD_PREFIX, PARTIAL_PREFIX, missing, remove_partials
from skippy.queue.prepare import decide
from skippy.queue.run import Run
from skippy.queue.target import Target, validate
from skippy.queue.upstream import Resolved

UP, PATCHED, DIGEST = "a" * 40, "b" * 40, "d" * 64


def stamp() -> wd.Stamp:
    return wd.Stamp(upstream_sha=UP, patched_sha=PATCHED, queue_digest=DIGEST, base_commit=UP)


def test_decide_is_noop_only_when_upstream_queue_and_head_all_match() -> None:
    at = Resolved(UP, UP, "git")
    assert decide(stamp(), at, DIGEST, PATCHED) == "noop"
    assert decide(None, at, DIGEST, PATCHED) == "apply"
    assert decide(stamp(), at, "e" * 64, PATCHED) == "apply"  # the queue changed
    assert decide(stamp(), at, DIGEST, "c" * 40) == "apply"  # HEAD moved
    assert decide(stamp(), Resolved("f" * 40, "f" * 40, "git"), DIGEST, PATCHED) == "apply"  # another upstream


def test_validate_refuses_a_bad_sha_before_reading_the_pin(tmp_path: Path) -> None:
    settings = Settings.from_table(tmp_path, {"pin_file": "missing.txt"}, {})
    with pytest.raises(SettingsError, match=r"--sha 'xyz' is not a commit SHA"):
        validate(settings, Target.at("xyz"))
    assert validate(settings, Target.at("4df29be4f4c3")) is None
    with pytest.raises(SettingsError, match=r"pin file missing.txt does not exist"):
        validate(settings, Target.pinned())
    (tmp_path / "missing.txt").write_text("# the pin\n" + UP.upper() + "\n", encoding="utf-8")
    assert validate(settings, Target.pinned()) == UP


def test_remove_partials_puts_back_a_replaced_checkout_and_removes_partial_clones(tmp_path: Path) -> None:
    settings = Settings.from_table(tmp_path, {"workdir": "deps/llama.cpp"}, {})
    run = Run(settings, Console(quiet=True))
    parent = tmp_path / "deps"
    partial = parent / f"{PARTIAL_PREFIX}llama.cpp-0123abcd"
    (partial / ".git").mkdir(parents=True)
    replaced = parent / f"{OLD_PREFIX}llama.cpp-4567ef01"
    (replaced / "src").mkdir(parents=True)
    (replaced / "src" / "kept.c").write_text("mine\n", encoding="utf-8")
    other = parent / f"{PARTIAL_PREFIX}other-0123abcd"  # another workdir's: not ours to remove
    other.mkdir()
    assert missing(run)
    remove_partials(run)
    assert not partial.exists()
    assert not replaced.exists()
    assert (settings.workdir / "src" / "kept.c").read_text(encoding="utf-8") == "mine\n"
    assert other.is_dir()
    assert not missing(run)
