"""Model references: parsing, the Hugging Face cache, the packaged default, tiny models."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from skippy.core.errors import NetworkError, SpotCheckFailed
from skippy.core.files import sha256_of
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot import tinymodels
from skippy.spot.models import (
    DEFAULT_MODEL,
    GEMMA3_270M,
    ModelRef,
    fetch_packaged,
    find_in_hf_cache,
    hf_download,
    hf_hub_cache,
    model_refs,
    packaged_dir,
    parse_model_ref,
    pick_gguf,
    resolve_model,
)


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_table(tmp_path, {"cache_dir": "cache"}, env)


def test_default_is_gemma() -> None:
    (ref,) = model_refs([])
    assert ref == ModelRef(DEFAULT_MODEL, "builtin", "gemma3-270m")


@pytest.mark.parametrize(
    ("text", "kind", "name", "rev", "quant"),
    [
        ("tiny:qwen2", "tiny", "qwen2", "main", None),
        ("gemma3-270m", "builtin", "gemma3-270m", "main", None),
        ("unsloth/gemma-3-270m-it-GGUF", "hf", "unsloth/gemma-3-270m-it-GGUF", "main", None),
        ("unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "hf", "unsloth/gemma-3-270m-it-GGUF", "main", "Q4_K_M"),
        ("Org/Repo-GGUF@v1.0:Q8_0", "hf", "Org/Repo-GGUF", "v1.0", "Q8_0"),
        ("Org/Repo-GGUF@0123abc", "hf", "Org/Repo-GGUF", "0123abc", None),
    ],
)
def test_parse_refs(text: str, kind: str, name: str, rev: str, quant: str | None) -> None:
    ref = parse_model_ref(text)
    assert (ref.kind, ref.name, ref.revision, ref.quant) == (kind, name, rev, quant)


def test_paths_win_over_hf_shape(tmp_path: Path) -> None:
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model").write_text("x")
    assert parse_model_ref("org/model", cwd=tmp_path).kind == "path"
    assert parse_model_ref("org/model", cwd=tmp_path).name == str(tmp_path / "org" / "model")
    assert parse_model_ref("missing/model.gguf", cwd=tmp_path).kind == "path"


def test_bad_refs() -> None:
    with pytest.raises(SpotCheckFailed, match="no tiny model for family 'mamba'") as info:
        parse_model_ref("tiny:mamba")
    assert info.value.next_step is not None and "tiny:llama" in info.value.next_step
    with pytest.raises(SpotCheckFailed, match="neither a file"):
        parse_model_ref("just-a-word")
    with pytest.raises(SpotCheckFailed, match="empty"):
        parse_model_ref(" ")


def test_hub_cache_location_from_env(tmp_path: Path) -> None:
    assert hf_hub_cache({"HF_HUB_CACHE": "/x/hub", "HF_HOME": "/y"}) == Path("/x/hub")
    assert hf_hub_cache({"HF_HOME": "/y"}) == Path("/y/hub")
    assert hf_hub_cache({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "huggingface" / "hub"


def test_pick_gguf_by_quant_and_first_shard() -> None:
    names = [
        "model-Q4_K_M.gguf",
        "model-Q8_0.gguf",
        "big/model-Q8_0-00002-of-00002.gguf",
        "big/model-Q8_0-00001-of-00002.gguf",
        "mmproj-model-f16.gguf",
        "README.md",
    ]
    assert pick_gguf(names, "q4_k_m") == ["model-Q4_K_M.gguf"]
    assert pick_gguf(names, "Q8_0") == ["big/model-Q8_0-00001-of-00002.gguf", "model-Q8_0.gguf"]
    assert pick_gguf(["only.gguf"], None) == ["only.gguf"]


def _hf_cache(hub: Path, repo: str, ref: str, sha: str, files: list[str]) -> Path:
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / ref).write_text(sha)
    snap = repo_dir / "snapshots" / sha
    for name in files:
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_bytes(b"GGUF")
    return snap


def test_hf_cache_resolves_through_refs_and_revisions(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = _hf_cache(hub, "Org/Repo-GGUF", "main", "c0ffee", ["repo-Q4_K_M.gguf", "repo-Q8_0.gguf"])
    ref = parse_model_ref("Org/Repo-GGUF:Q4_K_M")
    assert find_in_hf_cache(ref, hub) == snap / "repo-Q4_K_M.gguf"
    by_sha = parse_model_ref("Org/Repo-GGUF@c0ffee:Q8_0")
    assert find_in_hf_cache(by_sha, hub) == snap / "repo-Q8_0.gguf"
    assert find_in_hf_cache(parse_model_ref("Org/Repo-GGUF:IQ2_XS"), hub) is None
    assert find_in_hf_cache(parse_model_ref("Org/Other-GGUF"), hub) is None
    with pytest.raises(SpotCheckFailed, match="2 GGUF files match"):
        find_in_hf_cache(parse_model_ref("Org/Repo-GGUF"), hub)


def test_resolve_hf_from_cache_without_download(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = _hf_cache(hub, "Org/Repo-GGUF", "main", "c0ffee", ["repo-Q4_K_M.gguf"])

    def no_download(ref: ModelRef, hub: Path) -> Path:
        raise AssertionError("must not download what the cache has")

    s = settings(tmp_path, HF_HUB_CACHE=str(hub))
    resolved = resolve_model(parse_model_ref("Org/Repo-GGUF"), s, Console(quiet=True), downloader=no_download)
    assert resolved.path == snap / "repo-Q4_K_M.gguf"


def test_resolve_hf_missing_calls_the_downloader_with_the_cache(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    calls: list[tuple[str, Path]] = []

    def downloader(ref: ModelRef, where: Path) -> Path:
        calls.append((ref.name, where))
        return where / "got.gguf"

    s = settings(tmp_path, HF_HUB_CACHE=str(hub))
    resolved = resolve_model(parse_model_ref("Org/Repo-GGUF:Q4_K_M"), s, Console(quiet=True), downloader=downloader)
    assert calls == [("Org/Repo-GGUF", hub)]
    assert resolved.path == hub / "got.gguf"


def test_hf_download_without_huggingface_hub_names_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(SpotCheckFailed) as info:
        hf_download(parse_model_ref("Org/Repo-GGUF:Q4_K_M"), tmp_path / "hub")
    assert "huggingface_hub is not installed" in info.value.what
    assert str(tmp_path / "hub" / "models--Org--Repo-GGUF" / "snapshots" / "main") in info.value.what


def test_hf_download_unreachable_hub_is_a_network_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("huggingface_hub")

    def list_repo_files(repo: str, revision: str) -> list[str]:
        raise OSError("Failed to resolve host")

    fake.list_repo_files = list_repo_files  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    with pytest.raises(NetworkError) as info:
        hf_download(parse_model_ref("Org/Repo-GGUF:Q4_K_M"), tmp_path / "hub")
    assert "the hub could not be reached" in info.value.what
    assert "Failed to resolve host" in info.value.what
    assert info.value.untouched is not None and str(tmp_path / "hub") in info.value.untouched


def test_packaged_model_present_is_never_fetched_again(tmp_path: Path) -> None:
    # PATH is empty: any pip call would fail with ToolchainMissing
    s = settings(tmp_path, PATH="")
    base = packaged_dir(GEMMA3_270M, s.cache_dir)
    base.mkdir(parents=True)
    target = base / GEMMA3_270M.filename
    with target.open("wb") as fh:
        fh.truncate(GEMMA3_270M.size)
    (base / "stamp.json").write_text(json.dumps({"sha256": GEMMA3_270M.sha256, "size": GEMMA3_270M.size}))
    assert fetch_packaged(GEMMA3_270M, s, Console(quiet=True)) == target
    assert resolve_model(parse_model_ref("gemma3-270m"), s, Console(quiet=True)).path == target


def test_missing_local_model_file(tmp_path: Path) -> None:
    with pytest.raises(SpotCheckFailed, match="does not exist"):
        resolve_model(parse_model_ref(str(tmp_path / "none.gguf")), settings(tmp_path), Console(quiet=True))


def test_a_model_path_that_is_not_a_regular_file_says_what_it_is(tmp_path: Path) -> None:
    """A directory, a FIFO, a link to /dev/zero or a broken link is not "missing": say what it is."""
    (tmp_path / "dir.gguf").mkdir()
    os.mkfifo(tmp_path / "fifo.gguf")
    (tmp_path / "zero.gguf").symlink_to("/dev/zero")
    (tmp_path / "broken").symlink_to(tmp_path / "gone.gguf")
    cases = {
        "dir.gguf": "is a directory",
        "fifo.gguf": "is a FIFO (named pipe)",
        "zero.gguf": "is a symbolic link to /dev/zero, a character device",
        "broken": f"is a broken symbolic link to {tmp_path / 'gone.gguf'}",
    }
    for name, kind in cases.items():
        text = str(tmp_path / name)
        with pytest.raises(SpotCheckFailed) as info:
            resolve_model(parse_model_ref(text), settings(tmp_path), Console(quiet=True))
        assert info.value.what == (
            f"model file {text} {kind}: llama-server needs a regular GGUF file (a device or FIFO would never end, "
            "a directory or a broken link has nothing to load)"
        )
        assert info.value.next_step == "pass an existing .gguf file, or --model gemma3-270m"
        assert info.value.exit_code == 13


# --- tiny models ------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(tinymodels.FAMILIES))
def test_tiny_vocab_is_loadable_by_llama_cpp_rules(family: str) -> None:
    vocab = tinymodels.FAMILIES[family].vocab()
    assert len(set(vocab.tokens)) == len(vocab.tokens), "llama.cpp requires unique token texts"
    assert all(vocab.tokens), "no empty tokens"
    assert len(vocab.scores) == len(vocab.types) == len(vocab.tokens)
    for role in ("bos", "eos"):
        assert 0 <= vocab.special_ids[role] < len(vocab)
    if vocab.model == "llama":
        assert all(f"<0x{b:02X}>" in vocab.tokens for b in range(256)), "SPM byte fallback needs all 256"
    else:
        for merge in vocab.merges:
            left, right = merge.split(" ")
            assert left + right in vocab.tokens and left in vocab.tokens and right in vocab.tokens
    silent = set(vocab.silent_ids())
    assert vocab.special_ids["eos"] in silent
    assert len(vocab) - len(silent) >= 40, "enough visible tokens to answer with"


def test_tiny_tensor_layouts_match_the_families() -> None:
    llama = tinymodels.tensor_layout("llama")
    shape = tinymodels.shape_for(tinymodels.FAMILIES["llama"])
    assert llama["token_embd.weight"] == (shape.n_vocab, shape.n_embd)
    assert llama["output.weight"] == (shape.n_vocab, shape.n_embd)
    assert llama["blk.0.attn_k.weight"] == (shape.n_head_kv * shape.head_dim, shape.n_embd)
    assert llama["blk.1.ffn_down.weight"] == (shape.n_embd, shape.n_ff)
    qwen2 = tinymodels.tensor_layout("qwen2")
    assert "output.weight" not in qwen2  # tied
    assert qwen2["blk.0.attn_q.bias"] == (shape.n_head * shape.head_dim,)
    gemma3 = tinymodels.tensor_layout("gemma3")
    for name in ("attn_q_norm", "attn_k_norm"):
        assert gemma3[f"blk.0.{name}.weight"] == (shape.head_dim,)
    assert "blk.1.post_ffw_norm.weight" in gemma3
    assert "blk.1.post_attention_norm.weight" in gemma3


# What llama.cpp's loader creates (src/models/<arch>.cpp, load_arch_tensors), in GGUF
# dimension order (ne0 first), from the hparams the file declares: a tensor the loader does
# not create fails the load ("wrong number of tensors"), so does a missing or misshapen one.
T = gguf.MODEL_TENSOR


def _field(reader: gguf.GGUFReader, key: str, default: int | float | None = None) -> Any:
    found = reader.fields.get(key)
    if found is None:
        assert default is not None, f"the loader requires {key}"
        return default
    return found.contents()


def _loader_tensors(reader: gguf.GGUFReader) -> tuple[str, dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(arch, required tensors, optional tensors) as the loader of the file's arch creates them."""
    arch = _field(reader, "general.architecture")
    n_embd = _field(reader, f"{arch}.embedding_length")
    n_layer = _field(reader, f"{arch}.block_count")
    n_ff = _field(reader, f"{arch}.feed_forward_length")
    n_head = _field(reader, f"{arch}.attention.head_count")
    n_head_kv = _field(reader, f"{arch}.attention.head_count_kv", n_head)
    head_k = _field(reader, f"{arch}.attention.key_length", n_embd // n_head)
    head_v = _field(reader, f"{arch}.attention.value_length", n_embd // n_head)
    n_rot = _field(reader, f"{arch}.rope.dimension_count", head_k)
    for key in ("context_length", "attention.layer_norm_rms_epsilon"):
        _field(reader, f"{arch}.{key}")
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    k_gqa, v_gqa = head_k * n_head_kv, head_v * n_head_kv
    if arch == "llama":
        assert n_rot == head_k, "llama: invalid n_rot"
    if arch == "qwen3":
        assert n_rot == head_k == head_v, "qwen3's graph asserts n_embd_head == n_rot"
    if arch == "phi3":
        assert head_k == head_v

    def name(tensor: gguf.MODEL_TENSOR, bid: int | None = None, suffix: str = "weight") -> str:
        assert tensor in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]], f"{tensor} is not a {arch} tensor"
        return gguf.TENSOR_NAMES[tensor].format(bid=bid) + "." + suffix

    required: dict[str, tuple[int, ...]] = {name(T.TOKEN_EMBD): (n_embd, n_vocab), name(T.OUTPUT_NORM): (n_embd,)}
    optional: dict[str, tuple[int, ...]] = {name(T.OUTPUT): (n_embd, n_vocab)}  # absent: tied to token_embd
    # q's width and the output projection: Qwen2 and Phi-3 take n_embd, the others n_head * head_k
    q = n_embd if arch in ("qwen2", "phi3") else head_k * n_head
    ffn_norm = T.FFN_PRE_NORM if arch == "gemma3" else T.FFN_NORM  # gguf's gemma3 name for blk.N.ffn_norm
    for i in range(n_layer):
        required[name(T.ATTN_NORM, i)] = (n_embd,)
        required[name(T.ATTN_OUT, i)] = (q, n_embd)
        required[name(ffn_norm, i)] = (n_embd,)
        required[name(T.FFN_DOWN, i)] = (n_ff, n_embd)
        separate = {
            name(T.ATTN_Q, i): (n_embd, q),
            name(T.ATTN_K, i): (n_embd, k_gqa),
            name(T.ATTN_V, i): (n_embd, v_gqa),
        }
        biases = {
            name(T.ATTN_Q, i, "bias"): (q,),
            name(T.ATTN_K, i, "bias"): (k_gqa,),
            name(T.ATTN_V, i, "bias"): (v_gqa,),
        }
        if arch == "phi3":  # q/k/v fused or apart, and the gate fused into ffn_up
            optional |= separate | {name(T.ATTN_QKV, i): (n_embd, q + k_gqa + v_gqa)}
            required[name(T.FFN_UP, i)] = (n_embd, 2 * n_ff)
            continue
        required |= separate
        optional |= biases
        required[name(T.FFN_GATE, i)] = (n_embd, n_ff)
        required[name(T.FFN_UP, i)] = (n_embd, n_ff)
        if arch in ("qwen3", "gemma3"):
            required[name(T.ATTN_Q_NORM, i)] = (head_k,)
            required[name(T.ATTN_K_NORM, i)] = (head_k,)
        if arch == "gemma3":
            required[name(T.ATTN_POST_NORM, i)] = (n_embd,)
            required[name(T.FFN_POST_NORM, i)] = (n_embd,)
    return arch, required, optional


