"""The docs site as a reader's browser gets it: built with mkdocs (as `.ci/run` builds it), it loads
nothing from another host, draws its diagram with the Mermaid it ships, wraps program outputs and
links each benchmark chart to its full-size image.

"Loads" means what a browser fetches by itself when it shows a page, and nothing else:

- in the HTML: `<script src>`, `<link href>` (stylesheets, icons, preloads), `<img src>`/`srcset`,
  `<source>`, `<iframe>`, `<video>`/`<audio>` (and `poster`), `<embed>`, `<object data>`,
  `<track>`, `<input type=image>`, SVG `<image>`/`<use>` hrefs, `<form action>`, `url(...)` in
  `style` attributes and `<style>` elements, and a `<meta http-equiv=refresh>` target;
- in the CSS the site ships: `url(...)` and `@import`;
- in the JavaScript it ships: every absolute URL in the text. A script's URLs cannot be told apart
  statically (a URL in an error message looks like one it fetches), so each one must be listed in
  `SCRIPT_URLS` below with why this site never fetches it; a new one fails until someone looks.

Allowed, because a reader chooses to follow them or no browser fetches them: `<a href>` (text
links, such as the repository link and upstream sources), `<link rel=canonical>` (the page's
address under `site_url`, read by search engines), and URLs inside text and code blocks.

Needs the dev extras (mkdocs, mkdocs-material, mkdocstrings) and the docs' npm assets
(`npm ci --prefix tools/docs-assets`, which `.ci/run` runs before the tests); skips without them.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
HOOKS = ROOT / "tools" / "docs-assets" / "hooks.py"
MERMAID = ROOT / "tools" / "docs-assets" / "node_modules" / "@mermaid-js" / "tiny" / "dist" / "mermaid.tiny.js"

# An absolute URL (with a scheme, or protocol-relative) that points at another host.
OUTSIDE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
LOCAL_SCHEMES = ("data:", "blob:", "about:", "javascript:", "mailto:", "#")

# Every absolute URL the shipped JavaScript contains, and why the site never fetches it.
SCRIPT_URLS: dict[str, str] = {
    # mkdocs-material's bundle (assets/javascripts/bundle.*.min.js)
    "https://unpkg.com/mermaid@11/dist/mermaid.min.js": "material loads it only when `window.mermaid` is undefined; "
    "every page with a diagram loads the shipped mermaid.tiny.js first (checked below)",
    "https://unpkg.com/resize-observer-polyfill": "loaded only by a browser without ResizeObserver (every browser "
    "since 2020 has it)",
    "https://api.github.com/repos/": "the repository's stars and forks, fetched only for a "
    '`data-md-component="source"` element, which tools/docs-assets/overrides/partials/source.html removes '
    "(checked below)",
    "https://api.github.com/users/": "the same, for a user or organisation URL",
    "https://clipboardjs.com/": "clipboard.js's licence comment",
    # Mermaid's browser build (assets/javascripts/mermaid.tiny.js)
    "http://www.w3.org/": "XML namespace names (SVG, XHTML, XLink, MathML), identifiers never fetched",
    "https://chevrotain.io/": "links in the parser library's error messages",
    "https://github.com/": "links in error messages and licence comments",
    "https://lodash.com/": "licence comment",
    "https://openjsf.org/": "licence comment",
    "http://underscorejs.org": "licence comments (here and in lunr/wordcut.js)",
    "https://langium.org/": "a link in an error message",
    "https://en.wikipedia.org/": "a link in a comment",
    "http://en.wikipedia.org/": "a link in a licence comment",
    "http://": "the Markdown parser's autolink: the href it writes for a `www.` text in a diagram label (a link)",
    # The search (workers/search.*.min.js and lunr/: stemmers and segmenters, of which an English site loads
    # none): licence comments, comments and a link in a console message
    "http://lunrjs.com": "licence comment",
    "http://tartarus.org/": "licence comment (the Porter stemmer)",
    "https://bit.ly/2s3ChXG": "a link printed with the console warning for an invalid search query",
    "http://snowball.tartarus.org/": "licence comments of the language stemmers",
    "http://www.mozilla.org/MPL/": "licence comments of the language stemmers",
    "http://code.google.com/p/urim/": "licence comments of the language stemmers",
    "http://chasen.org/": "TinySegmenter's licence comment",
    "https://developer.mozilla.org/": "a comment in wordcut.js",
    "http://people.mozilla.org/": "a comment in wordcut.js",
    "http://wiki.ecmascript.org/": "a comment in wordcut.js",
    "http://wiki.commonjs.org/": "a comment in wordcut.js",
    "http://narwhaljs.org": "a comment in wordcut.js",
    "http://msdn.microsoft.com/": "a comment in wordcut.js",
    "http://docs.python.org/": "a comment in wordcut.js",
}

FETCHED_ATTRIBUTES = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "source": ("src", "srcset"),
    "iframe": ("src",),
    "frame": ("src",),
    "video": ("src", "poster"),
    "audio": ("src",),
    "track": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "image": ("href", "xlink:href"),
    "use": ("href", "xlink:href"),
    "form": ("action",),
}
# In JavaScript only scheme URLs count: a protocol-relative "//host" cannot be told from a comment or a regex.
SCRIPT_URL = re.compile(r"""https?://[\w.-]+\.[a-z]{2,}[^\s"'`)<>\\]*|https?://(?=[`"'])""")
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)


