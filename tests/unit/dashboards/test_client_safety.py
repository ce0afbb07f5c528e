"""The dashboard's edges: user text cannot become Markdown, path segments cannot change
the route, and the API allow-list is what the operator configured."""

from __future__ import annotations

import html
import re

import httpx
import pytest
from markdown_it import MarkdownIt

from ablab.dashboards.client import ApiClient, ApiError, allowed_api_urls, segment
from ablab.dashboards.format import WORD_JOINER, experiments_table, md_escape

HOSTILE = [
    "![tracker](http://127.0.0.1:9/pixel.png)",
    "[click me](javascript:alert(1))",
    "<img src=x onerror=alert(1)> <b>bold</b>",
    "**bold** _it_ `code` ~~gone~~",
    "# heading\n- list\n1. item",
    "$x^2$ and :red[colour] and :material/home:",
    "a\\*b \\![x](y) &lt; &amp;",
    "<http://127.0.0.1:9/autolink>",
    "| a | b |\n|---|---|",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_renders_as_itself_in_commonmark(text: str) -> None:
    rendered = MarkdownIt("commonmark").enable("table").enable("strikethrough").render(md_escape(text))
    assert not re.search(r"<(img|a|b|em|strong|code|h\d|ul|ol|li|table|del|s)\b", rendered), rendered
    plain = html.unescape(re.sub(r"</?p>", "", rendered)).strip().replace(WORD_JOINER, "")  # invisible
    assert plain == " ".join(text.split("\n")).strip()


# Streamlit's Markdown is react-markdown with remark-gfm, whose autolink literals are found
# by mdast-util-gfm-autolink-literal in each text node's value, after backslash escapes are
# resolved (Streamlit 1.67 bundles these two expressions; 2.1 keeps the same triggers).
_GFM_URL = re.compile(r"(https?://|www(?=\.))([-.\w]+)([^ \t\r\n]*)", re.IGNORECASE | re.ASCII)
_GFM_EMAIL = re.compile(r"([-.\w+]+)@([-\w]+(?:\.[-\w]+)+)", re.ASCII)
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")
BARE = [
    "http://127.0.0.1:9/pixel.png",
    "see https://evil.example.com/login now",
    "HTTPS://EVIL.EXAMPLE.COM",
    "www.evil.example.com",
    "a.www.evil.example.com and WwW.evil.example.com",
    "owner: bob@evil.example.com",
    "mailto:bob+x@sub.evil.co.uk",
    "x:https://e.example https://https://e.example",
]


def _text_node(markdown: str) -> str:
    """The value remark gives the text node of escaped, single-line Markdown."""
    return _ESCAPED.sub(r"\1", markdown)


@pytest.mark.parametrize("text", BARE)
def test_bare_urls_and_addresses_do_not_become_links(text: str) -> None:
    assert _GFM_URL.search(text) or _GFM_EMAIL.search(text)  # what remark-gfm would link
    shown = _text_node(md_escape(text))
    # Escaping alone leaves these triggers in the text node; the joiner breaks each one.
    assert not _GFM_URL.search(shown) and not _GFM_EMAIL.search(shown), shown
    assert not re.search(r"https?:|www\.|@[-\w]", shown, re.IGNORECASE | re.ASCII)
    assert shown.replace(WORD_JOINER, "") == text  # reads as typed


def test_text_without_a_link_trigger_gets_no_joiner() -> None:
    for text in ("demo-serving", "Latency v1.2: fast", "wwwx.example", "http-cache", "a.b.example"):
        assert WORD_JOINER not in md_escape(text)


def test_path_segments_are_quoted() -> None:
    assert segment("factorial") == "factorial"
    assert segment("a/b?c#d%e f") == "a%2Fb%3Fc%23d%25e%20f"
    assert segment("..") == "%2E%2E" and segment(".") == "%2E"


def test_the_client_never_lets_a_key_change_the_route() -> None:
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(404, json={"detail": "no"})

    client = ApiClient("http://api.test", "t", transport=httpx.MockTransport(handler))
    for call in (lambda k: client.get_experiment(k), lambda k: client.results(k), lambda k: client.lifecycle(k, "start")):
        with pytest.raises(ApiError):
            call("../keys?x=1#y")
    assert seen == [b"/v1/experiments/..%2Fkeys%3Fx%3D1%23y", b"/v1/experiments/..%2Fkeys%3Fx%3D1%23y/results",
                    b"/v1/experiments/..%2Fkeys%3Fx%3D1%23y/start"]


def test_allowed_api_urls_are_the_configured_ones() -> None:
    assert allowed_api_urls("http://127.0.0.1:8000/") == ["http://127.0.0.1:8000"]
    assert allowed_api_urls("http://a:1", ["http://b:2/", " ", "http://a:1"]) == ["http://a:1", "http://b:2"]


def test_archived_experiments_are_marked_in_the_list() -> None:
    table = experiments_table([{"key": "k", "status": "stopped", "archived_at": "2026-01-01T00:00:00Z"},
                               {"key": "j", "status": "draft"}])
    assert table["Status"].tolist() == ["⚫ stopped · 🗄️ archived", "⚪ draft"]