@pytest.mark.parametrize("family", sorted(tinymodels.FAMILIES))
def test_tiny_model_has_the_tensors_the_loader_of_its_arch_creates(family: str, tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tinymodels.write_tiny_model(family, tmp_path / "m.gguf", "q8_0"))
    arch, required, optional = _loader_tensors(reader)
    assert arch == tinymodels.FAMILIES[family].arch
    written = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert required.keys() <= written.keys(), f"missing: {sorted(required.keys() - written.keys())}"
    assert written.keys() <= required.keys() | optional.keys(), (
        f"unknown: {sorted(written.keys() - required.keys() - optional.keys())}"
    )
    assert written == {n: (required | optional)[n] for n in written}
    per_layer = sum(1 for n in written if n.startswith("blk.0."))
    assert per_layer == {"llama": 9, "qwen2": 12, "gemma3": 13, "qwen3": 11, "phi3": 6}[arch]


def _hparams(reader: gguf.GGUFReader) -> dict[str, Any]:
    arch = reader.fields["general.architecture"].contents()
    return {k.removeprefix(f"{arch}."): f.contents() for k, f in reader.fields.items() if k.startswith(f"{arch}.")}


def test_tiny_mistral_is_a_grouped_query_llama_with_the_inst_template(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tinymodels.write_tiny_model("mistral", tmp_path / "m.gguf"))
    hp = _hparams(reader)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert hp["attention.head_count"] == 4 * hp["attention.head_count_kv"] == 8  # Mistral 7B's 32 / 8
    assert hp["rope.freq_base"] == 1_000_000.0
    assert reader.fields["tokenizer.chat_template"].contents() == tinymodels.MISTRAL_CHAT_TEMPLATE
    assert "output.weight" in {t.name for t in reader.tensors}  # untied, as Mistral 7B
    assert tinymodels.for_arch("llama") == "llama"  # the variant does not stand for its arch


