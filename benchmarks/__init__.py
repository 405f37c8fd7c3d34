"""``nox -s bench``: skippy's speed targets, each measured beside the raw tools in the same run,
written to ``.bench/bench.json`` (the committed copy is docs/figures/bench.json).

Outside the shipped package: it imports the product, which never imports it.
"""
