"""Invoke tasks: a menu made from the option table (skippy/cli/options.py).

Each task parses its options and makes one call into skippy; ``invoke --help TASK``
lists them.
"""

from __future__ import annotations

from pathlib import Path

from skippy.cli.invoke_tasks import collection

ns = collection(Path(__file__).resolve().parent)