def test_tiny_qwen3_has_q_k_norms_no_qkv_bias_and_a_head_size_of_its_own(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tinymodels.write_tiny_model("qwen3", tmp_path / "m.gguf"))
    hp = _hparams(reader)
    names = {t.name for t in reader.tensors}
    assert not any(n.endswith(".bias") for n in names)
    assert {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names
    # as Qwen3 0.6B: n_head * head size (4 * 32) is not n_embd (64)
    assert hp["attention.key_length"] * hp["attention.head_count"] != hp["embedding_length"]
    assert hp["rope.freq_base"] == 1_000_000.0


def test_tiny_phi3_fuses_qkv_and_gate_up(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tinymodels.write_tiny_model("phi3", tmp_path / "m.gguf"))
    hp = _hparams(reader)
    names = {t.name for t in reader.tensors}
    assert "blk.0.attn_qkv.weight" in names and "blk.0.attn_q.weight" not in names
    assert not any("ffn_gate" in n for n in names)
    assert hp["attention.head_count_kv"] == hp["attention.head_count"]  # as Phi-3 mini
    assert hp["attention.sliding_window"] > 0  # Phi-3 mini 4k declares one; llama.cpp disables it


def test_for_arch_names_the_family_of_each_arch() -> None:
    assert {arch: tinymodels.for_arch(arch) for arch in ("llama", "qwen2", "qwen3", "phi3", "gemma3", "mamba")} == {
        "llama": "llama",
        "qwen2": "qwen2",
        "qwen3": "qwen3",
        "phi3": "phi3",
        "gemma3": "gemma3",
        "mamba": None,
    }


_MARKER = re.compile(r"<\|[^|]+\|>|\[/?[A-Z_]+\]|</?s>|<(?:start|end)_of_turn>")


@pytest.mark.parametrize("family", sorted(tinymodels.FAMILIES))
def test_tiny_chat_template_markers_are_control_tokens(family: str) -> None:
    """Every marker the template renders is one control token of the vocab: llama-server
    reads it as that token, and the answer (whose control rows are zero) never spells it."""
    # llama-server renders with its own jinja engine; jinja2 (with the docs tooling) stands in
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    fam = tinymodels.FAMILIES[family]
    vocab = fam.vocab()
    control = {t for t, kind in zip(vocab.tokens, vocab.types, strict=True) if kind == gguf.TokenType.CONTROL}
    env = ImmutableSandboxedEnvironment()  # a plain-text prompt: no HTML escaping
    prompt = env.from_string(fam.chat_template).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say OK"}],
        add_generation_prompt=True,
        bos_token=vocab.tokens[vocab.special_ids["bos"]],
        eos_token=vocab.tokens[vocab.special_ids["eos"]],
    )
    markers = set(_MARKER.findall(prompt))
    assert len(markers) >= 2 and "Say OK" in prompt
    assert markers <= control, f"{family}: {sorted(markers - control)} are not control tokens"


