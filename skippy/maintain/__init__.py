"""Queue maintenance: regenerating the patches from their commits, the
generated lane (graph hooks placed by a C++ parser), the parity audit, range-diffs and pin-move
summaries, ``invoke check``'s audit, and the patches upstream already carries.

It reads and rewrites the queue and never builds (an import-linter contract).
"""
