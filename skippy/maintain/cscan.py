"""A text-based scanner for the arch dispatch of llama.cpp's C++ sources (no compiler).

It finds every ``switch`` whose case labels are ``LLM_ARCH_*`` (``switch (arch)``,
``switch (model->arch)`` ...), the function that encloses it, and every table
initializer keyed by ``LLM_ARCH_*`` (``LLM_ARCH_NAMES = { { LLM_ARCH_LLAMA, "llama" }, ... }``).

How: comments, string and character literals and preprocessor lines are
masked with spaces (offsets and line numbers kept); where the branches of an
``#if``/``#elif``/``#else`` group do not each balance their braces (``#if A
if (x) { #else if (y) { #endif``), only the first branch is kept, so the
braces stay paired as the compiler would see them; one pass over the braces
then classifies every ``{`` by the text before it (its *header*, back to the
previous ``;``, ``{`` or ``}`` outside parentheses): a switch body, a function
body (``name(...)`` followed by qualifiers or a constructor's initializer
list), a class body, a table initializer (``... = {``), or a plain block.
Pure functions, no I/O.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

ARCH_PREFIX = "LLM_ARCH_"

_TOKEN = re.compile(
    r"(?P<open>\{)|(?P<close>\})|(?P<semi>;)|(?P<lp>\()|(?P<rp>\))"
    r"|(?P<case>\bcase\s+(?:llm_arch\s*::\s*)?(?P<carch>LLM_ARCH_\w+)\s*:(?!:))"
    r"|(?P<arch>\bLLM_ARCH_\w+)"
)
_CONTROL = frozenset(
    {
        "if",
        "for",
        "while",
        "switch",
        "catch",
        "return",
        "sizeof",
        "alignof",
        "decltype",
        "static_assert",
        "defined",
        "throw",
        "new",
        "delete",
        "co_return",
        "typeid",
    }
)
_CALL = re.compile(r"(?P<name>(?:[A-Za-z_]\w*\s*::\s*)*(?:operator\s*(?:\(\s*\)|[^\s(]+)|~?[A-Za-z_]\w*))\s*\(")
_QUALIFIERS = re.compile(
    r"^\s*(?:(?:const|override|final|noexcept|mutable|volatile|&&|&|->[^{;:]*)\s*)*(?::.*)?$", re.S
)
_SWITCH = re.compile(r"\bswitch\s*\((?P<expr>.*)\)\s*$", re.S)
_CLASS = re.compile(r"\b(?:struct|class|union)\s+(?:\[\[[^\]]*\]\]\s*)?(?P<name>[A-Za-z_]\w*)")
_LAMBDA = re.compile(r"\]\s*(?:\(|mutable\b|->|$)")


@dataclass(frozen=True)
class ArchSwitch:
    path: str
    function: str
    line: int
    subject: str
    cases: tuple[str, ...]


@dataclass(frozen=True)
class ArchTable:
    path: str
    name: str
    line: int
    entries: tuple[str, ...]


@dataclass(frozen=True)
class FileScan:
    path: str
    switches: tuple[ArchSwitch, ...] = ()
    tables: tuple[ArchTable, ...] = ()

    def counts(self) -> dict[tuple[str, str, str], Counter[str]]:
        """(kind, path, scope) -> how often each arch appears there ("switch" scope: the function)."""
        out: dict[tuple[str, str, str], Counter[str]] = {}
        for sw in self.switches:
            out.setdefault(("switch", self.path, sw.function), Counter()).update(sw.cases)
        for table in self.tables:
            out.setdefault(("table", self.path, table.name), Counter()).update(table.entries)
        return out

    @property
    def case_count(self) -> int:
        return sum(len(s.cases) for s in self.switches)

    @property
    def entry_count(self) -> int:
        return sum(len(t.entries) for t in self.tables)


def mask(text: str) -> str:
    """``text`` with comments, literals' contents and preprocessor lines blanked (newlines kept)."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True
    directives: list[tuple[int, int, str]] = []

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":
            j = i
            while j < n:
                if text[j] == "\n" and (j == 0 or text[j - 1] != "\\"):
                    break
                j += 1
            word = re.match(r"#\s*(\w*)", text[i:j])
            directives.append((i, j, word.group(1) if word else ""))
            blank(i, j)
            i = j
            continue
        line_start = False
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
            continue
        if c == '"':
            raw = re.match(r"(?:u8|[uUL])?R$", text[max(0, i - 3) : i]) is not None
            if raw:
                m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
                if m:
                    end = text.find(")" + m.group(1) + '"', i)
                    end = n if end < 0 else end + len(m.group(1)) + 2
                    blank(i + 1, end - 1)
                    i = end
                    continue
            j = i + 1
            while j < n and text[j] not in '"\n':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
            continue
        if c == "'":
            prev = text[i - 1] if i else ""
            if prev.isalnum() and i + 1 < n and text[i + 1].isalnum() and not prev.isalpha():
                i += 1  # a digit separator (1'000)
                continue
            j = i + 1
            while j < n and text[j] not in "'\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
            continue
        i += 1
    _keep_first_unbalanced_branch(out, directives, blank)
    return "".join(out)


