"""The published report as a web page: headless Chromium opens it from disk, offline.

Debian's chromium (`make test` installs it) driven by playwright with executable_path,
so nothing is downloaded.  Every figure must be displayed (loaded, non-zero size), the
page must ask the network for nothing, and every link of the index must resolve.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

if CHROMIUM is None:
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: `make test` installs Debian's chromium (make browser)",
                    pytrace=False)
    pytest.skip("chromium not installed (run `make browser`)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="dynspec-chromium-") as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
                                                    viewport={"width": 1300, "height": 900})
        yield ctx
        ctx.close()


def _open(ctx, path: Path):
    """Load a page from disk; return it with every request it made beyond file: and data: URLs."""
    page = ctx.new_page()
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
    page.goto(path.as_uri(), wait_until="load")
    return page, outside


FIGURES_JS = """() => Array.from(document.images).map(img => {
    img.scrollIntoView();
    const r = img.getBoundingClientRect();
    return {complete: img.complete, naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight,
            width: r.width, height: r.height, visible: getComputedStyle(img).visibility !== 'hidden'
                                                && getComputedStyle(img).display !== 'none'};
})"""


def test_every_figure_of_the_report_is_displayed(browser, pub):
    page, outside = _open(browser, pub.report_dir / "report.html")
    figures = page.evaluate(FIGURES_JS)
    assert len(figures) >= 5
    for i, f in enumerate(figures):
        assert f["complete"] and f["naturalWidth"] > 0 and f["naturalHeight"] > 0, f"figure {i} did not load: {f}"
        assert f["width"] > 100 and f["height"] > 100 and f["visible"], f"figure {i} not shown: {f}"
    assert "Simulated" in page.inner_text("body")
    assert outside == [], f"the report fetched from the network: {outside[:3]}"
    page.close()


def test_a_broken_figure_would_be_caught(browser, tmp_path, pub):
    # The check above must see a figure that does not load: corrupt one and look again.
    html = (pub.report_dir / "report.html").read_text()
    start = html.index("data:image/png;base64,", html.index("<img")) + len("data:image/png;base64,")
    broken = tmp_path / "broken.html"
    broken.write_text(html[:start] + "AAAA" + html[start + 4000:])
    page, _ = _open(browser, broken)
    figures = page.evaluate(FIGURES_JS)
    assert figures[0]["naturalWidth"] == 0
    assert all(f["naturalWidth"] > 0 for f in figures[1:])
    page.close()


def test_every_link_of_the_index_resolves_and_opens(browser, pub):
    index = pub.reports / "index.html"
    page, outside = _open(browser, index)
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    assert any(h.endswith(f"/{pub.run_id}/report.html") for h in hrefs)
    for href in hrefs:
        target = Path(unquote(urlparse(href).path))
        assert urlparse(href).scheme == "file" and target.is_file(), f"index links to a missing file: {href}"
        linked, linked_outside = _open(browser, target)
        assert linked.title(), f"{href} opened without a title"
        assert linked_outside == []
        linked.close()
    assert outside == []
    page.close()


def test_the_first_screen_holds_the_status_box_and_the_headline(browser, pub):
    """What a reader sees before scrolling: where the numbers come from, then the answer."""
    page, _ = _open(browser, pub.report_dir / "report.html")
    box = page.locator(".dynspec-status")
    assert box.count() == 1
    top = box.bounding_box()
    assert top is not None and top["y"] + top["height"] < 900  # inside the first 900 px
    text = box.inner_text()
    assert "Numbers" in text and "Simulated" in text and "Profile" in text and "by construction" in text
    head = page.locator("strong", has_text="Speculation").first  # the headline sentence, bold
    hb = head.bounding_box()
    assert hb is not None and hb["y"] < 900 and hb["y"] > top["y"]
    assert "of the better static arm" in head.inner_text()
    page.close()
