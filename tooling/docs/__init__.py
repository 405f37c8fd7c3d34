"""The docs generator: the reference tables of README.md and docs/, made from the code and the
bench's figures.

A generated block sits between two markers, anywhere in a Markdown file::

    <!-- NAME: made from SOURCE by `python -m tooling.docs` -->
    ...
    <!-- NAME: end -->

``NAME`` picks a renderer of :data:`tooling.docs.generate.RENDERERS` (``options``, ``settings``,
``exit-codes``, ``backends``, ``bench``, ``build-ending``, ``modules``, ``rooms``...).
``python -m tooling.docs`` rewrites every block of README.md and every ``docs/**/*.md``; ``--check``
changes nothing and names the stale blocks (exit code 1).  A unit test runs the check, so a table the
code no longer produces fails the suite.

``--record-build`` runs ``nox -s build-cpu`` twice, on the path the nox session takes (proofs made
with ``--recheck``, then kept), stores each run's ``--json`` report and ending in
``docs/figures/build-cpu.json``, then makes the blocks again: the sample endings of
docs/building.md are shown by the ending's own code (:meth:`skippy.spot.report.Ending.show`).
"""