def _keep_first_unbalanced_branch(
    out: list[str], directives: list[tuple[int, int, str]], blank: Callable[[int, int], None]
) -> None:
    """Blank the later branches of each conditional group whose branches do not all balance their braces.

    Groups close innermost first, so an inner group is settled before the branch holding it is counted.
    """
    groups: list[list[tuple[int, int]]] = []  # per open #if: the branches' (start, end) so far
    starts: list[int] = []  # where the current branch of each open #if began
    for start, end, word in directives:
        if word in ("if", "ifdef", "ifndef"):
            groups.append([])
            starts.append(end)
        elif word in ("elif", "else", "elifdef", "elifndef") and groups:
            groups[-1].append((starts[-1], start))
            starts[-1] = end
        elif word == "endif" and groups:
            branches = [*groups.pop(), (starts.pop(), start)]
            if len(branches) > 1 and any(_brace_delta(out[a:b]) for a, b in branches):
                for a, b in branches[1:]:
                    blank(a, b)


def _brace_delta(chars: list[str]) -> int:
    return chars.count("{") - chars.count("}")


@dataclass
class _Block:
    kind: str  # switch | function | class | table | init | namespace | block
    name: str
    start: int
    parent: _Block | None
    saved_parens: int
    cases: list[str] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)

    def function(self) -> str | None:
        block: _Block | None = self
        while block is not None:
            if block.kind == "function":
                return block.name
            block = block.parent
        return None

    def classes(self) -> list[str]:
        names: list[str] = []
        block = self.parent
        while block is not None:
            if block.kind == "class":
                names.append(block.name)
            block = block.parent
        return names[::-1]


