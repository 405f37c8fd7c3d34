"""Upstream's own tests on the patched tree, each failure traced to the patch that caused it.

1. Upstream's tests build in the binaries' own build dir (llama.cpp configures them there:
   ``LLAMA_BUILD_TESTS`` is on for a top-level build), so asking for them configures nothing
   again and generates nothing twice (a Vulkan build's shaders); only a build dir that has
   them off gets a dir of its own with ``LLAMA_BUILD_TESTS=ON``. CTest runs what
   llama.cpp's CI runs (``-L main``) plus every test the queue's own patches add.
2. Only when something fails, the same tests run on the pin (the *baseline*, kept per
   upstream commit under the cache dir, so a pin is tested once), with the queue's build-only
   patches on it where they apply (:class:`.baseline._Baseline`): a test that fails on the bare pin too
   is *red upstream*; one that fails only with the queue is the queue's.
3. For each test the queue breaks, a bisection over the prepared commits (each carries
   its ``Skippy-Patch`` trailer) names the first patch whose application makes it fail:
   one tree beside the workdir (a ``git clone --shared``: no object is copied) is moved
   from commit to commit and built incrementally. It stops at a time budget and says so.

The workdir itself is never checked out, built in or changed.

The room: :mod:`.run` (the two entry points, CTest's run and a GPU backend's ops), :mod:`.tree`
(what one build of one tree needs: the subject, its plan, CTest in its build dir),
:mod:`.ctest` and :mod:`.backend_ops` (reading upstream's programs), :mod:`.baseline` (the
pin's results, cached), :mod:`.aside` (the tree beside the workdir and the queue's commits),
:mod:`.bisect` (the first failing patch), :mod:`.verdicts` (baseline and blame, judged) and
:mod:`.report` (what a maintainer reads).
"""