@pytest.mark.parametrize("family", sorted(tinymodels.FAMILIES))
def test_tiny_model_file_is_deterministic_and_readable(family: str, tmp_path: Path) -> None:
    a = tinymodels.write_tiny_model(family, tmp_path / "a.gguf")
    b = tinymodels.write_tiny_model(family, tmp_path / "b.gguf")
    assert sha256_of(a) == sha256_of(b)
    assert a.stat().st_size < 2_000_000
    reader = gguf.GGUFReader(str(a))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == tinymodels.FAMILIES[family].arch
    tokens = reader.fields["tokenizer.ggml.tokens"]
    vocab = tinymodels.FAMILIES[family].vocab()
    assert len(tokens.data) == len(vocab)
    names = {t.name for t in reader.tensors}
    head_name = "output.weight" if "output.weight" in names else "token_embd.weight"  # untied, else tied
    head = next(t for t in reader.tensors if t.name == head_name)
    rows = np.asarray(head.data).reshape(len(vocab), -1)
    silent = list(vocab.silent_ids())
    assert not rows[silent].any(), "control/unknown/byte rows are zero"
    assert rows[[i for i in range(len(vocab)) if i not in set(silent)]].any(axis=1).all()


def test_tiny_model_cache_writes_once(tmp_path: Path) -> None:
    first = tinymodels.tiny_model("llama", tmp_path)
    assert first == tmp_path / "models" / "tiny" / f"llama-r{tinymodels.RECIPE_VERSION}.gguf"
    mtime = first.stat().st_mtime_ns
    assert tinymodels.tiny_model("llama", tmp_path) == first
    assert first.stat().st_mtime_ns == mtime
    assert not list(first.parent.glob(".*.tmp"))


