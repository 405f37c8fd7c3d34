"""What combines the layers into one job a maintainer runs: a build session (prepare, build, the
artifact gate, the spot check), moving the pin, upstream's tests on the patched tree, the spot check
following a change, and ``invoke clean``.

Each flow takes its few real collaborators as one object; the command line calls it.
"""
