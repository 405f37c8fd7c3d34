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
            j = _directive_end(text, i)
            word = re.match(r"#\s*(\w*)", text[i:j])
            directives.append((i, j, word.group(1) if word else ""))
            blank(i, j)
            i = j
            continue
        line_start = False
        span = _masked_span(text, i)
        if span is None:
            i += 1
            continue
        a, b, i = span
        blank(a, b)
    _keep_first_unbalanced_branch(out, directives, blank)
    return "".join(out)


def _directive_end(text: str, i: int) -> int:
    """Where the preprocessor line starting at ``i`` ends (its newline; backslash continuations included)."""
    j = i
    while j < len(text):
        if text[j] == "\n" and (j == 0 or text[j - 1] != "\\"):
            break
        j += 1
    return j


def _masked_span(text: str, i: int) -> tuple[int, int, int] | None:
    """For a comment or literal starting at ``i``: (blank from, blank to, resume at); None for any other text."""
    c = text[i]
    if c == "/" and text.startswith("//", i):
        j = text.find("\n", i)
        j = len(text) if j < 0 else j
        return i, j, j
    if c == "/" and text.startswith("/*", i):
        j = text.find("*/", i + 2)
        j = len(text) if j < 0 else j + 2
        return i, j, j
    if c == '"':
        return _raw_string_span(text, i) or _quoted_span(text, i, '"')
    if c == "'":
        prev = text[i - 1] if i else ""
        if prev.isalnum() and i + 1 < len(text) and text[i + 1].isalnum() and not prev.isalpha():
            return None  # a digit separator (1'000)
        return _quoted_span(text, i, "'")
    return None


def _raw_string_span(text: str, i: int) -> tuple[int, int, int] | None:
    """The contents of a raw string literal (``R"delim(...)delim"``) whose quote is at ``i``."""
    if re.match(r"(?:u8|[uUL])?R$", text[max(0, i - 3) : i]) is None:
        return None
    m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
    if not m:
        return None
    end = text.find(")" + m.group(1) + '"', i)
    end = len(text) if end < 0 else end + len(m.group(1)) + 2
    return i + 1, end - 1, end


def _quoted_span(text: str, i: int, quote: str) -> tuple[int, int, int]:
    """The contents of a string or character literal opened at ``i`` (ends at its quote or the line's end)."""
    stop = quote + "\n"
    j = i + 1
    while j < len(text) and text[j] not in stop:
        j += 2 if text[j] == "\\" else 1
    return i + 1, j, j + 1


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
    """(kind, name) of a block from the text before its ``{`` (masked, one statement).

    The rules are tried in order; the first that recognises the header decides.
    """
    text = " ".join(header.split())
    if in_parens or (parent is not None and parent.kind in ("table", "init")):
        return "init", ""
    return (
        _by_punctuation(text) or _by_keyword(text) or _by_call(text) or _by_declaration(text, parent) or ("block", "")
    )


def _by_punctuation(text: str) -> tuple[str, str] | None:
    """An empty header, an expression still open (``f(a, {``, ``return {``) or a label."""
    if not text:
        return "block", ""
    if text.endswith((",", "(", "?", "[")) or re.search(r"\breturn$", text):
        return "init", ""
    if text.endswith(":") and not text.endswith("::"):
        return "block", ""  # a label: case X:, default:, public:
    return None


