"""Which config keys name a program, and how skippy answers each (skippy.core.gitconfig)."""

from __future__ import annotations

import pytest

from skippy.core import gitconfig
from skippy.core.gitconfig import Entry, handling


@pytest.mark.parametrize(
    ("key", "answer"),
    [
        ("filter.lfs.smudge", "off"),
        ("filter.Evil.Process", "off"),
        ("core.hooksPath", "off"),
        ("pager.log", "off"),
        ("diff.evil.textconv", "refused"),
        ("diff.external", "refused"),
        ("merge.ours.driver", "refused"),
        ("credential.helper", "refused"),
        ("credential.https://example.invalid/x.helper", "refused"),
        ("remote.origin.uploadpack", "refused"),
        ("includeIf.gitdir:/x/.path", "refused"),
        ("core.worktree", "refused"),
        ("alias.co", "unread"),
        ("mergetool.vim.cmd", "unread"),
    ],
)
def test_a_program_key_is_answered(key: str, answer: str) -> None:
    found = handling(key)
    assert found is not None and found[0] == answer


@pytest.mark.parametrize(
    "key",
    [
        "core.abbrev",
        "remote.origin.url",
        "diff.evil.binary",
        "merge.evil.name",
        "filter.x.required",
        "include.path",
        "credential.helperx",
        "diff..textconv",
        "pager.",
    ],
)
def test_a_key_that_names_no_program_is_left_alone(key: str) -> None:
    assert handling(key) is None


def test_filters_are_switched_off_per_driver_and_keep_their_case() -> None:
    audit = gitconfig._judge([Entry("filter.Evil.clean", "c"), Entry("filter.Evil.smudge", "c"), Entry("core.x", "c")])
    assert audit.refused == ()
    assert audit.overrides[-4:] == (
        ("filter.Evil.clean", ""),
        ("filter.Evil.smudge", ""),
        ("filter.Evil.process", ""),
        ("filter.Evil.required", "false"),
    )
    assert audit.overrides[: len(gitconfig.ALWAYS_OFF)] == gitconfig.ALWAYS_OFF


def test_every_row_says_why() -> None:
    for pattern, (how, why) in gitconfig.PROGRAM_KEYS.items():
        assert pattern == pattern.lower() and how in ("off", "refused", "unread") and why, pattern
