"""SIGTERM while mmdebstrap makes the ROCm Debian root is handled as Ctrl-C is: mmdebstrap is
stopped, what it left mounted in the half-made root is unmounted, the root removed, and the
message says so.  Real signals to a real process running the build entry point; the stand-in
mmdebstrap mounts a real tmpfs inside the root it makes (root only: skipped without it, failed
on CI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skippy.compile.backends.rocm_rootfs import parse_rootfs_pin, rootfs_home
from skippy.compile.rootfs import mounts_under
from skippy.core.errors import Interrupted, TerminatedError
from tests.busy import default_interrupts
from tests.e2e.needs import cannot_run
from tests.integration.test_build_toolchain import Host
from tests.integration.test_rocm_root import _FAKE_APT, _FAKE_CHROOT, PACKAGES, _script
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration

# a stand-in mmdebstrap: mounts a tmpfs where the real one mounts /proc in the root it makes, says
# so, and works on (sleeps) until it is stopped; it never unmounts: whoever stops it must
_MOUNTING_MMDEBSTRAP = """#!/bin/sh
prev=""; target=""
for a in "$@"; do target="$prev"; prev="$a"; done
mkdir -p "$target/proc" "$target/usr/bin"
mount -t tmpfs -o size=1m skippy-test "$target/proc" || exit 90
echo "$target/proc" > "$MMDEBSTRAP_READY"
sleep 600
"""

BUILD = (
    "import os, sys\nfrom pathlib import Path\nfrom skippy.cli.entries import build_main\n"
    "sys.exit(build_main('rocm', dict(os.environ), root=Path(sys.argv[1]), args=['--json'])[0])\n"
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_during_mmdebstrap_unmounts_and_removes_the_half_made_root(tmp_path: Path, sig: int) -> None:
    if os.geteuid() != 0:
        cannot_run("mounting a tmpfs needs root")
    host = Host(tmp_path / "host")
    for name in ("cmake", "ninja", "cc", "c++", "sccache"):
        host.tool(name)
    for name, text in (("mmdebstrap", _MOUNTING_MMDEBSTRAP), ("chroot", _FAKE_CHROOT), ("apt-get", _FAKE_APT)):
        _script(host.bin, name, text)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "0"\n\n[tool.skippy]\ncache_dir = "cache"\n\n'
        f'[tool.skippy.build.rocm_debian_root]\nsuite = "sid"\npackages = {json.dumps(PACKAGES)}\n',
        encoding="utf-8",
    )
    cache = project / "cache"
    ready = tmp_path / "mmdebstrap.ready"
    env = {
        "PATH": f"{host.bin}:/usr/bin:/bin",
        "HOME": os.environ["HOME"],
        "ROOT_LOG": str(host.root / "root.log"),
        "MMDEBSTRAP_READY": str(ready),
        "SKIPPY_ROCM_TOOLKIT": "debian-root",
    }
    before = tree_state([tmp_path], [cache, ready, host.root / "root.log"])
    child = subprocess.Popen(
        [sys.executable, "-c", BUILD, str(project)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT must raise KeyboardInterrupt whatever this process inherited
        preexec_fn=default_interrupts,  # noqa: PLW1509 - sets one signal disposition, nothing that can deadlock
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), child.communicate(timeout=30)
        mount = Path(ready.read_text(encoding="utf-8").strip())
        assert mounts_under(cache) == [mount], "the stand-in mounted inside the root being made"
        child.send_signal(sig)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for left in mounts_under(tmp_path):
            subprocess.run(["umount", "--lazy", str(left)], check=False)
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C (SIGINT)"
    error = TerminatedError if sig == signal.SIGTERM else Interrupted
    assert child.returncode == error.exit_code == 128 + sig, err
    report = json.loads(out)
    partial = mount.parent.parent
    assert report["ok"] is False and report["error"] == error.__name__ and report["exit_code"] == error.exit_code
    assert report["what"] == (
        f"{name} while mmdebstrap made the ROCm Debian root: mmdebstrap was stopped, "
        f"unmounted 1 mount(s) it left ({mount}), removed the half-made root {partial}"
    )
    assert report["untouched"] == "the system and the finished roots in the cache; nothing half-made is left"
    assert report["next"] == "run the build again (nox -s build-rocm)"
    assert f"error: {report['what']}" in err and "Traceback" not in err
    assert mounts_under(tmp_path) == []
    assert not partial.exists()
    home = rootfs_home(cache, parse_rootfs_pin({"suite": "sid", "packages": PACKAGES}))
    assert partial.name.startswith(home.name + ".partial-") and partial.parent == home.parent
    assert not home.exists() and [p.name for p in home.parent.iterdir() if ".partial-" in p.name] == []
    assert written_outside(before, tree_state([tmp_path], [cache, ready, host.root / "root.log"])) == []
