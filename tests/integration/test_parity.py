"""`invoke parity` on fixture upstreams: dropped arch cases, the allowlist, deletions, boundary lint."""

from __future__ import annotations

import json

import pytest

from skippy.cli.entries import parity_main
from skippy.core.errors import ParityFailed, QueueError
from skippy.core.ui import Console
from skippy.maintain import parity
from tests.conftest import Project
from tests.integration.test_parity_fixtures import (
    CASES,
    SWITCHES,
    TABLE_ENTRIES,
    arch_upstream,
    chain_patches,
    queue_core,
)

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)

DROP_TWO = (
    "core: simplify rope types",
    {
        "src/llama-model.cpp": (
            "        case LLM_ARCH_MPT:\n        case LLM_ARCH_BLOOM:\n",
            "",
        )
    },
)
ADD_HOOK = (
    "core: add a hook point",
    {"src/llama-model.cpp": ("    return res;\n", "    res = hook(res);\n    trace(res);\n    return res;\n")},
)


def test_no_queue_reports_the_upstream_counts(project: Project) -> None:
    sha = arch_upstream(project)
    report = parity.run_parity(project.settings(), console=QUIET)
    assert report.ok
    assert report.upstream_sha == sha
    assert (report.upstream.switches, report.upstream.cases) == (SWITCHES, CASES)
    assert report.upstream.entries == TABLE_ENTRIES
    assert report.patched == report.upstream
    assert report.upstream.per_file["src/llama-model.cpp"][:2] == (4, 12)
    assert report.dropped == () and report.deletions == ()


def test_a_dropped_case_fails_until_allowlisted(project: Project) -> None:
    base = arch_upstream(project)
    patches = chain_patches(project, base, [ADD_HOOK, DROP_TWO])
    queue_core(project, patches, ["core-add-a-hook-point", "core-simplify-rope-types"])
    settings = project.settings()

    report = parity.run_parity(settings, console=QUIET)
    assert not report.ok
    assert [(d.file, d.scope, d.case, d.patch) for d in report.failures] == [
        ("src/llama-model.cpp", "llama_model_rope_type", "LLM_ARCH_BLOOM", "core/0002-core-simplify-rope-types.patch"),
        ("src/llama-model.cpp", "llama_model_rope_type", "LLM_ARCH_MPT", "core/0002-core-simplify-rope-types.patch"),
    ]
    assert report.patched.cases == CASES - 2
    # the deletion of upstream lines is listed, with the patch that made it; the hook patch deletes nothing
    assert [(d.patch, d.file, d.upstream_lines) for d in report.deletions] == [
        ("core/0002-core-simplify-rope-types.patch", "src/llama-model.cpp", 2)
    ]
    assert "LLM_ARCH_MPT" in report.deletions[0].preview[0]

    code = parity_main(project.env, root=project.root, json=False)
    assert code == ParityFailed.exit_code

    allow = settings.patch_dir / "parity-allowlist.toml"
    allow.write_text(
        '[[dropped]]\nfile = "src/llama-model.cpp"\nfunction = "llama_model_rope_type"\n'
        'case = "LLM_ARCH_MPT"\nreason = "MPT support is removed downstream"\n',
        encoding="utf-8",
    )
    report = parity.run_parity(settings, console=QUIET)
    assert [d.case for d in report.failures] == ["LLM_ARCH_BLOOM"]
    assert [d.reason for d in report.dropped if d.allowed] == ["MPT support is removed downstream"]

    with allow.open("a", encoding="utf-8") as fh:
        fh.write(
            '\n[[dropped]]\nfile = "src/llama-model.cpp"\nfunction = "llama_model_rope_type"\n'
            'case = "LLM_ARCH_BLOOM"\nreason = "and BLOOM"\n'
            '\n[[dropped]]\nfile = "src/llama-model.cpp"\nfunction = "llama_model_has_encoder"\n'
            'case = "LLM_ARCH_T5ENCODER"\nreason = "stale: nothing drops it"\n'
        )
    report = parity.run_parity(settings, console=QUIET)
    assert report.ok
    assert [a.case for a in report.stale_allowlist] == ["LLM_ARCH_T5ENCODER"]
    assert parity_main(project.env, root=project.root, json=False) == 0


def test_allowlist_needs_a_reason(project: Project) -> None:
    arch_upstream(project)
    settings = project.settings()
    (settings.patch_dir / "parity-allowlist.toml").write_text(
        '[[dropped]]\nfile = "src/llama-model.cpp"\nfunction = "f"\ncase = "LLM_ARCH_MPT"\n', encoding="utf-8"
    )
    with pytest.raises(QueueError, match="allowlist") as info:
        parity.run_parity(settings, console=QUIET)
    assert "reason" in (info.value.details or "")


def test_a_case_moved_to_another_function_is_a_drop_there(project: Project) -> None:
    base = arch_upstream(project)
    moved = (
        "core: encoder check moves",
        {
            "src/llama-model.cpp": (
                "        case LLM_ARCH_T5ENCODER: return true;\n",
                "",
            )
        },
    )
    queue_core(project, chain_patches(project, base, [moved]), ["core-encoder-check-moves"])
    report = parity.run_parity(project.settings(), console=QUIET)
    assert [(d.scope, d.case) for d in report.failures] == [("llama_model_has_encoder", "LLM_ARCH_T5ENCODER")]


def test_table_entries_are_audited(project: Project) -> None:
    base = arch_upstream(project)
    drop = (
        "core: no bloom name",
        {"src/llama-arch.cpp": ('    { LLM_ARCH_BLOOM,            "bloom"            },\n', "")},
    )
    queue_core(project, chain_patches(project, base, [drop]), ["core-no-bloom-name"])
    report = parity.run_parity(project.settings(), console=QUIET)
    assert [(d.kind, d.scope, d.case) for d in report.failures] == [("table", "LLM_ARCH_NAMES", "LLM_ARCH_BLOOM")]


def test_cleanup_patch_warns_naming_the_patch_it_fixes(project: Project) -> None:
    base = arch_upstream(project)
    fixup = ("core: fix the hook", {"src/llama-model.cpp": ("    trace(res);\n", "    trace(res, 1);\n")})
    upstream_edit = (
        "core: gemma rope",
        {
            "src/llama-model.cpp": (
                "        case LLM_ARCH_GEMMA3:\n            return LLAMA_ROPE",
                "        case LLM_ARCH_GEMMA3: // rope\n            return LLAMA_ROPE",
            )
        },
    )
    patches = chain_patches(project, base, [ADD_HOOK, upstream_edit, fixup])
    queue_core(project, patches, ["core-add-a-hook-point", "core-gemma-rope", "core-fix-the-hook"])
    report = parity.run_parity(project.settings(), console=QUIET)
    assert report.ok
    assert [(w.patch, w.introduced_by) for w in report.boundary] == [
        ("core/0003-core-fix-the-hook.patch", ("core/0001-core-add-a-hook-point.patch",))
    ]
    # the gemma edit rewrites an upstream line: it is listed as a deletion, and is no clean-up
    assert [d.patch for d in report.deletions] == ["core/0002-core-gemma-rope.patch"]


def test_parity_json_report(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    arch_upstream(project)
    assert parity_main(project.env, root=project.root, json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    assert data["upstream"]["switches"] == SWITCHES
    assert data["upstream"]["cases"] == CASES
