"""--workdir-as-is: the build-dir key, the plan of a local build, the provenance rule,
the option and the known build noise (pure parts; the real git reading is in
tests/integration/test_local_tree.py, the real build in tests/e2e/test_local_build.py)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from skippy.cli.app import build_mode_text
from skippy.cli.build import outcome_report
from skippy.cli.commands import command
from skippy.cli.entries import session_options as parse_session_args
from skippy.cli.options import render_table
from skippy.compile.builder import newest_builds, prune_local_builds
from skippy.compile.localtree import LOCAL_QUEUE_DIGEST, WorkdirState, local_dir_name, state_key, untracked_digest
from skippy.compile.noise import UI_NOTE, NoiseFilter
from skippy.compile.plan import STAMP_NAME, BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.core.errors import SettingsError
from skippy.core.ui import Console
from skippy.flows.build_session import LocalTree, SessionOutcome
from skippy.spot.provenance import expected_queue_digest, stale_next_step
from tests.unit.test_build_plan import SHA, TREE_OPTIONS, settings, toolchain, tree

HEAD = "1" * 40
F = untracked_digest(0o100644, b"int x;\n")


# --- the build-dir key -------------------------------------------------------------


def test_the_same_state_gives_the_same_key() -> None:
    a = state_key(HEAD, "diff --git a/x b/x\n+1\n", [("new.c", F)])
    assert a == state_key(HEAD, "diff --git a/x b/x\n+1\n", [("new.c", F)])
    assert len(a) == 64


@pytest.mark.parametrize(
    ("head", "diff", "untracked"),
    [
        ("2" * 40, "", ()),  # a commit on top
        (HEAD, "diff --git a/x b/x\n+1\n", ()),  # an uncommitted edit
        (HEAD, "", (("new.c", F),)),  # an untracked source file
        (HEAD, "", (("new.c", untracked_digest(0o100755, b"int x;\n")),)),  # its executable bit
        (HEAD, "", (("new.c", untracked_digest(0o100644, b"int y;\n")),)),  # its content
        (HEAD, "", (("other.c", F),)),  # its name
    ],
)
def test_any_change_of_the_workdir_changes_the_key(head: str, diff: str, untracked: tuple[tuple[str, bytes]]) -> None:
    clean = state_key(HEAD, "", ())
    assert state_key(head, diff, untracked) != clean


def test_untracked_order_does_not_matter_and_a_file_is_not_a_diff() -> None:
    g = untracked_digest(0o100644, b"b")
    assert state_key(HEAD, "", [("a", F), ("b", g)]) == state_key(HEAD, "", [("b", g), ("a", F)])
    assert state_key(HEAD, "a", ()) != state_key(HEAD, "", [("a", F)])


def test_a_local_build_dir_sits_beside_the_prepared_one(tmp_path: Path) -> None:
    provenance = frozenset({"SKIPPY_UPSTREAM_SHA", "SKIPPY_QUEUE_DIGEST"})
    s, tr, tc = settings(tmp_path), tree(tmp_path, options=TREE_OPTIONS | provenance), toolchain("cpu")

    def planned(state: WorkdirState | None) -> BuildPlan:
        digest = LOCAL_QUEUE_DIGEST if state else "q" * 64
        return plan_build(
            build_request("cpu", s), s, tree=tr, toolchain=tc, patched_sha=HEAD if state else SHA,
            upstream_sha="a" * 40, queue_digest=digest, local_state=state,
        )  # fmt: skip

    prepared = planned(None)
    state = WorkdirState(head=HEAD, key="f" * 64, changed=("src/llama.cpp",))
    local = planned(state)
    assert prepared.build_dir.name == f"cpu-{prepared.digest}"
    assert local.build_dir == prepared.build_dir.parent / f"cpu-{prepared.digest}-local-{'f' * 12}"
    assert local.build_dir.name == local_dir_name("cpu", prepared.digest, state)
    # the same flags: only the dir differs, and the stamp says which mode and state
    assert local.digest == prepared.digest
    assert local.stamp["mode"] == "local"
    assert local.stamp["workdir_state"] == "f" * 64
    assert local.stamp["patched_sha"] == HEAD
    assert "mode" not in prepared.stamp, "a prepared build's stamp is unchanged (no reconfigure of existing dirs)"
    # the binary says so itself: queue digest "local", the prepared upstream
    assert (local.define("SKIPPY_QUEUE_DIGEST"), local.define("SKIPPY_UPSTREAM_SHA")) == ("local", "a" * 40)
    assert prepared.define("SKIPPY_QUEUE_DIGEST") == "q" * 64
    assert planned(WorkdirState(head=HEAD, key="e" * 64)).build_dir != local.build_dir


# --- the provenance rule -----------------------------------------------------------


def test_local_is_expected_only_when_asked_for() -> None:
    assert expected_queue_digest("d" * 64, workdir_as_is=False) == "d" * 64
    assert expected_queue_digest("d" * 64, workdir_as_is=True) == "local"


def test_a_local_binary_where_a_prepared_one_is_expected_says_how_to_check_it() -> None:
    step = stale_next_step("d" * 64, LOCAL_QUEUE_DIGEST, "cpu")
    assert "built from the workdir as it stood" in step
    assert "nox -s spot-check -- --backend cpu --workdir-as-is" in step
    assert "nox -s build-cpu" in step
    assert stale_next_step(LOCAL_QUEUE_DIGEST, "d" * 64, "cpu") == (
        "it is not a build of the workdir as it stands: nox -s build-cpu -- --workdir-as-is"
    )
    assert stale_next_step("d" * 64, "e" * 64, "vulkan") == "rebuild it: nox -s build-vulkan"
    assert stale_next_step("d" * 64, None, "cpu") == "rebuild it: nox -s build-cpu"


# --- the option, the report, status --------------------------------------------------


def test_the_option_is_declared_once_and_parsed_by_the_session() -> None:
    build = command("build")
    assert build.option("workdir_as_is").flag == "--workdir-as-is"
    assert parse_session_args(["--workdir-as-is", "--no-spot-check"], {}, "cpu").workdir_as_is
    assert not parse_session_args([], {}, "cpu").workdir_as_is
    assert "| `--workdir-as-is` |" in render_table(build.all_options)
    assert "| `-D NAME[:TYPE]=VALUE`, `--define NAME[:TYPE]=VALUE` |" in render_table(build.all_options)
    assert "| `-j N`, `--jobs N` |" in render_table(build.all_options)
    with pytest.raises(SettingsError) as info:
        parse_session_args(["--workdir-as-it-is"], {}, "cpu")
    assert "did you mean --workdir-as-is?" in info.value.what


def test_the_json_report_says_local_plainly() -> None:
    state = WorkdirState(head=HEAD, key="f" * 64, changed=("a.c",))
    local = LocalTree(workdir=Path("/w"), state=state, upstream_sha="a" * 40)
    report = outcome_report(SessionOutcome(backend="cpu", local=local))
    assert report["mode"] == "local"
    assert report["local_tree"] == {
        "workdir": "/w",
        "head": HEAD,
        "state": "f" * 64,
        "changed": ["a.c"],
        "upstream_sha": "a" * 40,
        "queue_digest": "local",
    }
    assert "local_tree" not in outcome_report(SessionOutcome(backend="cpu"))


def test_status_names_the_mode_of_the_newest_build(tmp_path: Path) -> None:
    s = settings(tmp_path)
    binaries = {"llama-server": "/b/bin/llama-server"}
    local = {"mode": "local", "patched_sha": HEAD, "source_dir": str(s.workdir), "binaries": binaries}
    assert build_mode_text(local, s) == (
        f"local: .deps/llama.cpp as it stood at HEAD {HEAD[:12]} (--workdir-as-is), queue digest local"
    )
    elsewhere = {**local, "source_dir": str(tmp_path / "copy")}
    assert build_mode_text(elsewhere, s).startswith(f"local: {tmp_path / 'copy'} as it stood")
    prepared = {"mode": "prepared", "patched_sha": SHA, "binaries": binaries}
    assert build_mode_text(prepared, s) == f"of the prepared tree, patched {SHA[:12]}"
    # configured (or its build failed) but nothing built: not called built
    assert build_mode_text({**prepared, "binaries": {}}, s) == (
        f"of the prepared tree, patched {SHA[:12]}; configured only, no binaries yet"
    )
    assert build_mode_text({**local, "binaries": {}}, s).endswith(
        "queue digest local; configured only, no binaries yet"
    )


def _built(root: Path, name: str, when: int, **stamp: str) -> Path:
    """A build dir with its stamp and llama-server, both dated ``when``."""
    d = root / name
    (d / "bin").mkdir(parents=True)
    (d / STAMP_NAME).write_text(json.dumps({"backend": name.split("-", 1)[0], "patched_sha": SHA, **stamp}))
    (d / "bin" / "llama-server").write_bytes(b"")
    for path in (d / STAMP_NAME, d / "bin" / "llama-server"):
        os.utime(path, (when, when))
    return d


def test_the_newest_build_of_a_backend_carries_its_mode(tmp_path: Path) -> None:
    _built(tmp_path, "cpu-1", 1_000)
    _built(tmp_path, "cpu-1-local-abc", 2_000, mode="local")
    assert newest_builds(tmp_path)["cpu"]["mode"] == "local"
    # a later build of the prepared tree relinks its server: it is the newest again
    os.utime(tmp_path / "cpu-1" / "bin" / "llama-server", (3_000, 3_000))
    newest = newest_builds(tmp_path)["cpu"]
    assert (newest["mode"], newest["build_dir"]) == ("prepared", str(tmp_path / "cpu-1"))


def test_older_local_build_dirs_are_pruned_the_newest_kept(tmp_path: Path) -> None:
    prepared = _built(tmp_path, "cpu-1", 100)
    states = [_built(tmp_path, f"cpu-1-local-{i:012x}", 1_000 + i, mode="local") for i in range(5)]
    other_flags = _built(tmp_path, "cpu-2-local-000000000000", 10, mode="local")
    other_backend = _built(tmp_path, "vulkan-1-local-000000000000", 10, mode="local")
    unstamped = tmp_path / "cpu-1-local-ffffffffffff"  # a configure that never wrote its stamp
    unstamped.mkdir()
    # the build just made is the oldest by time stamps (a rebuild of an old state): it stays
    current = states[0]
    removed = prune_local_builds(current, keep=3)
    assert sorted(removed) == sorted(states[1:3])
    for kept in (current, states[3], states[4], prepared, other_flags, other_backend, unstamped):
        assert kept.is_dir(), kept
    assert prune_local_builds(current, keep=3) == []  # nothing more to remove


# --- known noise -------------------------------------------------------------------

UI_WARNING = [
    "CMake Warning at /src/llama.cpp/scripts/ui-assets.cmake:359 (message):",
    "  UI: no assets available - building without an embedded UI.  In a",
    "  disconnected environment, download the pre-built UI from a llama.cpp",
    "  release at https://github.com/ggml-org/llama.cpp/releases and extract to",
    "  tools/ui/dist.",
    "",
    "",
]


def _filtered(lines: list[str]) -> tuple[list[str], list[str]]:
    shown: list[str] = []
    notes: list[str] = []
    f = NoiseFilter(shown.append, notes.append)
    for line in lines:
        f(line)
    f.close()
    return shown, notes


def test_the_ui_assets_warning_is_dropped_and_said_once() -> None:
    lines = ["[1/3] Provisioning UI assets", *UI_WARNING, "[2/3] Linking CXX executable bin/llama-server", *UI_WARNING]
    shown, notes = _filtered([*lines, "ninja: no work to do."])
    assert shown == [
        "[1/3] Provisioning UI assets",
        "[2/3] Linking CXX executable bin/llama-server",
        "ninja: no work to do.",
    ]
    assert notes == [UI_NOTE]


def test_other_warnings_are_shown_whole() -> None:
    other = [
        "CMake Warning at /src/llama.cpp/scripts/ui-assets.cmake:357 (message):",
        "  UI: provisioning failed; embedding stale assets from /b/dist",
        "",
        "CMake Warning at CMakeLists.txt:10 (message):",
        "  something else",
        "[3/3] done",
    ]
    shown, notes = _filtered(other)
    assert shown == other
    assert notes == []
    # a head at the very end is not lost
    assert _filtered(UI_WARNING[:1]) == (UI_WARNING[:1], [])


def test_the_note_is_at_verbose_only() -> None:
    quiet, verbose = io.StringIO(), io.StringIO()
    for stream, flag in ((quiet, False), (verbose, True)):
        console = Console(env={}, stream=stream, verbose=flag)
        f = NoiseFilter(console.info, console.detail)
        for line in UI_WARNING:
            f(line)
    assert "no assets available" not in quiet.getvalue()
    assert "hidden" in verbose.getvalue()
