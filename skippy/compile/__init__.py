"""Building llama.cpp: the backends (one module each), the toolchain probes, a build plan made
without running anything, running it (configure, build, report), the compiler cache and the
compile cluster, and the root file systems a build may run inside.

It never touches the queue (an import-linter contract); its own layers are a contract too.
"""
