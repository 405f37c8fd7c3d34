"""`invoke generate` never writes through a symlink among the files it writes: the link is
replaced by a regular file (written atomically), and what it pointed to is left as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skippy.cli.entries import generate_main
from skippy.core.ui import Console
from skippy.maintain import generate
from tests.conftest import Project
from tests.integration.test_generate import write_spec
from tests.integration.test_parity_fixtures import arch_upstream
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_generate_replaces_symlinked_lane_files_and_never_writes_through(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str], dangling: bool
) -> None:
    arch_upstream(project)
    write_spec(project)
    generate.run_generate(project.settings(), console=Console(quiet=True))
    folder = project.patches / "generated"
    wanted = {name: (folder / name).read_bytes() for name in ("inputs.sha256", "series")}

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "inputs.sha256").write_text("someone else's file\n", encoding="utf-8")
    # the series a link to a copy elsewhere in the project (the queue accepts it: it lists the
    # same patches; a link out of the project is refused, never read: test_hostile_links)
    elsewhere = project.root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "series").write_bytes(wanted["series"])
    # dangling: a write through it would make the file (and open() the folder's absence fails)
    inputs_target = outside / ("nowhere.sha256" if dangling else "inputs.sha256")
    for name, target in (("inputs.sha256", inputs_target), ("series", elsewhere / "series")):
        (folder / name).unlink()
        (folder / name).symlink_to(target)
    allowed = (project.patches, project.root / ".deps")
    before = tree_state([tmp_path, Path(os.environ["HOME"])], allowed)

    code = generate_main(project.env, root=project.root, json=True)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["ok"] is True and report["patches"] == ["0001-family-llama.patch", "0002-family-gemma3.patch"]
    for name, data in wanted.items():
        path = folder / name
        assert not path.is_symlink() and path.is_file(), name
        assert path.read_bytes() == data, name
        assert path.stat().st_mode & 0o777 == 0o644, "the umask's mode, not mkstemp's 0600"
        assert (
            f"queue/patches/generated/{name} was a symlink: replaced by a regular file "
            "(what it pointed to is left as it was)" in captured.err
        )
    assert (outside / "inputs.sha256").read_text(encoding="utf-8") == "someone else's file\n"
    assert (elsewhere / "series").read_bytes() == wanted["series"]
    assert not (outside / "nowhere.sha256").exists()
    assert written_outside(before, tree_state([tmp_path, Path(os.environ["HOME"])], allowed)) == []
    # no temporary file is left beside them, and the lane now passes its check
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["families.toml", "inputs.sha256", "series", "0001-family-llama.patch", "0002-family-gemma3.patch"]
    )
    assert generate.run_generate(project.settings(), console=Console(quiet=True), check=True)[1].ok
