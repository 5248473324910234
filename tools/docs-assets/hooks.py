"""mkdocs hooks (mkdocs.yml `hooks:`): a site that renders offline, and outputs you can read.

1. Mermaid ships with the site. mkdocs-material draws ```mermaid blocks with the Mermaid script, which
   it loads from unpkg.com unless `window.mermaid` is already defined (`typeof mermaid ==
   "undefined"` in its bundle). The script installed from npm (tools/docs-assets/package.json,
   pinned by its package-lock.json: `npm ci --prefix tools/docs-assets`) is copied into the site,
   and a page with a diagram loads it before material's bundle, so the CDN is never asked. Without
   the npm install the build warns (and `mkdocs build --strict` fails) instead of publishing a site
   that fetches it.
2. Program outputs wrap. An output (a ```text block, or one without a language) keeps its lines,
   but a line wider than the page wraps instead of scrolling sideways, its continuation lines
   hanging past its indentation. An `explain()` line (`setting  value  reason`) too long for the
   page shows its reason in full on the lines under its setting and value. Only the display
   changes: the characters are the program's, in order. A fence marked
   `{.no-wrap}` (an ASCII diagram) keeps scrolling. docs/assets/stylesheets/cudaload.css styles it.
"""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.cudaload")

HERE = Path(__file__).resolve().parent
MERMAID_SOURCE = HERE / "node_modules" / "@mermaid-js" / "tiny" / "dist" / "mermaid.tiny.js"
MERMAID_URL = "assets/javascripts/mermaid.tiny.js"

# A code block as pymdownx.highlight writes it; an output (```text, a bare fence) has no token spans.
OUTPUT_BLOCK = re.compile(r'<div class="highlight"><pre><span></span><code>(.*?)</code></pre></div>', re.DOTALL)
BUNDLE_SCRIPT = re.compile(r'<script src="[^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js"></script>')
# explain()'s columns are separated by two or more spaces: `setting  value  reason`, or `x value  reason` for a
# rejected option. Its columns follow the terminal it was printed in (cudaload.plans.layout), so they are found
# from the gaps, not from fixed widths; a setting is one word, a value and a reason hold no double space (a table
# of numbers has a gap between every column, and is not an explain() line).
COLUMN_GAP = re.compile(r"\S( {2,})(?=\S)")
EXPLAIN_LINE = re.compile(r"( *)(?:x |\S+ {2,})(\S+(?: \S+)*) {2,}(\S+(?: \S+)*)")
# An explain() line longer than this (about what an output block shows on a 1280-px screen) shows its
# reason on the lines under its setting and value instead of after them.
FITS = 80
# An output line indented this far or more (a continuation of the line above) has its indent in a span.indent.
INDENTED = 8


def on_files(files: Files, config: Any) -> Files:
    if MERMAID_SOURCE.is_file():
        files.append(File.generated(config, MERMAID_URL, abs_src_path=str(MERMAID_SOURCE)))
    else:
        log.warning(
            "%s is missing, so pages with a diagram would load Mermaid from unpkg.com: run "
            "`npm ci --prefix tools/docs-assets` first",
            MERMAID_SOURCE.relative_to(HERE.parents[1]),
        )
    return files


def columns(line: str) -> tuple[int, int] | None:
    """The value and reason columns of an explain() line (`setting  value  reason` or
    `x value  reason`), or None for any other line."""
    found = EXPLAIN_LINE.fullmatch(line)
    if found is None:
        return None
    value = found.start(2) - (2 if line.startswith("x ", len(found.group(1))) else 0)
    return value, found.start(3)


def hang(line: str) -> int:
    """Where a wrapped `line`'s continuation lines start (in characters).

    An explain() line: 4 past its value column, so a reason reads right of the values and the `x`
    marks, under its own setting. Another columned line: 4 past the end of its first gap. Any other
    line: 4 past its indentation. (The stylesheet caps it, lower on a phone.)
    """
    indent = len(line) - len(line.lstrip(" "))
    found = columns(line)
    if found is not None:
        return found[0] + 4
    if line.startswith("x ", indent):
        return indent + 4
    gap = COLUMN_GAP.search(line, indent)
    if gap is not None and gap.end(1) <= 60:
        return gap.end(1) + 4
    return indent + 4


def _line(line: str, newline: str) -> str:
    """One output line as a span; a long explain() line has its reason in a block under the value."""
    plain = html.unescape(line)
    found = columns(plain)
    if found is not None and len(plain) > FITS:
        head, reason = html.escape(plain[: found[1]], quote=False), html.escape(plain[found[1] :], quote=False)
        body = f'{head}<span class="reason">{reason}{newline}</span>'
    elif found is None and (indent := len(line) - len(line.lstrip(" "))) >= INDENTED:
        # A continuation line (a wrapped reason, 36 in): its indent in a span the stylesheet narrows on a phone,
        # where 36 spaces were most of a line and left one word a line at the right edge.
        body = f'<span class="indent">{line[:indent]}</span>{line[indent:]}{newline}'
    else:
        body = line + newline
    return f'<span class="output-line" style="--hang:{hang(plain)}">{body}</span>'


