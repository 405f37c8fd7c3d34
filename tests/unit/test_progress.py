"""Progress of long steps (skippy.core.ui.Progress) and pip's output read as progress
(skippy.core.pip.PipOutput), against fake streams and a fake clock."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from skippy.core import pip
from skippy.core.ui import Console, Progress, tree_size


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_gets_one_line_redrawn_with_size_share_and_rate() -> None:
    stream, clock = FakeTty(), Clock()
    progress = Progress(Console(stream=stream), "a.tgz", 4 << 20, clock=clock)
    clock.now += 1.0
    progress.advance(1 << 20)
    clock.now += 0.1  # sooner than the redraw interval: not drawn
    progress.advance(1 << 20)
    clock.now += 1.0
    progress.advance(1 << 20)
    clock.now += 1.0
    progress.finish()
    text = stream.getvalue()
    assert text.startswith("\ra.tgz: 1.0 MiB / 4.0 MiB (25%), 1.0 MiB/s\x1b[K")
    assert "2.0 MiB / 4.0 MiB" not in text
    assert "\ra.tgz: 3.0 MiB / 4.0 MiB (75%), 1.4 MiB/s\x1b[K" in text
    # the closing line replaces the live one and stays
    assert text.endswith("\r\x1b[Ka.tgz: 3.0 MiB / 4.0 MiB in 3.1 s (991.0 KiB/s)\n")
    assert text.count("\n") == 1


def test_a_log_gets_one_line_when_the_step_starts_and_one_when_it_ends() -> None:
    stream, clock = io.StringIO(), Clock()
    with Progress(Console(stream=stream), "a.tgz", 1024, clock=clock) as progress:
        for _ in range(8):
            clock.now += 0.5
            progress.advance(128)
    assert stream.getvalue().splitlines() == ["fetching a.tgz (1.0 KiB)", "a.tgz: 1.0 KiB / 1.0 KiB in 4.0 s (256 B/s)"]


@pytest.mark.parametrize("env", [{"CI": "true"}, {"GITHUB_ACTIONS": "true"}])
def test_ci_is_a_log_even_on_a_terminal(env: dict[str, str]) -> None:
    stream = FakeTty()
    with Progress(Console(env=env, stream=stream), "x", None, verb="unpacking") as progress:
        progress.advance(10)
    assert "\r" not in stream.getvalue()
    assert stream.getvalue().splitlines()[0] == "unpacking x"


def test_quiet_prints_nothing() -> None:
    stream = FakeTty()
    with Console(stream=stream, quiet=True).progress("x", 10) as progress:
        progress.advance(10)
    assert stream.getvalue() == ""


def test_a_line_printed_meanwhile_wipes_the_live_line_first() -> None:
    stream, clock = FakeTty(), Clock()
    console = Console(stream=stream)
    progress = Progress(console, "x", 100, clock=clock)
    clock.now += 1.0
    progress.advance(10)
    console.info("hello")
    clock.now += 0.01  # drawn again at once after a wipe, whatever the interval
    progress.advance(10)
    assert (
        stream.getvalue() == "\rx: 10 B / 100 B (10%), 10 B/s\x1b[K\r\x1b[Khello\n\rx: 20 B / 100 B (20%), 20 B/s\x1b[K"
    )


def test_a_failed_step_leaves_no_live_line_and_no_closing_line() -> None:
    stream = FakeTty()
    console = Console(stream=stream)
    with pytest.raises(OSError), console.progress("x", 100) as progress:
        progress.advance(10)
        raise OSError("disk full")
    assert stream.getvalue().endswith("\r\x1b[K")
    progress.advance(10)  # after the end: nothing more is drawn
    console.info("error")
    assert stream.getvalue().endswith("\r\x1b[Kerror\n")


def test_watching_sets_what_the_measure_reads() -> None:
    stream = io.StringIO()
    seen = threading.Event()
    sizes = iter([5, 50, 500])

    def measure() -> int:
        value = next(sizes, 500)
        if value == 500:
            seen.set()
        return value

    with Progress(Console(stream=stream), "x", 500) as progress, progress.watching(measure, every=0.01):
        assert seen.wait(5)
    assert progress.done_bytes == 500
    assert stream.getvalue().splitlines()[-1].startswith("x: 500 B / 500 B in ")


def test_tree_size_counts_regular_files_only(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 5)
    (tmp_path / "link").symlink_to(tmp_path / "b")
    assert tree_size(tmp_path) == 15
    assert tree_size(tmp_path / "b") == 5
    assert tree_size(tmp_path / "missing") == 0


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  Downloading llama_cpp_python-0.3.35.tar.gz (74.9 MB)", ("llama_cpp_python-0.3.35.tar.gz", 74_900_000)),
        ("  Downloading https://example.org/a/b%2Bc-1.whl (27 kB)", ("b+c-1.whl", 27_000)),
        ("Downloading x-1.tar.gz (812 bytes)", ("x-1.tar.gz", 812)),
        ("Downloading x-1.tar.gz", ("x-1.tar.gz", None)),
        ("  Using cached x-1.tar.gz (74.9 MB)", None),
        ("Collecting x==1", None),
    ],
)
def test_pip_download_lines(line: str, expected: tuple[str, int | None] | None) -> None:
    assert pip.parse_download(line) == expected


def test_pip_output_shows_each_download_growing_in_pips_tmpdir(tmp_path: Path) -> None:
    """The file pip is downloading (under its TMPDIR's pip-unpack-*) is what the progress reads;
    the bar pip prints itself is dropped, its other lines are details."""
    stream = io.StringIO()
    console = Console(stream=stream, verbose=True)
    unpack = tmp_path / "pip-unpack-abc"
    unpack.mkdir()
    (unpack / "a-1.whl").write_bytes(b"x" * 1500)
    with pip.pip_output(console, tmp_path) as output:
        output("Collecting a==1")
        output("  Downloading a-1.whl (3.0 kB)")
        assert pip.downloaded_bytes(tmp_path, "a-1.whl") == 1500
        output("     \u2501\u2501\u2501\u2501\u2501\u2501 3.0/3.0 kB 1.0 MB/s eta 0:00:00")
        output("  Downloading b-2.whl (2.0 MB)")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "  Collecting a==1"
    assert lines[1] == "fetching a-1.whl (2.9 KiB)"
    # pip went on to the next file: this one is complete
    assert lines[2].startswith("a-1.whl: 2.9 KiB / 2.9 KiB in ")
    assert lines[3] == "fetching b-2.whl (1.9 MiB)"
    assert lines[4].startswith("b-2.whl: 1.9 MiB / 1.9 MiB in ")
    assert not any("\u2501" in line for line in lines)
    assert output.downloads == [("a-1.whl", 3000), ("b-2.whl", 2_000_000)]


def test_pip_output_failing_run_leaves_its_download_unfinished(tmp_path: Path) -> None:
    stream = io.StringIO()
    with pytest.raises(RuntimeError), pip.pip_output(Console(stream=stream), tmp_path) as output:
        output("  Downloading a-1.whl (3.0 kB)")
        raise RuntimeError("pip failed")
    assert stream.getvalue().splitlines() == ["fetching a-1.whl (2.9 KiB)"]


def test_pip_env_points_tmpdir_at_the_folder_given(tmp_path: Path) -> None:
    assert pip.pip_env({"PATH": "/bin", "TMPDIR": "/tmp"}, tmp_path) == {"PATH": "/bin", "TMPDIR": str(tmp_path)}
