"""Sources that embed files no compiler cache sees: found in the tree, sent around the cache by
the launcher script (run here by a real ``sh``), planned for the cache's languages only."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from skippy.compile.toolchain import tree_files
from skippy.compile.uncached import find_uncached_sources, launcher_text, uncached_launcher
from tests.unit.test_build_plan import defines, plan


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, "utf-8")
    return path


def test_a_tree_without_embedded_files_has_none(tmp_path: Path) -> None:
    _write(tmp_path, "src/llama.cpp", '#include "llama.h"\nint n_embd_head = 0; // the embedding size\n')
    _write(tmp_path, "src/llama.h", "int llama_embed(void);\n")
    _write(tmp_path, "ggml/metal/CMakeLists.txt", 'COMMAND echo .incbin "x" >> embed.s\n')  # not C
    assert find_uncached_sources(tree_files(tmp_path)) == ()


def test_incbin_and_embed_sources_are_found(tmp_path: Path) -> None:
    asm = _write(tmp_path, "ggml/blob.c", '__asm__(".incbin \\"weights.bin\\"");\n')
    embed = _write(tmp_path, "src/table.cpp", 'static const char t[] = {\n  #  embed "t.bin"\n};\n')
    _write(tmp_path, "src/plain.c", "int x;\n")
    _write(tmp_path, ".git/hooks/x.c", '__asm__(".incbin \\"y\\"");\n')  # .git is skipped
    assert find_uncached_sources(tree_files(tmp_path)) == (asm, embed)


def test_a_header_that_embeds_marks_every_source_including_it_through_other_headers(tmp_path: Path) -> None:
    _write(tmp_path, "include/shaders.h", "static const char s[] = {\n#embed <shaders.spv>\n};\n")
    _write(tmp_path, "include/wrap.hpp", '#include "shaders.h"\n')
    direct = _write(tmp_path, "src/a.c", "#include <shaders.h>\n")
    through = _write(tmp_path, "src/b.cu", '#include "../include/wrap.hpp"\n')
    _write(tmp_path, "src/c.c", '#include "other.h"\n')
    assert find_uncached_sources(tree_files(tmp_path)) == (direct, through)


def _run(script: Path, *args: str) -> str:
    return subprocess.run([str(script), *args], capture_output=True, text=True, check=True).stdout


def test_the_script_runs_the_compiler_alone_for_the_listed_sources_and_the_cache_for_the_rest(tmp_path: Path) -> None:
    cache = _write(tmp_path, "bin/cache", '#!/bin/sh\necho "cache $*"\n')
    compiler = _write(tmp_path, "bin/cc", '#!/bin/sh\necho "cc $*"\n')
    for exe in (cache, compiler):
        exe.chmod(0o755)
    listed = tmp_path / "src dir" / "blob's.c"  # quoted in the script
    got = uncached_launcher(tmp_path / "builds", str(cache), [listed])
    assert got is not None
    got.write()
    assert got.path.parent == tmp_path / "builds" / ".launchers" and os.access(got.path, os.X_OK)
    assert _run(got.path, str(compiler), "-O2", "-o", "blob.o", "-c", str(listed)).startswith("cc -O2")
    other = str(tmp_path / "src dir" / "other.c")
    assert _run(got.path, str(compiler), "-c", other) == f"cache {compiler} -c {other}\n"


def test_no_sources_no_script_and_the_name_follows_the_text(tmp_path: Path) -> None:
    assert uncached_launcher(tmp_path, "/usr/bin/sccache", []) is None
    one = uncached_launcher(tmp_path, "/usr/bin/sccache", [tmp_path / "a.c"])
    two = uncached_launcher(tmp_path, "/usr/bin/sccache", [tmp_path / "b.c"])
    assert one is not None and two is not None and one.path != two.path
    assert "/usr/bin/sccache" in launcher_text("/usr/bin/sccache", [tmp_path / "a.c"])


def test_the_plan_points_the_cached_languages_at_the_script(tmp_path: Path) -> None:
    source = tmp_path / "proj" / ".deps" / "llama.cpp" / "ggml" / "blob.c"
    p = plan(tmp_path, "cuda", tr={"uncached_sources": (source,)})
    script = p.launcher_script
    assert script is not None and script.sources == (source,)
    values = defines(p)
    for lang in ("C", "CXX", "CUDA"):
        assert values[f"CMAKE_{lang}_COMPILER_LAUNCHER"] == str(script.path)
    assert "sccache, 1 source(s) uncached" in p.provenance["CMAKE_C_COMPILER_LAUNCHER"]
    assert "/opt/t/sccache" in script.text and str(source) in script.text


def test_a_tree_without_them_keeps_the_cache_as_its_launcher(tmp_path: Path) -> None:
    p = plan(tmp_path, "cpu")
    assert p.launcher_script is None
    assert defines(p)["CMAKE_C_COMPILER_LAUNCHER"] == "/opt/t/sccache"
