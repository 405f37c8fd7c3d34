"""The parse bench section on toy trees: the old scanner read from git history, the files read at
the pin, both sides' agreement, the figures' row."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from benchmarks import bench_parse as bp
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppscan
from tests.gitfixtures import git, hermetic_git_env
from tooling.docs.bench import render_bench

MODEL_CPP = """\
llama_rope_type llama_model_rope_type(const llama_model * model) {
    switch (model->arch) {
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_MPT: return LLAMA_ROPE_TYPE_NORM;
        default: return LLAMA_ROPE_TYPE_NONE;
    }
}
"""
ARCH_CPP = 'static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n    { LLM_ARCH_LLAMA, "llama" },\n};\n'

#: an "old scanner" as the project's history holds it: cppscan, but blind to LLM_ARCH_MPT
OLD_SCANNER = """\
from __future__ import annotations

from dataclasses import dataclass, replace

from skippy.maintain import cppscan

VERSION = {version}


@dataclass(frozen=True)
class Marker:
    version: int


def scan(path: str, text: str) -> cppscan.FileScan:
    found = cppscan.scan(path, text)
    switches = tuple(replace(s, cases=tuple(c for c in s.cases if c != "LLM_ARCH_MPT")) for s in found.switches)
    return replace(found, switches=switches)
