"""One redaction for everything skippy shows: the credentials inside URLs.

A URL such as ``https://x-access-token:SECRET@github.com/org/llama.cpp.git`` (an
``LLAMA_UPSTREAM_URL`` on CI) or ``redis://:SECRET@cache:6379`` is used as given for the real
call (git, sccache) but printed, written to reports and put into error messages as
``https://***@github.com/org/llama.cpp.git``: the user info is dropped whole (a token is often
the user name), and query values whose names look secret (``token=``, ``X-Amz-Signature=``)
become ``***``.  The console, the JSON reports and the rendered errors call
:func:`redact_urls` once, where they print (:mod:`skippy.core.ui`).
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit, urlunsplit

_SECRET_WORDS: Final = ("pass", "token", "secret", "key_id", "access_key", "auth", "credential", "sig")
MASK: Final = "***"


def redact_url(url: str) -> str:
    """``url`` without its credentials: user info and secret-looking query values become ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = []
        for piece in query.split("&"):
            name, sep, val = piece.partition("=")
            secret = any(word in name.lower() for word in _SECRET_WORDS)
            pairs.append(f"{name}{sep}{MASK if secret and sep else val}")
        query = "&".join(pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_urls(text: str) -> str:
    """``text`` with the user info (user name and password or token) of every
    ``scheme://user:pass@host`` in it masked: what skippy prints and writes goes through this."""
    if "://" not in text:
        return text
    out: list[str] = []
    for token in _split_keep(text):
        out.append(redact_url(token) if "://" in token and ("@" in token or "?" in token) else token)
    return "".join(out)


def _split_keep(text: str) -> list[str]:
    """``text`` split into whitespace/quote/comma-separated tokens, separators kept."""
    tokens: list[str] = []
    current: list[str] = []
    for ch in text:
        if ch.isspace() or ch in "\"',;()[]{}<>":
            if current:
                tokens.append("".join(current))
                current = []
            tokens.append(ch)
        else:
            current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


#: the most characters of a file's own text an error message quotes
EXCERPT_LIMIT: Final = 48
#: what separates the words of a line in :func:`excerpt` (``/proc/*/environ`` separates with NUL)
_EXCERPT_SEPARATORS: Final = re.compile(r"([\s\x00-\x1f\"',;()\[\]{}<>]+)")


def excerpt(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """A short, quoted excerpt of ``text`` (a line read from a file) for an error message.

    At most ``limit`` characters of it are shown (``...`` says more was cut), control
    characters escaped, URL credentials masked, and the value of any ``NAME=value`` whose
    name looks secret (``GITHUB_TOKEN=...``) replaced by ``***``: a message names what is
    wrong with a line, it never copies a file out.
    """
    words = _EXCERPT_SEPARATORS.split(redact_urls(text))
    for i, word in enumerate(words):
        name, sep, _value = word.partition("=")
        if sep and any(secret in name.lower() for secret in _SECRET_WORDS):
            words[i] = f"{name}={MASK}"
    shown = "".join(words)
    quoted = repr(shown[:limit])
    return f"{quoted[:-1]}...{quoted[-1]}" if len(shown) > limit else quoted


_PLAIN_NAME: Final = re.compile(r"^[A-Za-z0-9._+-]{1,64}$")


def name_excerpt(name: str) -> str:
    """A name read from a file (a series entry, a TOML key) as a message shows it: a plain
    name as it is, anything else as a short :func:`excerpt`."""
    return name if _PLAIN_NAME.match(name) else excerpt(name)


def value_excerpt(value: object) -> str:
    """A value read from a file as a message shows it: a string quoted as :func:`excerpt` cuts
    and masks it, anything else as its ``repr`` (cut and masked the same way when it is long)."""
    if isinstance(value, str):
        return excerpt(value)
    text = repr(value)
    return text if len(text) <= EXCERPT_LIMIT and excerpt(text) == repr(text) else excerpt(text)