class _Fetches(HTMLParser):
    """The URLs a browser fetches by itself to show one HTML page (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name in FETCHED_ATTRIBUTES.get(tag, ()):
            if name in values:
                found = values[name]
                if name == "srcset":
                    self.urls += [part.split()[0] for part in found.split(",") if part.strip()]
                else:
                    self.urls.append(found)
        if tag == "link" and "href" in values and "canonical" not in values.get("rel", "").split():
            self.urls.append(values["href"])
        if tag == "input" and values.get("type") == "image" and "src" in values:
            self.urls.append(values["src"])
        if tag == "meta" and values.get("http-equiv", "").lower() == "refresh":
            self.urls.append(values.get("content", "").partition("url=")[2])
        if "style" in values:
            self.urls += [a or b for a, b in CSS_URL.findall(values["style"])]
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += [a or b for a, b in CSS_URL.findall(data)]


def _outside(url: str) -> bool:
    return bool(url) and not url.startswith(LOCAL_SCHEMES) and bool(OUTSIDE.match(url))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for module in ("mkdocs", "material", "mkdocstrings"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the dev extra)")
    if not MERMAID.is_file():
        pytest.skip(f"{MERMAID.relative_to(ROOT)} is missing: run `npm ci --prefix tools/docs-assets` (.ci/run does)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return out


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 14, pages  # every page of the nav, and 404.html
    return pages


def test_the_check_sees_what_a_browser_fetches_and_not_what_a_reader_follows() -> None:
    page = (
        '<link rel="canonical" href="https://example.org/page/"><link rel="stylesheet" href="https://cdn.example/a.css">'
        '<script src="//cdn.example/b.js"></script><img srcset="c.png 1x, https://img.example/c.png 2x">'
        '<div style="background: url(\'https://img.example/d.png\')"></div><style>@import "https://fonts.example/e.css";'
        '</style><a href="https://github.com/cudaload/cudaload">repository</a><p>https://text.example/ in prose</p>'
        '<img src="../assets/local.png"><script src="data:text/javascript,0"></script>'
    )
    parser = _Fetches()
    parser.feed(page)
    assert [url for url in parser.urls if _outside(url)] == [
        "https://cdn.example/a.css",
        "//cdn.example/b.js",
        "https://img.example/c.png",
        "https://img.example/d.png",
        "https://fonts.example/e.css",
    ]


def test_pages_load_nothing_from_another_host(site: Path) -> None:
    found = []
    for page in _pages(site):
        parser = _Fetches()
        parser.feed(page.read_text())
        found += [f"{page.relative_to(site)}: {url}" for url in parser.urls if _outside(url)]
    assert found == [], "pages load these from other hosts:\n" + "\n".join(found)


def test_stylesheets_import_nothing_from_another_host(site: Path) -> None:
    found = []
    for sheet in sorted(site.rglob("*.css")):
        urls = [a or b for a, b in CSS_URL.findall(sheet.read_text())]
        found += [f"{sheet.relative_to(site)}: {url}" for url in urls if _outside(url)]
    assert found == [], "stylesheets fetch these from other hosts:\n" + "\n".join(found)


def test_every_url_in_the_shipped_scripts_is_one_the_site_never_fetches(site: Path) -> None:
    scripts = sorted(site.rglob("*.js"))
    assert any(s.name == "mermaid.tiny.js" for s in scripts)
    unexplained = []
    for script in scripts:
        for url in set(SCRIPT_URL.findall(script.read_text())):
            # A bare scheme ("https://") is allowed only as itself; every other entry as a prefix.
            if not any(url == known or (not known.endswith("://") and url.startswith(known)) for known in SCRIPT_URLS):
                unexplained.append(f"{script.relative_to(site)}: {url}")
    assert unexplained == [], (
        "URLs in shipped JavaScript that SCRIPT_URLS does not explain (list each with why it is never fetched, or "
        "keep the script out of the site):\n" + "\n".join(sorted(unexplained))
    )


def test_a_page_with_a_diagram_loads_the_shipped_mermaid_before_materials_bundle(site: Path) -> None:
    diagrams = [page for page in _pages(site) if 'class="mermaid"' in page.read_text()]
    assert [p.relative_to(site).as_posix() for p in diagrams] == ["how-it-works/index.html"]
    for page in diagrams:
        text = page.read_text()
        scripts = re.findall(r'<script src="([^"]+)"', text)
        mermaid = [s for s in scripts if s.endswith("/mermaid.tiny.js")]
        bundle = [s for s in scripts if re.search(r"/bundle\.[0-9a-f]+\.min\.js$", s)]
        assert mermaid and bundle and scripts.index(mermaid[0]) < scripts.index(bundle[0]), scripts
        assert (page.parent / mermaid[0]).resolve().read_bytes() == MERMAID.read_bytes()
    # Pages without a diagram do not pay for the 2.5 MB script.
    assert 'mermaid.tiny.js"' not in (site / "index.html").read_text()


def test_no_page_links_a_repository_or_site_that_does_not_exist(site: Path) -> None:
    # No public repository or site is known (issue 38): no header link, no edit link, no canonical address.
    for page in _pages(site):
        text = page.read_text()
        assert "github.com/cudaload" not in text and "cudaload.github.io" not in text, page
        assert 'class="md-source"' not in text and 'data-md-component="source"' not in text, page


def test_outputs_wrap_with_a_hanging_indent_and_code_does_not(site: Path) -> None:
    decisions = (site / "decisions" / "index.html").read_text()
    assert 'class="highlight output"' in decisions
    # An explain() line hangs 4 past its value column; a rejected option's line 4 past its `x`.
    assert re.search(r'<span class="output-line" style="--hang:27">  attn_implementation  ', decisions)
    assert re.search(r'<span class="output-line" style="--hang:27"> {23}x flash_attention_2 ', decisions)
    # explain() now fits 80 columns in the pasted outputs (issue 38): no line of an output is longer, but for
    # one unbreakable word.
    for page in ("index.html", "decisions/index.html", "explain/index.html", "finetune/index.html"):
        for line in re.findall(r'<span class="output-line"[^>]*>(.*?)</span>', (site / page).read_text()):
            text = re.sub(r"<[^>]+>", "", line).rstrip("\n")
            assert len(text) <= 80 or " " not in text.strip() or not text.startswith("  "), (page, text)
    # Highlighted code and the ASCII diagram marked {.no-wrap} keep their lines whole.
    how = (site / "how-it-works" / "index.html").read_text()
    assert '<div class="no-wrap highlight">' in how
    assert "output-line" not in how.split('<div class="no-wrap highlight">')[1].split("</div>")[0]
    home = (site / "index.html").read_text()
    python_block = home.split('<span class="kn">import</span>', 1)[1].split("</code>")[0]
    assert "output-line" not in python_block


def _docs_hooks() -> Any:
    """The site's build hooks (tools/docs-assets/hooks.py), which import mkdocs."""
    spec = importlib.util.spec_from_file_location("docs_hooks", HOOKS)
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the dev extra)")
    spec.loader.exec_module(hooks)
    return hooks