def _by_keyword(text: str) -> tuple[str, str] | None:
    """A switch, an assignment's initializer, a namespace, an enum or a lambda body."""
    m = _SWITCH.search(text)
    if m and _balanced(m.group("expr")):
        return "switch", m.group("expr").strip()
    if text.endswith("="):
        names = re.findall(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*=$", text)
        return "table", names[-1] if names else ""
    if re.match(r"^(?:inline\s+)?namespace\b", text):
        words = text.split()
        return "namespace", words[-1] if len(words) > 1 else ""
    if re.search(r"\benum\b", text):
        return "enum", ""
    if _LAMBDA.search(text):
        return "block", ""
    return None


def _by_call(text: str) -> tuple[str, str] | None:
    """The first ``name(...)`` outside parentheses: a function definition, or a control statement's block."""
    for m in _CALL.finditer(text):
        name = re.sub(r"\s+", "", m.group("name"))
        if name.split("::")[-1] in _CONTROL:
            return "block", ""
        if _depth_at(text, m.start()) != 0:
            continue
        close = _matching_paren(text, m.end() - 1)
        if close is None:
            return "block", ""
        if _QUALIFIERS.match(text[close + 1 :]):
            return "function", name
        return "block", ""
    return None


def _by_declaration(text: str, parent: _Block | None) -> tuple[str, str] | None:
    """A class body, or a ``Type name{...}`` / ``Type name[] {`` brace initializer at namespace or class scope."""
    cm = _CLASS.search(text)
    if cm and "(" not in text:
        return "class", cm.group("name")
    at_scope = parent is None or parent.kind in ("namespace", "class")
    if at_scope and re.search(r"[A-Za-z_]\w*\s*(?:\[[^\]]*\]\s*)*$", text):
        words = re.findall(r"[A-Za-z_]\w*", text)
        if len(words) >= 2 and words[-1] not in ("else", "do", "try", "const", "override", "noexcept"):
            return "table", words[-1]
    return None


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
    walk = _Walk(path, mask(text))
    for m in _TOKEN.finditer(walk.masked):
        walk.token(m)
    walk.switches.sort(key=lambda s: s.line)
    walk.tables.sort(key=lambda t: t.line)
    return FileScan(path, tuple(walk.switches), tuple(walk.tables))


@dataclass
class _Walk:
    """The one pass over the braces of a masked source: the open blocks and what was found so far."""

    path: str
    masked: str
    switches: list[ArchSwitch] = field(default_factory=list)
    tables: list[ArchTable] = field(default_factory=list)
    stack: list[_Block] = field(default_factory=list)
    parens: int = 0
    boundary: int = 0  # offset after the last statement boundary outside parentheses
    newlines: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.newlines = [k for k, c in enumerate(self.masked) if c == "\n"]

    def line_of(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def token(self, m: re.Match[str]) -> None:
        kind = m.lastgroup
        if kind == "lp":
            self.parens += 1
        elif kind == "rp":
            self.parens = max(0, self.parens - 1)
        elif kind == "semi":
            if self.parens == 0:
                self.boundary = m.end()
        elif kind == "open":
            self.open_block(m)
        elif kind == "close":
            self.close_block(m)
        elif kind == "case":
            self.case(m)
        elif kind == "arch":
            self.arch(m)

    def open_block(self, m: re.Match[str]) -> None:
        pos = m.start()
        top = self.stack[-1] if self.stack else None
        bkind, name = classify(self.masked[self.boundary : pos], in_parens=self.parens > 0, parent=top)
        if bkind == "function" and "::" not in name and top is not None:
            scopes = [b.name for b in (*_chain(top),) if b.kind == "class"][::-1]
            name = "::".join([*scopes, name])
        self.stack.append(_Block(bkind, name, pos, top, self.parens))
        self.parens = 0
        self.boundary = m.end()

    def close_block(self, m: re.Match[str]) -> None:
        self.boundary = m.end()
        if not self.stack:
            return
        block = self.stack.pop()
        self.parens = block.saved_parens
        if block.kind == "switch" and block.cases:
            function = block.function() or "<file scope>"
            self.switches.append(
                ArchSwitch(self.path, function, self.line_of(block.start), block.name, tuple(block.cases))
            )
        elif block.kind == "table" and block.entries:
            self.tables.append(
                ArchTable(self.path, _table_name(block), self.line_of(block.start), tuple(block.entries))
            )

    def case(self, m: re.Match[str]) -> None:
        top = self.stack[-1] if self.stack else None
        switch = next((b for b in _chain(top) if b.kind == "switch"), None) if top else None
        if switch is not None:
            switch.cases.append(m.group("carch"))
        self.boundary = m.end()

    def arch(self, m: re.Match[str]) -> None:
        if not self.stack:
            return
        top = self.stack[-1]
        table = _table_root(top)
        if table is None:
            return
        # a key: the first token of its braces, or an element of the table's own list
        first = not self.masked[top.start + 1 : m.start()].strip()
        if top is table or first:
            table.entries.append(m.group("arch"))


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