def classify(header: str, *, in_parens: bool, parent: _Block | None) -> tuple[str, str]:
    """(kind, name) of a block from the text before its ``{`` (masked, one statement)."""
    text = " ".join(header.split())
    if in_parens or (parent is not None and parent.kind in ("table", "init")):
        return "init", ""
    if not text:
        return "block", ""
    if text.endswith((",", "(", "?", "[")) or re.search(r"\breturn$", text):
        return "init", ""
    if text.endswith(":") and not text.endswith("::"):
        return "block", ""  # a label: case X:, default:, public:
    m = _SWITCH.search(text)
    if m and _balanced(m.group("expr")):
        return "switch", m.group("expr").strip()
    if text.endswith("="):
        names = re.findall(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*=$", text)
        return "table", names[-1] if names else ""
    if re.match(r"^(?:inline\s+)?namespace\b", text):
        return "namespace", text.split()[-1] if len(text.split()) > 1 else ""
    if re.search(r"\benum\b", text):
        return "enum", ""
    if _LAMBDA.search(text):
        return "block", ""
    for m in _CALL.finditer(text):
        name = re.sub(r"\s+", "", m.group("name"))
        if name.split("::")[-1] in _CONTROL:
            return "block", ""
        if _depth_at(text, m.start()) != 0:
            continue
        close = _matching_paren(text, m.end() - 1)
        if close is None:
            return "block", ""
        rest = text[close + 1 :]
        if _QUALIFIERS.match(rest):
            return "function", name
        return "block", ""
    cm = _CLASS.search(text)
    if cm and "(" not in text:
        return "class", cm.group("name")
    # `Type name{...}` / `Type name[] {` brace initializers
    at_scope = parent is None or parent.kind in ("namespace", "class")
    if at_scope and re.search(r"[A-Za-z_]\w*\s*(?:\[[^\]]*\]\s*)*$", text):
        words = re.findall(r"[A-Za-z_]\w*", text)
        if len(words) >= 2 and words[-1] not in ("else", "do", "try", "const", "override", "noexcept"):
            return "table", words[-1]
    return "block", ""


def _balanced(expr: str) -> bool:
    depth = 0
    for c in expr:
        depth += c == "("
        depth -= c == ")"
        if depth < 0:
            return False
    return depth == 0


def _depth_at(text: str, pos: int) -> int:
    return text.count("(", 0, pos) - text.count(")", 0, pos)


def _matching_paren(text: str, open_pos: int) -> int | None:
    depth = 0
    for k in range(open_pos, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return None


def scan(path: str, text: str) -> FileScan:
    """Every arch switch (with its enclosing function) and arch-keyed table of one C++ source."""
    masked = mask(text)
    newlines = [k for k, c in enumerate(masked) if c == "\n"]

    def line_of(pos: int) -> int:
        return bisect.bisect_left(newlines, pos) + 1

    switches: list[ArchSwitch] = []
    tables: list[ArchTable] = []
    stack: list[_Block] = []
    parens = 0
    boundary = 0  # offset after the last statement boundary outside parentheses
    for m in _TOKEN.finditer(masked):
        kind = m.lastgroup
        pos = m.start()
        top = stack[-1] if stack else None
        if kind == "lp":
            parens += 1
        elif kind == "rp":
            parens = max(0, parens - 1)
        elif kind == "semi":
            if parens == 0:
                boundary = m.end()
        elif kind == "open":
            header = masked[boundary:pos]
            bkind, name = classify(header, in_parens=parens > 0, parent=top)
            if bkind == "function" and "::" not in name and top is not None:
                scopes = [b.name for b in (*_chain(top),) if b.kind == "class"][::-1]
                name = "::".join([*scopes, name])
            stack.append(_Block(bkind, name, pos, top, parens))
            parens = 0
            boundary = m.end()
        elif kind == "close":
            if not stack:
                boundary = m.end()
                continue
            block = stack.pop()
            parens = block.saved_parens
            if block.kind == "switch" and block.cases:
                switches.append(
                    ArchSwitch(
                        path, block.function() or "<file scope>", line_of(block.start), block.name, tuple(block.cases)
                    )
                )
            elif block.kind == "table" and block.entries:
                tables.append(ArchTable(path, _table_name(block), line_of(block.start), tuple(block.entries)))
            boundary = m.end()
        elif kind == "case":
            switch = next((b for b in _chain(top) if b.kind == "switch"), None) if top else None
            if switch is not None:
                switch.cases.append(m.group("carch"))
            boundary = m.end()
        elif kind == "arch" and top is not None:
            table = _table_root(top)
            if table is None:
                continue
            # a key: the first token of its braces, or an element of the table's own list
            first = not masked[top.start + 1 : pos].strip()
            if top is table or first:
                table.entries.append(m.group("arch"))
    switches.sort(key=lambda s: s.line)
    tables.sort(key=lambda t: t.line)
    return FileScan(path, tuple(switches), tuple(tables))


def _chain(block: _Block | None) -> list[_Block]:
    out: list[_Block] = []
    while block is not None:
        out.append(block)
        block = block.parent
    return out


def _table_root(block: _Block) -> _Block | None:
    for b in _chain(block):
        if b.kind == "table":
            return b
        if b.kind != "init":
            return None
    return None


def _table_name(block: _Block) -> str:
    function = block.function()
    name = block.name or f"<table at offset {block.start}>"
    return f"{function}::{name}" if function else name


def arch_names(text: str) -> dict[str, str]:
    """``LLM_ARCH_X -> "name"`` from llama-arch.cpp's name table (raw text, literals intact)."""
    return dict(re.findall(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]*)\"\s*\}", text))
