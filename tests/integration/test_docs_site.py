"""The reference site builds strictly (MkDocs, as `nox -s docs` builds it): a broken link between
pages, a link to a heading that does not exist or a page left out of the navigation fails it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="building/"' in index or 'href="building/index.html"' in index
    settings = (tmp_path / "site" / "settings" / "index.html").read_text(encoding="utf-8")
    assert "device_logprob_tolerance" in settings


@pytest.mark.parametrize(
    ("link", "complaint"),
    [
        ("[gone](no-such-page.md)", "no-such-page.md"),
        ("[gone](building.md#no-such-heading)", "no-such-heading"),
    ],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, link: str, complaint: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    with (project / "docs" / "index.md").open("a", encoding="utf-8") as page:
        page.write(f"\n{link}\n")
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    assert complaint in result.stderr


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    (project / "docs" / "orphan.md").write_text("# An orphan page\n", encoding="utf-8")
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    assert "orphan.md" in result.stderr