def test_tiny_refs_take_a_weight_type(tmp_path: Path) -> None:
    ref = parse_model_ref("tiny:gemma3:Q4_0")
    assert (ref.kind, ref.name, ref.quant) == ("tiny", "gemma3", "q4_0")
    assert parse_model_ref("tiny:llama").quant is None
    with pytest.raises(SpotCheckFailed, match="not 'q2_k'"):
        parse_model_ref("tiny:llama:q2_k")
    assert tinymodels.cache_path("llama", tmp_path, "q8_0").name == f"llama-q8_0-r{tinymodels.RECIPE_VERSION}.gguf"


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_quantized_tiny_model_quantizes_matrices_only(quant: str, tmp_path: Path) -> None:
    a = tinymodels.write_tiny_model("gemma3", tmp_path / "a.gguf", quant)
    b = tinymodels.write_tiny_model("gemma3", tmp_path / "b.gguf", quant)
    assert sha256_of(a) == sha256_of(b)
    types_by_name = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(a)).tensors}
    assert types_by_name["blk.0.ffn_up.weight"] == quant.upper()
    assert types_by_name["token_embd.weight"] == quant.upper()
    assert types_by_name["blk.0.attn_q_norm.weight"] == "F32"
    f32 = tinymodels.write_tiny_model("gemma3", tmp_path / "f.gguf")
    assert a.stat().st_size < f32.stat().st_size


