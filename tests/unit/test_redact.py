"""A token inside a URL never reaches the console, a JSON report or an error message
(issue "Hostile input, round 3", item 5): one redaction, applied where skippy prints."""

from __future__ import annotations

import io
import json

from skippy.core.errors import CommandError, NetworkError
from skippy.core.redact import redact_url, redact_urls
from skippy.core.ui import Console, print_json

SECRET = "ghs_s3cr3tT0ken"  # noqa: S105 - a fake token the tests check is never shown
URL = f"https://x-access-token:{SECRET}@github.com/org/llama.cpp.git"


def test_redact_urls_masks_the_user_info_of_every_url_in_a_text() -> None:
    assert redact_url(URL) == "https://***@github.com/org/llama.cpp.git"
    text = (
        f"fatal: unable to access '{URL}/': Could not resolve host\n"
        f"$ git clone --no-checkout -- {URL} partial\n"
        f"fetch master from https://{SECRET}@example.com/x.git, then (ssh://git:{SECRET}@host:22/r)"
    )
    assert redact_urls(text) == (
        "fatal: unable to access 'https://***@github.com/org/llama.cpp.git/': Could not resolve host\n"
        "$ git clone --no-checkout -- https://***@github.com/org/llama.cpp.git partial\n"
        "fetch master from https://***@example.com/x.git, then (ssh://***@host:22/r)"
    )
    plain = "clone https://github.com/ggml-org/llama.cpp.git into /a@b/c (user@host: no scheme)"
    assert redact_urls(plain) == plain


def test_the_console_masks_info_warnings_details_and_errors() -> None:
    out = io.StringIO()
    console = Console(env={}, stream=out, verbose=True)
    console.info(f"cloning {URL}")
    console.warn(f"clone {URL} failed (attempt 1/2); retrying in 0 s")
    console.command(f"$ git clone -- {URL} p")
    console.error(f"error: could not clone {URL}")
    github = io.StringIO()
    Console(env={"GITHUB_ACTIONS": "true"}, stream=github).error(f"error: {URL}\nmore {URL}")
    shown = out.getvalue() + github.getvalue()
    assert SECRET not in shown
    assert shown.count("https://***@github.com/org/llama.cpp.git") == 6


def test_errors_and_json_reports_are_masked_where_they_are_rendered() -> None:
    failed = CommandError(f"git clone {URL} failed", argv=("git", "clone", "--", URL), returncode=128)
    error = NetworkError(
        f"could not clone {URL}", details=failed.details, untouched=f"{URL}: nothing", next_step=f"check {URL}"
    )
    assert SECRET not in error.render()
    assert SECRET not in json.dumps(error.as_dict())
    assert error.as_dict()["next"] == "check https://***@github.com/org/llama.cpp.git"
    assert error.what == f"could not clone {URL}", "the exception itself keeps the value (for the code)"
    stream = io.StringIO()
    print_json({"ok": True, "upstream": URL, "nested": {"urls": [URL]}}, stream)
    report = json.loads(stream.getvalue())
    assert report == {
        "ok": True,
        "upstream": "https://***@github.com/org/llama.cpp.git",
        "nested": {"urls": ["https://***@github.com/org/llama.cpp.git"]},
    }


def test_names_and_values_read_from_a_file_are_shown_short_and_masked() -> None:
    from skippy.core.redact import EXCERPT_LIMIT, name_excerpt, value_excerpt

    assert name_excerpt("0001-core-fix.patch") == "0001-core-fix.patch"
    long_name = "x" * 200
    assert name_excerpt(long_name).endswith("...'") and len(name_excerpt(long_name)) <= EXCERPT_LIMIT + 5
    assert value_excerpt("gemma3") == "'gemma3'"
    assert value_excerpt(1) == "1"
    assert value_excerpt(["a"]) == "['a']"
    secret = value_excerpt("API_TOKEN=hunter2hunter2")
    assert "hunter2" not in secret and "API_TOKEN=" in secret
    listed = value_excerpt(["GITHUB_TOKEN=abcdef123456", "y" * 300])
    assert "abcdef123456" not in listed and len(listed) <= EXCERPT_LIMIT + 5