def wrap_outputs(content: str) -> str:
    """Each line of each output block in its own span, with its hanging indent (`--hang`)."""

    def one(block: re.Match[str]) -> str:
        if "<span" in block.group(1):  # highlighted code (Python, bash): not an output
            return block.group(0)
        lines = block.group(1).split("\n")
        ends_with_newline = lines[-1] == ""
        if ends_with_newline:
            lines.pop()
        spans = [_line(line, "\n" if i < len(lines) - 1 or ends_with_newline else "") for i, line in enumerate(lines)]
        return f'<div class="highlight output"><pre><span></span><code>{"".join(spans)}</code></pre></div>'

    return OUTPUT_BLOCK.sub(one, content)


# A command-line flag (`--random-weights`) in a code block or an output: one unit a line never splits.
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w]*(?:-[\w]+)+)")
CODE_BLOCK = re.compile(r"(<pre><span></span><code>)(.*?)(</code></pre>)", re.DOTALL)
# A name in a table cell (`AttentionUnavailableError`): it may break between its words, nowhere else.
TABLE_CODE = re.compile(r"(<td>.*?</td>)", re.DOTALL)
CAMEL_CODE = re.compile(r"<code>([A-Za-z_]\w*)</code>")


def keep_flags_whole(content: str) -> str:
    """Each hyphenated flag in a code block in a `span.flag` (no line break inside it: `white-space: nowrap`
    in the stylesheet), so a narrow screen shows `--random-weights`, never `--random-` / `weights`. The text
    is unchanged (copying the block copies the same characters)."""

    def block(found: re.Match[str]) -> str:
        # Only in text, never inside a tag (`<span class="...">`): split the code at its tags.
        parts = re.split(r"(<[^>]+>)", found.group(2))
        text = "".join(p if p.startswith("<") else FLAG.sub(r'<span class="flag">\1</span>', p) for p in parts)
        return found.group(1) + text + found.group(3)

    return CODE_BLOCK.sub(block, content)


def break_names_between_words(content: str) -> str:
    """A CamelCase name in a table cell gets a `<wbr>` between its words (AttentionUnavailableError breaks as
    Attention / Unavailable / Error on a phone, not "AttentionU / navailable"); copying it gives the name."""

    def cell(found: re.Match[str]) -> str:
        return CAMEL_CODE.sub(
            lambda m: "<code>" + re.sub(r"(?<=[a-z])(?=[A-Z])", "<wbr>", m.group(1)) + "</code>", found.group(1)
        )

    return TABLE_CODE.sub(cell, content)


# An inline code span (not a block's `<pre><span></span><code>`, not highlighted or linked: no attribute, no tag
# inside), and a table cell holding it.
INLINE_CODE = re.compile(r"(?<!<pre><span></span>)<code>([^<]+)</code>")
CELL = re.compile(r"(<t[dh][^>]*>)(.*?)(</t[dh]>)", re.DOTALL)
# A word of running text's code longer than this (about a phone's line) may break, at a <wbr> after its dots,
# slashes and underscores; a shorter one, and any in a table (which scrolls), never breaks.
WHOLE = 40


def _whole(code: str, in_table: bool) -> str:
    words = code.split(" ")
    if len(words) == 1 and (in_table or len(code) <= WHOLE):
        return f'<code class="whole">{code}</code>'

    def word(w: str) -> str:
        if not w:
            return w
        if in_table or len(w) <= WHOLE:
            return f'<span class="whole">{w}</span>'
        return re.sub(r"(?<=[./_])(?=\w)", "<wbr>", w)

    return "<code>" + " ".join(word(w) for w in words) + "</code>"


def keep_identifiers_whole(content: str) -> str:
    """Each word of an inline code span unbreakable (`white-space: nowrap` on `.whole` in the stylesheet), so a
    line breaks only between its words: `--interconnect infiniband-ndr:4` never shows `--` / `interconnect`, nor
    a table `deepspeed-` / `zero3-offload`. The text is unchanged (copying the span copies the same characters)."""
    content = CELL.sub(
        lambda c: c.group(1) + INLINE_CODE.sub(lambda m: _whole(m.group(1), True), c.group(2)) + c.group(3), content
    )
    return INLINE_CODE.sub(lambda m: _whole(m.group(1), False), content)


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    return keep_identifiers_whole(break_names_between_words(keep_flags_whole(wrap_outputs(content))))


def on_post_page(output: str, page: Any, config: Any) -> str:
    if 'class="mermaid"' not in output or not MERMAID_SOURCE.is_file():
        return output
    script = f'<script src="{get_relative_url(MERMAID_URL, page.url)}"></script>'
    bundle = BUNDLE_SCRIPT.search(output)
    if bundle is None:
        log.warning("%s: material's bundle script was not found; Mermaid is not loaded first", page.file.src_uri)
        return output
    # Before the bundle: defined by the time material looks for `mermaid`, so it never fetches one.
    return output[: bundle.start()] + script + output[bundle.start() :]