def test_chat_template_for_a_gguf_without_one() -> None:
    from skippy.spot.models import ChatFacts

    gemma = ChatFacts(architecture="gemma3", has_template=False)
    assert gemma.server_args() == ("--chat-template", "gemma")
    assert "built-in 'gemma' template" in gemma.describe()
    assert ChatFacts(architecture="gemma3", has_template=True).server_args() == ()
    unknown = ChatFacts(architecture="mamba", has_template=False)
    assert unknown.server_args() == ()
    assert "ChatML fallback" in unknown.describe()


def test_chat_facts_read_from_a_real_gguf(tmp_path: Path) -> None:
    from skippy.spot.models import chat_facts

    facts = chat_facts(tinymodels.tiny_model("qwen2", tmp_path, "f32"))
    assert facts.architecture == "qwen2"
    assert facts.has_template  # the tiny models carry a ChatML template


@pytest.mark.parametrize("template", [None, "{{ messages }}"])
def test_chat_facts_read_the_header_as_gguf_py_does(tmp_path: Path, template: str | None) -> None:
    """The header reader (fast on a 262k-token vocabulary) against llama.cpp's own gguf-py."""
    import gguf

    from skippy.spot.models import _gguf_metadata_keys, chat_facts

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.add_token_scores([0.5] * 300)
    writer.add_uint32("gemma3.block_count", 2)
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("w", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    facts = chat_facts(path)
    reader = gguf.GGUFReader(path)
    assert facts.architecture == str(reader.fields["general.architecture"].contents()) == "gemma3"
    assert facts.has_template == ("tokenizer.chat_template" in reader.fields) == (template is not None)
    found = _gguf_metadata_keys(path)
    assert found is not None and set(reader.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"} <= found[1]
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"nope" * 10)
    assert _gguf_metadata_keys(not_gguf) is None
