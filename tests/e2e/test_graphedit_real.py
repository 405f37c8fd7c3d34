"""The generated lane's graph rewrite over every family file of the real pinned tree.

The family files are read from the pinned sdist (llama-cpp-python 0.3.35, upstream 4df29be4)
and edited in memory: nothing is written or built.  Every family with a graph builder gets the
layer hook or a refusal naming the file and the reason; each edited file re-parses without new
errors, and a second pass over it changes nothing.  The anchor figures are counted here
independently of the rewrite, on the text.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from skippy.core.errors import GraphEditError, QueueError
from skippy.maintain import cppparse, genspec, graphcode
from skippy.maintain import graphedit as ge
from tooling.testbed import LLAMA_CPP_PYTHON

PINNED = LLAMA_CPP_PYTHON[1]
ANCHOR = b'cb(cur, "l_out", il);'
#: the families of the pinned tree the rewrite cannot place, and why (checked below)
REFUSED = {
    "eagle3.cpp": "no layer loop",  # one decoder layer, written out without a loop
    "wavtokenizer-dec.cpp": 'has 2 layer loops (lines 130, 218) and no "l_out" anchor',  # posnet, convnext
}
#: families whose l_out anchor sits in a per-layer helper, not in the builder's loop
HELPER_ANCHORED = {"granite.cpp", "granite-hybrid.cpp", "granite-switch.cpp", "nemotron-h.cpp"}
#: files of src/models that define no family builder and share none (a quantize stub, base classes)
NOT_FAMILIES = {"clip.cpp", "delta-net-base.cpp", "mamba-base.cpp", "rwkv6-base.cpp", "rwkv7-base.cpp"}


@pytest.fixture(scope="module")
def models(pinned_sdist: Path) -> dict[str, bytes]:
    """``src/models/*`` of the pinned tree: file name -> bytes (models.h included)."""
    folder = f"{PINNED.folder}/src/models/"
    found: dict[str, bytes] = {}
    with tarfile.open(pinned_sdist) as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            if member.isfile() and name.startswith(folder) and "/" not in name[len(folder) :]:
                handle = archive.extractfile(member)
                assert handle is not None
                found[name[len(folder) :]] = handle.read()
    return found


def test_every_family_with_a_graph_builder_is_placed_or_refused(models: dict[str, bytes]) -> None:
    files = sorted(name for name in models if name.endswith(".cpp"))
    assert len(files) == 147  # the tree is the real one
    assert sum(1 for name in files if ANCHOR in models[name]) == 115  # counted on the text
    shared = graphcode.shared_graphs(models["models.h"])
    placed: dict[str, ge.FamilyEdit] = {}
    refused: dict[str, str] = {}
    sharing: dict[str, str] = {}
    without: set[str] = set()
    for name in files:
        source, path = models[name], f"src/models/{name}"
        family = graphcode.family_class_for(path)
        if not any(cls == family for cls, _name, _line in graphcode.find_builders(source)):
            if family in shared:
                sharing[name] = shared[family]
            else:
                without.add(name)
            with pytest.raises(GraphEditError, match="no graph builder"):
                ge.place_layer_hooks(source, path=path)
            continue
        try:
            placed[name] = ge.place_layer_hooks(source, path=path)
        except GraphEditError as exc:
            assert exc.path == path
            refused[name] = exc.reason
    report = [
        f"{len(placed)} families placed ({sum(len(e.placements) for e in placed.values())} hooks), "
        f"{len(refused)} refused, {len(sharing)} sharing another family's builder, {len(without)} not families",
        *(f"  refused {name}: {reason}" for name, reason in sorted(refused.items())),
        *(f"  {name} uses the builder of {cls}" for name, cls in sorted(sharing.items())),
    ]
    print("\n" + "\n".join(report))
    assert without == NOT_FAMILIES
    assert set(refused) == set(REFUSED)
    for name, reason in REFUSED.items():
        assert reason in refused[name]
    assert len(placed) + len(refused) + len(sharing) + len(without) == len(files)
    assert len(placed) == 124
    # a family sharing a builder is covered by the hook placed in that builder's own file
    by_class = {graphcode.family_class_for(name): name for name in placed}
    assert all(cls in by_class for cls in sharing.values()), sharing
    for name, edit in placed.items():
        check_edit(name, models[name], edit)
    # the library's own classification of the tree agrees, and maps each family to its shard's file
    done = ge.rewrite_tree({f"src/models/{name}": models[name] for name in files}, models["models.h"])
    assert {path.rsplit("/", 1)[1] for path in done.edits} == set(placed)
    assert {path.rsplit("/", 1)[1]: reason for path, reason in done.refused.items()} == refused
    assert {path.rsplit("/", 1)[1]: cls for path, cls in done.sharing.items()} == sharing
    assert done.covering("llama_model_granite_moe") == "src/models/granite.cpp"
    assert done.covering("llama_model_phimoe") == "src/models/phi3.cpp"
    assert done.covering("llama_model_qwen2") == "src/models/qwen2.cpp"
    assert done.covering("llama_model_eagle3") is None
    anchored = {name for name, edit in placed.items() if any(p.how == "anchor" for p in edit.placements)}
    with_anchor_text = {name for name in files if ANCHOR in models[name]}
    # in these the anchor ends a per-layer helper (build_layer_ffn) that the builder's loop calls:
    # the hook closes the loop body, after the helper's result became the next layer's input
    assert with_anchor_text - anchored == HELPER_ANCHORED
    assert all(p.how == "end of loop body" for name in HELPER_ANCHORED for p in placed[name].placements)


def check_edit(name: str, source: bytes, edit: ge.FamilyEdit) -> None:
    """The edited text: one new line per placement, each after an l_out anchor or closing the loop
    body; no new parse errors; a second pass changes nothing."""
    assert edit.changed, name
    before, after = source.splitlines(), edit.source.splitlines()
    added = [line for line in after if ge.HOOK.encode() in line]
    assert len(after) - len(before) == len(added) == len(edit.placements), name
    for index, line in enumerate(after):
        if ge.HOOK.encode() not in line:
            continue
        previous = next(p for p in reversed(after[:index]) if p.strip())
        following = next(p for p in after[index + 1 :] if p.strip())
        assert b'"l_out", il);' in previous or following.strip() == b"}", (name, line)
    assert cppparse.error_count(edit.source) == cppparse.error_count(source), name
    again = ge.place_layer_hooks(edit.source, path=edit.path)
    assert again.source == edit.source, name
    assert not again.changed, name


@pytest.mark.parametrize("arch", sorted(graphcode.NOT_MODEL_ARCHS))
def test_entries_that_are_not_families_are_refused(models: dict[str, bytes], arch: str) -> None:
    with pytest.raises(QueueError) as info:  # the generated lane's spec refuses it
        genspec.parse_spec(Path("families.toml"), f'schema = 2\n[[family]]\nname = "x"\narch = "{arch}"\n'.encode())
    assert arch in (info.value.details or "")
    # the clip entry's file is a quantize-only stub: no builder to edit either
    with pytest.raises(GraphEditError, match="no graph builder"):
        ge.place_layer_hooks(models["clip.cpp"], path="src/models/clip.cpp")