def test_the_hanging_indent_rule() -> None:
    hooks = _docs_hooks()
    assert hooks.hang("  dtype                bfloat16                              tie: bf16 at 0.90x") == 27
    assert hooks.hang("                       x float32                             est. 0.01 s") == 27
    assert hooks.hang("    generation.kv_cache              256                                   256 B") == 41
    assert hooks.hang("  x flash_attention_2: needs a CUDA GPU") == 6
    assert hooks.hang("AttentionUnavailableError: attn_implementation='flash_attention_2' was asked") == 4
    # explain()'s columns follow the terminal it printed for (issue 38): found from the gaps, wherever they are.
    line = "  dtype                bfloat16" + " " * 30 + "tie: bf16 at 0.90x fp32's speed"
    assert hooks.columns(line) == (23, 61)
    assert hooks.columns("  use_cache    false  training runs whole sequences") == (15, 22)
    assert hooks.columns("               x true  a cache is only read when generating") == (15, 23)
    assert hooks.columns("  attention fallback chain: sdpa -> eager") is None
    assert hooks.columns("float32/sdpa (plan)    0.277    0.479    21.9    3.70    614") is None  # a table
    assert hooks.columns("  bfloat16/eager     0.013     0.002    26805    304.1") is None
    # A long explain() line (a wide terminal's) shows its reason under its setting and value, the same characters.
    long = "  dtype  bfloat16  " + " ".join(["a reason"] * 12)
    assert '  dtype  bfloat16  <span class="reason">a reason a reason' in hooks._line(long, "\n")


