"""The entities of a C++ source and what changed between two versions (tree-sitter, no git)."""

from __future__ import annotations

import pytest

from skippy.maintain import churn

SOURCE = b"""\
namespace ns {
struct loader {
    int n;
    int size() const { return n; }
};

enum kind { KIND_A, KIND_B };

static const std::map<kind, const char *> KIND_NAMES = {
    { KIND_A, "a" },
};

void load(int a) {
    check(a);  // first the check
    if (a) {
        call(a);
    }
    done();
}

int pick(int x) { return x; }
int pick(float x, const char * why) { return (int) x; }
}  // namespace ns

loader::loader() : n(1) { init(); }
"""


def test_entities_are_named_by_scope_and_overloads_by_parameter_types() -> None:
    found = churn.entities(SOURCE)
    assert {name: e.kind for name, e in found.items()} == {
        "ns::loader": "type",
        "ns::loader::size": "function",
        "ns::kind": "enum",
        "ns::KIND_NAMES": "table",
        "ns::load": "function",
        "ns::pick(int)": "function",
        "ns::pick(float, const char *)": "function",
        "loader::loader": "function",
    }
    assert found["ns::load"].line == 13


def changed(old: bytes, new: bytes) -> dict[str, str]:
    return churn.changed_entities(churn.entities(old), churn.entities(new))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # comments and spacing are not changes
        (b"    check(a);  // first the check\n", b"    check( a );\n", {}),
        (
            b"    check(a);  // first the check\n    if (a) {\n        call(a);\n    }\n",
            b"    if (a) {\n        call(a);\n    }\n    check(a);\n",
            {"ns::load": "statements reordered"},
        ),
        (b"    done();\n", b"    done();\n    log();\n", {"ns::load": "body edited"}),
        (b"void load(int a) {", b"void load(long a) {", {"ns::load": "signature changed"}),
        (b": n(1) {", b": n(2) {", {"loader::loader": "signature changed"}),
        (b'{ KIND_A, "a" },', b'{ KIND_A, "a" }, { KIND_B, "b" },', {"ns::KIND_NAMES": "body edited"}),
        (b"KIND_A, KIND_B }", b"KIND_A, KIND_B, KIND_C }", {"ns::kind": "body edited"}),
        # a member function's body is its own entity, not its type's
        (b"return n; }", b"return n + 0; }", {"ns::loader::size": "body edited"}),
        (b"    int n;\n", b"    int n;\n    int m;\n", {"ns::loader": "body edited"}),
        (
            b"int pick(int x) { return x; }\n",
            b"",
            {"ns::pick": "added", "ns::pick(int)": "deleted", "ns::pick(float, const char *)": "deleted"},
        ),
    ],
)
def test_what_changed(old: bytes, new: bytes, expected: dict[str, str]) -> None:
    assert old in SOURCE
    assert changed(SOURCE, SOURCE.replace(old, new, 1)) == expected


def test_a_repeated_statement_added_is_an_edit_not_a_reorder() -> None:
    body = b"int f(int a) {\n    ret(a);\n    step(a);\n    ret(a);\n}\n"
    more = b"int f(int a) {\n    ret(a);\n    ret(a);\n    step(a);\n    ret(a);\n}\n"
    assert changed(body, more) == {"f": "body edited"}
    swapped = b"int f(int a) {\n    step(a);\n    ret(a);\n    ret(a);\n}\n"
    assert changed(body, swapped) == {"f": "statements reordered"}


def test_a_check_moved_into_a_branch_is_reordered() -> None:
    """Statements are compared in source order at every depth: a check moved under a condition
    runs after it now, the silent kind of change."""
    old = b"void f(int a) {\n    check(a);\n    if (a) {\n        call(a);\n    }\n}\n"
    new = b"void f(int a) {\n    if (a) {\n        check(a);\n        call(a);\n    }\n}\n"
    assert changed(old, new) == {"f": "statements reordered"}
