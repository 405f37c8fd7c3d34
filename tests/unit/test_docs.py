"""The README and the reference site cannot drift from the code: every generated block is what its
renderer makes now, every module, object and file the pages name exists, and the README keeps the
commands it promises (the one `.ci/run` runs among them)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import MappingProxyType

import pytest

from skippy.compile.backends import ENTRY_POINT_GROUP, registry
from skippy.compile.backends.base import BackendSpec, InstallHint
from skippy.core.specs import SPOT_CHECK, Spec
from tooling.docs.bench import BENCH_JSON, render_bench
from tooling.docs.blocks import DocsError, block_names, doc_files
from tooling.docs.generate import RENDERERS, main, stale
from tooling.docs.reference import render_backends, render_settings
from tooling.typed_json import ShapeError

ROOT = Path(__file__).resolve().parents[2]
PAGES = doc_files(ROOT)


def test_no_generated_block_is_stale() -> None:
    assert stale(ROOT) == [], "stale: run `python -m tooling.docs`"


def test_every_kind_of_block_is_used_somewhere() -> None:
    used = {name for page in PAGES for name in block_names(page.read_text(encoding="utf-8"))}
    assert used == set(RENDERERS)


def _project(tmp_path: Path, page: str) -> Path:
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# a project\n", encoding="utf-8")
    (tmp_path / "docs" / "page.md").write_text(page, encoding="utf-8")
    (tmp_path / BENCH_JSON).write_text((ROOT / BENCH_JSON).read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def test_a_stale_block_is_named_then_made_again(tmp_path: Path) -> None:
    options = RENDERERS["options"]
    root = _project(tmp_path, f"# Options\n\n{options.begin}\n| an old table |\n{options.end}\n\nAfter.\n")
    assert stale(root) == ["docs/page.md: options"]
    assert main(["--check"], root) == 1
    assert main([], root) == 0
    text = (root / "docs" / "page.md").read_text(encoding="utf-8")
    assert "| an old table |" not in text
    assert "| `--newest-compatible` |" in text
    assert text.startswith("# Options\n\n") and text.endswith(f"{options.end}\n\nAfter.\n")
    assert stale(root) == []


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("<!-- nope: made from x by `python -m tooling.docs` -->\n<!-- nope: end -->\n", "unknown generated block"),
        ("<!-- options: made from x by `python -m tooling.docs` -->\n| no end |\n", "has no end marker"),
    ],
)
def test_a_block_that_cannot_be_made_is_refused_and_nothing_is_written(
    tmp_path: Path, page: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _project(tmp_path, page)
    options = RENDERERS["options"]
    stale_readme = f"{options.begin}\n| old |\n{options.end}\n"
    (root / "README.md").write_text(stale_readme, encoding="utf-8")
    with pytest.raises(DocsError, match=message):
        stale(root)
    assert main([], root) == 2
    assert "docs/page.md" in capsys.readouterr().err
    # the README comes first and could be made, but nothing is written when one block cannot be
    assert (root / "README.md").read_text(encoding="utf-8") == stale_readme


def test_the_backends_table_follows_the_registry_it_is_given() -> None:
    fake = BackendSpec(
        name="fake",
        title="A fake accelerator (tests)",
        switch="GGML_FAKE",
        install=InstallHint(debian="apt-get install fake-sdk", arch=None, macos=None),
        gpu=True,
        spot_check_args=("-ngl", "99"),
        device_prefix="Fake",
        artifact_markers=("ggml_backend_fake_reg",),
        table_defines=MappingProxyType({"fake_targets": "FAKE_TARGETS"}),
    )
    table = render_backends({**registry(), "fake": fake})
    row = next(line for line in table.splitlines() if line.startswith("| `build-fake` |"))
    # a backend names its own switch, not the others' (only Metal's, which the tree turns on on macOS)
    assert "`GGML_FAKE=ON`" in row and "GGML_CUDA" not in row and "`GGML_METAL=OFF` on macOS" in row
    assert "`fake_targets`" in row and "`Fake0`" in row and "`ggml_backend_fake_reg`" in row
    cpu = next(line for line in table.splitlines() if line.startswith("| `build-cpu` |"))
    assert "GGML_FAKE" not in cpu
    assert cpu == next(line for line in render_backends(registry()).splitlines() if line.startswith(cpu[:14]))
    assert "| fake | apt-get install fake-sdk | not available | not available |" in table
    assert "`build-fake`" not in render_backends(registry())


def test_the_settings_table_gives_type_default_and_variable() -> None:
    text = render_settings(ROOT)
    row = next(line for line in text.splitlines() if line.startswith("| `device_logprob_tolerance` |"))
    assert row == (
        "| `device_logprob_tolerance` | a finite number from 0 to 10 | `0.3` |  | the same on a GPU backend's device |"
    )
    assert "| `jobs` | a whole number from 1 to 1024 | (none) | `SKIPPY_BUILD_JOBS` |" in text
    extra = Spec("colour", "str", "auto", "the colour", env="SKIPPY_COLOUR", choices=("auto", "red"))
    mine = render_settings(ROOT, {"[tool.skippy.spot_check]": (*SPOT_CHECK, extra)})
    assert mine.splitlines()[-1] == '| `colour` | one of auto, red | `"auto"` | `SKIPPY_COLOUR` | the colour |'


def test_the_bench_table_says_what_was_met_and_what_was_missed() -> None:
    report = json.loads((ROOT / BENCH_JSON).read_text(encoding="utf-8"))
    report["spot_check"] = {**report["spot_check"], "median_s": 16.2, "met": False}
    del report["cuda"]
    table = render_bench(report)
    row = next(line for line in table.splitlines() if line.startswith("| whole spot check"))
    assert "| 16.2 s; a raw llama-server start + one chat: 2.9 s | at most 15.0 s | **missed** |" in row
    assert "build-cuda" not in table
    assert "build-rocm" in table
    assert render_bench({"machine": {"cpus": 4}}).endswith("Machine: 4 CPUs.")
    later = render_bench({"machine": {"cpus": 4}, "later_section": {"x_s": 40.0}})
    assert later.endswith("Sections in the JSON this table does not show yet: later_section.")


def test_a_renamed_key_of_the_bench_report_is_named_by_its_path() -> None:
    report = json.loads((ROOT / BENCH_JSON).read_text(encoding="utf-8"))
    cold = dict(report["builds"]["cold_build"])
    cold["raw_seconds"] = cold.pop("raw_s")
    report["builds"] = {**report["builds"], "cold_build": cold}
    with pytest.raises(ShapeError, match=r"^builds\.cold_build\.raw_s: missing$"):
        render_bench(report)
    cold["raw_s"] = "552.7"
    with pytest.raises(ShapeError, match=r"^builds\.cold_build\.raw_s: expected float, found '552\.7'$"):
        render_bench(report)


def test_a_bench_report_the_table_cannot_read_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = RENDERERS["bench"]
    root = _project(tmp_path, f"{bench.begin}\n| old |\n{bench.end}\n")
    report = json.loads((root / BENCH_JSON).read_text(encoding="utf-8"))
    del report["prepare"]["queue"]
    (root / BENCH_JSON).write_text(json.dumps(report), encoding="utf-8")
    assert main([], root) == 2
    assert f"{BENCH_JSON}: does not hold the figures (prepare.queue: missing)" in capsys.readouterr().err
    assert "| old |" in (root / "docs" / "page.md").read_text(encoding="utf-8")


def test_the_bench_table_shows_upstream_tests_figures() -> None:
    section = {
        "cold_no_cache": {"wall_s": 700.0, "build_s": 650.5},
        "fresh_dir_from_cache": {"wall_s": 200.0, "build_s": 90.0, "hits": 400, "misses": 2},
        "ctest": {"wall_s": 115.0, "counts": {"passed": 46}},
        "attribution": {"wall_s": 500.0, "baseline_s": 300.0, "attribution_s": 80.0, "probes": 3, "blamed": {}},
    }
    table = render_bench({"machine": {"cpus": 2}, "upstream_tests": section})
    row = next(line for line in table.splitlines() if line.startswith("| upstream's tests"))
    assert "650.5 s / 90.0 s (400 hits, 2 misses); 115.0 s; 300.0 s + 80.0 s (3 probes)" in row
    assert "does not show" not in table


def test_the_bench_table_shows_the_dist_figures() -> None:
    counts = {"remote": 300, "local": 3, "failed_over": 2}
    side = {
        "servers": 2,
        "cores": 2,
        "local": {"build_s": 500.0, "compiles": 305},
        "dist": {"build_s": 510.5, "counts": counts, "overhead_per_compile_s": 0.066},
        "estimate_build_s": {"8": 66.0, "1": 510.0},
    }
    cuda = {
        "sample": 20,
        "objects": 186,
        "local": {"build_s": 200.0, "compiles": 20},
        "dist": {"build_s": 230.0, "counts": {"remote": 80, "local": 0, "failed_over": 0}},
        "overhead_per_compile_s": 1.5,
        "estimate_objects_s": {"2": 900.0, "1": 1800.0},
    }
    section = {**side, "compile_steps": {"cpu": 305, "cuda": 491, "vulkan": None}, "cuda": cuda}
    table = render_bench({"machine": {"cpus": 2}, "dist": section})
    cpu = next(line for line in table.splitlines() if line.startswith("| the CPU build"))
    assert "| 500.0 s / 510.5 s: 300 ran remotely, 3 locally, 2 failed over; overhead 0.066 core-s" in cpu
    assert cpu.endswith("estimate (an upper bound) 1: 510.0 s / 8: 66.0 s | - | - |")
    sample = next(line for line in table.splitlines() if line.startswith("| a sample of CUDA's objects"))
    assert "(20 of 186, every k-th by name)" in sample
    assert "| 200.0 s / 230.0 s: 80 ran remotely, 0 locally, 0 failed over; overhead 1.5 core-s per object" in sample
    assert sample.endswith("estimate (an upper bound) 1: 1800.0 s / 2: 900.0 s | - | - |")
    assert "| cpu 305, cuda 491 |" in table
    assert "does not show" not in table


# --- what the pages name exists ------------------------------------------------------------------

#: a dotted name of the package in backticks: `skippy.cli.build.parse_session_args`
_DOTTED = re.compile(r"`(skippy(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
#: a file of the project in backticks or a link: `tests/e2e/test_own_queue.py`, `skippy/core/specs.py`
_FILE = re.compile(
    r"[`(]((?:skippy|benchmarks|scripts|docs|\.ci|\.github|tests/(?:unit|integration|e2e))/[\w./-]+)[`)#]"
)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_and_file_a_page_cites_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    names = sorted(set(_DOTTED.findall(text)) - {ENTRY_POINT_GROUP})
    assert [n for n in names if not _resolves(n)] == []
    files = {f.rstrip(".") for f in _FILE.findall(text) if "*" not in f and "<" not in f}
    base = page.parent if page.parent.name == "docs" else ROOT
    missing = [f for f in sorted(files) if not (ROOT / f).exists() and not (base / f).exists()]
    assert missing == []


# --- the README ---------------------------------------------------------------------------------

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _code_blocks(text: str, heading: str) -> list[str]:
    """The fenced blocks of the section under ``heading`` (up to the next heading of its level or above)."""
    level = heading.split(" ", maxsplit=1)[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1 :]
    stop = re.search(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)
    section = rest[: stop.start()] if stop else rest
    return re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


def test_the_readme_is_a_short_guide() -> None:
    assert len(README.splitlines()) < 300


def test_the_readme_gives_the_command_ci_runs_and_the_main_job() -> None:
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci_run == "nox -s lint tests"
    assert [ci_run] in [block.strip().splitlines() for block in _code_blocks(README, "## The tests")]
    assert ["nox -s build-cpu"] in [block.strip().splitlines() for block in _code_blocks(README, "## The main job")]


def test_the_maintainers_week_in_the_readme_is_the_reference_page_s() -> None:
    queue = (ROOT / "docs" / "queue.md").read_text(encoding="utf-8")
    week = _code_blocks(README, "### Changing the queue") + _code_blocks(README, "### A conflict, rehearsed offline")
    assert len(week) == 2
    assert week == _code_blocks(queue, "## Changing the queue")


def test_every_link_of_the_readme_into_docs_exists() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert links, "the README points to the reference"
    assert [link for link in links if not (ROOT / link).is_file()] == []
    listed = {line.split(": ")[-1].strip() for line in (ROOT / "mkdocs.yml").read_text().splitlines() if ".md" in line}
    assert {Path(link).name for link in links} <= listed