def test_each_benchmark_chart_links_to_its_full_size_png(site: Path) -> None:
    page = (site / "benchmarks" / "index.html").read_text()
    charts = re.findall(r'<img [^>]*src="([^"]+\.png)"', page)
    assert len(charts) == 2
    for chart in charts:
        assert re.search(rf'<a href="{re.escape(chart)}"><img [^>]*src="{re.escape(chart)}"', page), chart
        assert (site / "benchmarks" / chart).resolve().is_file()


def test_flags_and_table_names_break_only_between_words(site: Path) -> None:
    # A phone showed `--random-` / `weights` in wrapped code and "AttentionU navailable Error" in the
    # troubleshooting table (issue 38, item 5): a flag is one unbreakable span, a name breaks between its words.
    trouble = (site / "troubleshooting" / "index.html").read_text()
    assert "<code>Attention<wbr>Unavailable<wbr>Error</code>" in trouble
    pages = "".join(page.read_text() for page in _pages(site))
    assert '<span class="flag">--random-weights</span>' in pages
    css = (ROOT / "docs" / "assets" / "stylesheets" / "cudaload.css").read_text()
    assert re.search(r"\.md-typeset pre \.flag \{\s*white-space: nowrap;", css)


def test_the_flag_and_name_rules() -> None:
    hooks = _docs_hooks()
    block = '<pre><span></span><code><span class="o">--random-weights</span> x-y --gpu T4 --seq-len 64</code></pre>'
    assert hooks.keep_flags_whole(block) == (
        '<pre><span></span><code><span class="o"><span class="flag">--random-weights</span></span> x-y --gpu T4 '
        '<span class="flag">--seq-len</span> 64</code></pre>'
    )
    cell = "<td><code>FinetuneConfigError</code> or <code>ValueError</code></td><p><code>NotInATable</code></p>"
    assert hooks.break_names_between_words(cell) == (
        "<td><code>Finetune<wbr>Config<wbr>Error</code> or <code>Value<wbr>Error</code></td>"
        "<p><code>NotInATable</code></p>"
    )


