"""Known noise in the build's echoed output, filtered with a reason.

llama.cpp's ``llama-ui-assets`` target runs ``scripts/ui-assets.cmake`` on every
build, even a no-op one. With the web UI off (skippy configures
``LLAMA_BUILD_UI=OFF`` and ``LLAMA_USE_PREBUILT_UI=OFF``: a build must not run npm
nor download assets) the script has nothing to embed and prints, every time, a
CMake warning "UI: no assets available - building without an embedded UI ...". No
CMake variable silences it (the script only stays quiet when it embeds assets),
so that one warning block is dropped from the echoed output and said once, in one
line, at ``--verbose``.  Any other warning, from this script or elsewhere, is shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

_UI_WARNING_HEAD: Final = re.compile(r"^CMake Warning at \S*ui-assets\.cmake:\d+ \(message\):\s*$")
_UI_NO_ASSETS: Final = "UI: no assets available"
#: what is said instead, once per build (at --verbose)
UI_NOTE: Final = (
    "llama.cpp's UI-assets step warned 'UI: no assets available' (the web UI is off on purpose: "
    "LLAMA_BUILD_UI=OFF, no npm, no download); hidden"
)


class NoiseFilter:
    """Passes lines on to ``show``, minus the UI-assets warning block (see the module)."""

    def __init__(self, show: Callable[[str], None], note: Callable[[str], None]) -> None:
        self.show = show
        self.note = note
        self.dropped = 0
        self._held: str | None = None
        self._dropping = False

    def __call__(self, line: str) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if _UI_NO_ASSETS in line:
                self._start_dropping()
                return
            self.show(held)
        if self._dropping:
            if not line.strip() or line.startswith((" ", "\t")):
                return
            self._dropping = False
        if _UI_WARNING_HEAD.match(line):
            self._held = line  # shown unless the next line says it is the known warning
            return
        self.show(line)

    def _start_dropping(self) -> None:
        self._dropping = True
        if self.dropped == 0:
            self.note(UI_NOTE)
        self.dropped += 1

    def close(self) -> None:
        """The output ended: a warning head still held is shown."""
        if self._held is not None:
            self.show(self._held)
            self._held = None
