"""The spot check follows the change, on real git: the families touched between two commits or in the
work tree, the record of a passed spot check as the next baseline, and the pin when there is none
(no record, a commit the workdir lost, another upstream)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skippy.core.errors import CommandError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.flows import follow
from skippy.maintain.touched import touched_between, touched_in_work_tree
from skippy.spot.models import DEFAULT_MODEL
from skippy.spot.report import ModelResult, SpotCheckReport
from tests.gitfixtures import Upstream
from tests.unit.test_touched import MODEL, TREE

pytestmark = pytest.mark.integration

QWEN2 = "src/models/qwen2.cpp"
BERT = "src/models/bert.cpp"


def hooked(path: str, text: str | None = None) -> str:
    """A family file with a hook after its layer's output (the generated lane's kind of edit)."""
    source = text if text is not None else TREE[path]
    return source.replace(
        'cb(cur, "l_out", il);', 'cb(cur, "l_out", il);\n        llama_skippy_layer_hook(this, cur, il);'
    )


@pytest.fixture
def tree(tmp_path: Path, git_env: dict[str, str]) -> tuple[Upstream, Settings]:
    """A llama.cpp-shaped workdir (its first commit is the pin) and the project's settings."""
    root = tmp_path / "proj"
    up = Upstream.create(root / ".deps" / "llama.cpp", git_env)
    up.commit("upstream", TREE)
    settings = Settings.from_table(root, {"cache_dir": "cache"}, {"PATH": os.environ["PATH"], "HOME": git_env["HOME"]})
    return up, settings


def repo_of(up: Upstream, settings: Settings) -> Repo:
    return Repo(up.path, settings.env)


def families(found: object) -> list[str]:
    return [t.family for t in found]  # type: ignore[attr-defined]


def passed(*models: str) -> SpotCheckReport:
    return SpotCheckReport(
        server="bin/llama-server",
        results=[ModelResult(model=m, path=None, verdict="pass", content="OK", tokens=1) for m in models],
    )


def test_a_committed_change_touches_its_family_and_a_case_its_arch(tree: tuple[Upstream, Settings]) -> None:
    up, settings = tree
    pin = up.commits[0]
    rope = MODEL.replace(
        "        case LLM_ARCH_QWEN2:\n            return LLAMA_ROPE",
        "        case LLM_ARCH_QWEN2:\n        case LLM_ARCH_BERT:\n            return LLAMA_ROPE",
    )
    head = up.commit("a queue", {QWEN2: hooked(QWEN2), "src/llama-model.cpp": rope, "src/llama-graph.cpp": "// x\n"})
    found = touched_between(repo_of(up, settings), pin, head)
    assert [(t.family, t.reasons) for t in found] == [
        ("bert", ("src/llama-model.cpp: case LLM_ARCH_BERT added to the switch in llama_model_rope_type",)),
        ("qwen2", ("src/models/qwen2.cpp: llama_model_qwen2::graph::graph changed",)),
    ]
    # a shared file alone touches no family
    shared = up.commit("shared", {"src/models/models.h": TREE["src/models/models.h"] + "// more\n"})
    assert touched_between(repo_of(up, settings), head, shared) == ()
    # a baseline the workdir does not have is git's error, not an empty answer
    with pytest.raises(CommandError):
        touched_between(repo_of(up, settings), "0" * 40, head)


def test_the_work_tree_as_it_stands(tree: tuple[Upstream, Settings]) -> None:
    up, settings = tree
    pin = up.commits[0]
    (up.path / BERT).write_text(hooked(BERT), encoding="utf-8")  # edited, not staged
    (up.path / "src/models/qwen2-extra.cpp").write_text(  # untracked, not ignored
        "void llama_model_qwen2::load_extra(llama_model_loader & ml) {}\n", encoding="utf-8"
    )
    found = touched_in_work_tree(repo_of(up, settings), pin)
    assert families(found) == ["bert", "jina-bert-v2", "qwen2"]
    assert found[-1].reasons == ("src/models/qwen2-extra.cpp: llama_model_qwen2::load_extra added",)