def test_wide_tables_scroll_in_their_frame_and_identifiers_do_not_break(site: Path) -> None:
    # The Distributed page's 10-column table lost its last columns past a 1280-px screen's text column, a phone
    # showed 2-4 columns with nothing saying the rest scrolls, and identifiers broke inside (`--` / `interconnect`,
    # `deepspeed-` / `zero3-offload`) (issue 46, item 7).
    css = (ROOT / "docs" / "assets" / "stylesheets" / "cudaload.css").read_text()
    assert re.search(r"\.md-typeset table:not\(\[class\]\) th \{\s*min-width: 0;", css)
    scrollwrap = re.search(r"\.md-typeset__scrollwrap \{(.*?)\}", css, re.DOTALL)
    assert (
        scrollwrap is not None
        and "no-repeat local" in scrollwrap.group(1)
        and "no-repeat scroll" in scrollwrap.group(1)
    )
    assert re.search(r"\.md-typeset code\.whole,\s*\.md-typeset code \.whole \{\s*white-space: nowrap;", css)
    distributed = (site / "distributed" / "index.html").read_text()
    assert re.search(r'<td><code class="whole">deepspeed-zero3-offload</code></td>', distributed)
    assert '<code><span class="whole">--interconnect</span> <span class="whole">infiniband-ndr:4</span></code>' in (
        distributed
    )


def test_the_identifier_rule() -> None:
    hooks = _docs_hooks()
    assert (
        hooks.keep_identifiers_whole("<p><code>fsdp-hybrid</code></p>")
        == '<p><code class="whole">fsdp-hybrid</code></p>'
    )
    assert hooks.keep_identifiers_whole("<p><code>--nodes 2</code></p>") == (
        '<p><code><span class="whole">--nodes</span> <span class="whole">2</span></code></p>'
    )
    # Longer than a phone's line in running text: it may break, after a dot, a slash or an underscore only.
    long = "torch.distributed.fsdp.fully_shard_something_long"
    assert hooks.keep_identifiers_whole(f"<p><code>{long}</code></p>") == (
        "<p><code>torch.<wbr>distributed.<wbr>fsdp.<wbr>fully_<wbr>shard_<wbr>something_<wbr>long</code></p>"
    )
    # In a table (which scrolls) it stays whole; code blocks, highlighted or linked code and <wbr>-split names are
    # left as they are.
    assert (
        hooks.keep_identifiers_whole(f"<td><code>{long}</code></td>") == f'<td><code class="whole">{long}</code></td>'
    )
    for untouched in (
        "<pre><span></span><code>x-y z</code></pre>",
        '<code class="highlight">a-b</code>',
        '<code><a href="x">Plan</a></code>',
        "<td><code>Attention<wbr>Unavailable<wbr>Error</code></td>",
    ):
        assert hooks.keep_identifiers_whole(untouched) == untouched


def test_no_diagram_labels_an_arrow_from_a_node_to_itself() -> None:
    # Mermaid draws a self-loop's label over the node and its arrows (how-it-works' fallback loops, issue 46).
    edge = re.compile(r"^\s*(\w+)\s*(?:--|-\.)\s*\"[^\"]*\"\s*(?:-->|\.->)\s*(\w+)\s*$", re.MULTILINE)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for diagram in re.findall(r"^```mermaid\n(.*?)^```", page.read_text(), re.DOTALL | re.MULTILINE):
            loops = [m.group(0).strip() for m in edge.finditer(diagram) if m.group(1) == m.group(2)]
            assert not loops, (page.name, loops)
    assert "```mermaid" in (ROOT / "docs" / "how-it-works.md").read_text()


def test_a_continuation_lines_indent_narrows_on_a_phone() -> None:
    # At 390 px a reason's continuation line (36 spaces in) showed one word a line at the right edge, with blank
    # lines between (issue 46): its indent is a span the stylesheet narrows there; the characters are the same.
    hooks = _docs_hooks()
    line = " " * 36 + "fits up to 256 tokens"
    assert hooks._line(line, "\n") == (
        f'<span class="output-line" style="--hang:40"><span class="indent">{" " * 36}</span>fits up to 256 tokens\n'
        "</span>"
    )
    for whole in ("  dtype                bfloat16   tie", "                       x float32  2x memory", "    x"):
        assert 'class="indent"' not in hooks._line(whole, "\n"), whole
    css = (ROOT / "docs" / "assets" / "stylesheets" / "cudaload.css").read_text()
    assert re.search(r"\.md-typeset \.output \.indent \{\s*display: inline-block;\s*max-width: calc\(var\(--cap\)", css)