"""


def commit_files(repo: Path, files: dict[str, str | None], message: str, env: dict[str, str]) -> str:
    """Write (or with None, delete) ``files`` in ``repo`` and commit them; the new commit."""
    for path, text in files.items():
        target = repo / path
        if text is None:
            git(repo, "rm", "--quiet", "--", path, env=env)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        git(repo, "add", "--", path, env=env)
    git(repo, "commit", "--quiet", "-m", message, env=env)
    return git(repo, "rev-parse", "HEAD", env=env).strip()


def new_repo(path: Path, env: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "--quiet", "-b", "main", env=env)
    return path


def test_the_old_scanner_comes_from_the_commit_before_its_deletion(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    repo = new_repo(tmp_path / "project", env)
    commit_files(repo, {bp.OLD_SCANNER: OLD_SCANNER.format(version=1)}, "old scanner", env)
    second = commit_files(repo, {bp.OLD_SCANNER: OLD_SCANNER.format(version=2)}, "old scanner, again", env)
    commit_files(repo, {bp.OLD_SCANNER: None}, "old scanner gone", env)
    module, source = bp.load_old_scanner(Repo(repo, env))
    assert module is not None, source
    assert (module.VERSION, source) == (2, f"{bp.OLD_SCANNER} at {second}")
    assert "benchmarks._old_cscan" not in sys.modules


def test_the_old_scanner_still_in_the_tree_is_read_from_the_last_commit(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    repo = new_repo(tmp_path / "project", env)
    commit_files(repo, {bp.OLD_SCANNER: OLD_SCANNER.format(version=1)}, "old scanner", env)
    last = commit_files(repo, {"README": "x\n"}, "unrelated", env)
    module, source = bp.load_old_scanner(Repo(repo, env))
    assert module is not None and module.VERSION == 1
    assert source.endswith(git(repo, "rev-parse", f"{last}^", env=env).strip())


def test_without_the_old_scanner_the_reason_is_given(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    repo = new_repo(tmp_path / "project", env)
    commit_files(repo, {"README": "x\n"}, "first", env)
    assert bp.load_old_scanner(Repo(repo, env)) == (None, f"{bp.OLD_SCANNER} is in no commit of the project's history")
    plain = tmp_path / "plain"
    plain.mkdir()
    module, why = bp.load_old_scanner(Repo(plain, env))
    assert module is None and why.startswith(f"no git history to read {bp.OLD_SCANNER} from")
    commit_files(repo, {bp.OLD_SCANNER: "def scan(:\n"}, "broken", env)
    module, why = bp.load_old_scanner(Repo(repo, env))
    assert module is None and "does not load: SyntaxError" in why


def toy_workdir(root: Path, env: dict[str, str]) -> tuple[Path, str]:
    repo = new_repo(root, env)
    files: dict[str, str | None] = {
        "src/llama-model.cpp": MODEL_CPP,
        "src/llama-arch.cpp": ARCH_CPP,
        "src/models/broken.cpp": "int f( {\n",
        "src/llama.h": "#pragma once\n",
        "ggml/src/ggml.c": "int g(void) { return 0; }\n",
        "ggml/src/ggml-cuda/k.cu": "__global__ void k() {}\n",
        "ggml/src/notes.txt": "not C\n",
        "tools/main.cpp": "int main() { return 0; }\n",
    }
    return repo, commit_files(repo, files, "tree", env)


def test_the_files_read_at_the_pin(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    repo, pin = toy_workdir(tmp_path / "work", env)
    commit_files(repo, {"src/later.cpp": "int later;\n"}, "after the pin", env)
    files = bp.cxx_files(Repo(repo, env), pin)
    assert sorted(files) == [
        "ggml/src/ggml-cuda/k.cu",
        "ggml/src/ggml.c",
        "src/llama-arch.cpp",
        "src/llama-model.cpp",
        "src/llama.h",
        "src/models/broken.cpp",
    ]


def test_agreement_names_each_file_where_the_counts_differ(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    repo = new_repo(tmp_path / "project", env)
    commit_files(repo, {bp.OLD_SCANNER: OLD_SCANNER.format(version=1)}, "old scanner", env)
    old, _source = bp.load_old_scanner(Repo(repo, env))
    assert old is not None
    files = {"src/llama-model.cpp": MODEL_CPP, "src/llama-arch.cpp": ARCH_CPP, "src/llama.h": MODEL_CPP}
    new_scans = {p: cppscan.scan(p, t) for p, t in files.items()}
    same = bp.agreement(new_scans, new_scans)
    assert (same["agree"], same["default_files"], same["disagreeing"]) == (True, 2, [])
    assert same["cppscan"] == {"switches": 1, "cases": 2, "tables": 1, "entries": 1}
    differ = bp.agreement(new_scans, {p: old.scan(p, t) for p, t in files.items()})
    assert not differ["agree"]
    assert differ["disagreeing"] == [
        {
            "file": "src/llama-model.cpp",
            "cppscan": {"switch llama_model_rope_type": {"LLM_ARCH_LLAMA": 1, "LLM_ARCH_MPT": 1}},
            "old": {"switch llama_model_rope_type": {"LLM_ARCH_LLAMA": 1}},
        }
    ]
    assert differ["old"]["cases"] == 1  # the header holds a switch too, but is no default file
    times = bp.timings(files, {"cppscan": cppscan.scan, "old": old.scan}, rounds=2)
    assert [len(t.samples) for t in times.values()] == [2, 2]


def toy_project(tmp_path: Path, env: dict[str, str], *, with_old: bool) -> Settings:
    root = new_repo(tmp_path / "project", env)
    _work, pin = toy_workdir(root / ".deps" / "llama.cpp", env)
    project: dict[str, str | None] = {
        "pyproject.toml": '[project]\nname = "p"\n\n[tool.skippy]\npin_file = "upstream.txt"\n',
        "upstream.txt": pin + "\n",
    }
    if with_old:
        project[bp.OLD_SCANNER] = OLD_SCANNER.format(version=1)
    commit_files(root, project, "project", env)
    if with_old:
        commit_files(root, {bp.OLD_SCANNER: None}, "old scanner gone", env)
    return Settings.load(root, env)


def test_the_section_on_a_toy_project(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    settings = toy_project(tmp_path, env, with_old=True)
    out = io.StringIO()
    section = bp.bench_parse(settings, Console(stream=out), rounds=1)
    assert (section["files"], section["rounds"]) == (6, 1)
    ts = section["tree_sitter"]
    # the broken file, and the CUDA kernel (`__global__` is no C++ tree-sitter knows)
    assert (ts["files_parsed"], ts["files_with_errors"], ts["default_files_with_errors"]) == (
        2,
        2,
        ["src/models/broken.cpp"],
    )
    assert ts["files_with_errors_by_folder"] == {"src/": 1, "ggml/src/": 1}
    assert ts["arch_files_with_errors"] == []
    assert section["old"]["source"].startswith(bp.OLD_SCANNER + " at ")
    assert [d["file"] for d in section["agreement"]["disagreeing"]] == ["src/llama-model.cpp"]
    assert "DIFFERENT counts in src/llama-model.cpp" in out.getvalue()
    row = render_bench({"machine": {"cpus": 2}, "parse": section})
    assert "the parity audit's C++ reading of the pin's 6 C/C++ files" in row
    assert "different counts in src/llama-model.cpp | the same counts as the old scanner | **missed** |" in row
    assert "does not show yet" not in row


def test_the_section_without_the_old_scanner(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    settings = toy_project(tmp_path, env, with_old=False)
    section = bp.bench_parse(settings, Console(stream=io.StringIO()), rounds=1)
    assert section["old"] == {"skipped": f"{bp.OLD_SCANNER} is in no commit of the project's history"}
    assert section["agreement"] == section["old"]
    assert "old scanner: " + section["old"]["skipped"] in bp.summary(section)
    row = render_bench({"machine": {"cpus": 2}, "parse": section})
    assert "the parity audit's C++ reading (`--only parse`)" in row


def test_the_section_is_skipped_without_a_workdir(tmp_path: Path) -> None:
    env = hermetic_git_env(tmp_path / "home")
    root = new_repo(tmp_path / "project", env)
    (root / "pyproject.toml").write_text('[project]\nname = "p"\n', encoding="utf-8")
    section = bp.bench_parse(Settings.load(root, env), Console(stream=io.StringIO()))
    assert section["skipped"].endswith("run `invoke prepare --pinned` first")
    assert render_bench({"machine": {"cpus": 2}, "parse": section}).count("\n| ") == 1  # the header only