def test_no_record_means_the_pin_then_a_passed_check_is_the_next_baseline(tree: tuple[Upstream, Settings]) -> None:
    up, settings = tree
    pin = up.commits[0]
    first = up.commit("queue", {QWEN2: hooked(QWEN2), BERT: hooked(BERT)})
    following = follow.follow_change(settings, "cpu", up.path, patched_sha=first, upstream_sha=pin)
    assert following.baseline is not None and following.baseline.kind == "pin"
    assert following.baseline.commit == pin
    assert "no earlier cpu build of this workdir passed its spot check" in following.baseline.said
    assert [(f.touched.family, f.model) for f in following.families] == [
        ("bert", None),
        ("jina-bert-v2", None),
        ("qwen2", "tiny:qwen2"),
    ]
    assert following.models(()) == (DEFAULT_MODEL, "tiny:qwen2")
    # a failed check records nothing
    failed = passed(DEFAULT_MODEL, "tiny:qwen2")
    failed.results[1].verdict = "fail"
    kwargs = {"patched_sha": first, "upstream_sha": pin, "queue_digest": "d" * 64}
    assert follow.certify(settings, "cpu", up.path, spot=failed, **kwargs) is None
    assert not (settings.cache_dir / follow.RECORD_DIR).exists()
    # a passed one is recorded, per backend
    path = follow.certify(settings, "cpu", up.path, spot=passed(DEFAULT_MODEL, "tiny:qwen2"), **kwargs)
    assert path is not None and path.parent == settings.cache_dir / "certified" and path.name.endswith("-cpu.json")
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["patched_sha"] == first and record["models"] == [DEFAULT_MODEL, "tiny:qwen2"]
    assert record["upstream_sha"] == pin and record["backend"] == "cpu"
    # the next change is measured from the certified tree: only what it touches
    second = up.commit("qwen2 again", {QWEN2: hooked(QWEN2, hooked(QWEN2))})
    again = follow.follow_change(settings, "cpu", up.path, patched_sha=second, upstream_sha=pin)
    assert again.baseline is not None and again.baseline.kind == "certified" and again.baseline.commit == first
    assert [f.touched.family for f in again.families] == ["qwen2"]
    # another backend has no record yet: the pin
    other = follow.follow_change(settings, "vulkan", up.path, patched_sha=second, upstream_sha=pin)
    assert other.baseline is not None and other.baseline.kind == "pin"
    # the certified tree itself touches nothing: the spot check runs the models asked for, as before
    same = follow.follow_change(settings, "cpu", up.path, patched_sha=first, upstream_sha=pin)
    assert same.families == () and same.models(()) == ()


def test_a_record_the_workdir_cannot_use_falls_back_to_the_pin(tree: tuple[Upstream, Settings]) -> None:
    up, settings = tree
    pin = up.commits[0]
    head = up.commit("queue", {QWEN2: hooked(QWEN2)})
    path = follow.record_path(settings, up.path, "cpu")

    def baseline() -> follow.Baseline:
        found = follow.follow_change(settings, "cpu", up.path, patched_sha=head, upstream_sha=pin)
        assert found.baseline is not None and [f.touched.family for f in found.families] == ["qwen2"]
        return found.baseline

    lost = follow.Certified("cpu", "f" * 40, pin, "d" * 64, (DEFAULT_MODEL,), str(up.path))
    follow.write_record(path, lost)
    assert baseline().kind == "pin"
    assert f"({'f' * 12}) is no longer in the workdir" in baseline().said
    moved = follow.Certified("cpu", head, "e" * 40, "d" * 64, (DEFAULT_MODEL,), str(up.path))
    follow.write_record(path, moved)
    assert baseline().kind == "pin" and f"was of upstream {'e' * 12}" in baseline().said
    path.write_text("{ not json", encoding="utf-8")
    assert baseline().kind == "pin" and "no earlier cpu build" in baseline().said


def test_as_is_the_work_tree_is_followed_and_a_folder_without_git_is_not(
    tree: tuple[Upstream, Settings], tmp_path: Path
) -> None:
    up, settings = tree
    pin = up.commits[0]
    (up.path / BERT).write_text(hooked(BERT), encoding="utf-8")
    following = follow.follow_change(settings, "cpu", up.path, patched_sha=pin, upstream_sha=pin, as_is=True)
    assert [f.touched.family for f in following.families] == ["bert", "jina-bert-v2"]
    bare = tmp_path / "no-git"
    bare.mkdir()
    skipped = follow.follow_change(settings, "cpu", bare, patched_sha=pin, upstream_sha=pin)
    assert skipped.baseline is None and skipped.skipped is not None and "is not a git checkout" in skipped.skipped
    lost = follow.follow_change(settings, "cpu", up.path, patched_sha=pin, upstream_sha="c" * 40)
    assert lost.skipped is not None and f"no commit of the workdir stands for upstream {'c' * 12}" in lost.skipped
    # a tree the workdir does not have: the build goes on, the ending says the change was not followed
    broken = follow.follow_change(settings, "cpu", up.path, patched_sha="b" * 40, upstream_sha=pin)
    assert broken.skipped is not None and broken.skipped.startswith(
        f"git could not compare {pin[:12]} with bbbbbbbbbbbb"
    )
    assert follow.proofs(broken, None, None)[0].verdict == "not run"
