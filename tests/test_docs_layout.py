"""The built documentation site in a real browser at 1280 px: wide tables stay inside the
content column (the theme's scroll wrapper holds them, the page itself never scrolls
sideways), the headline page's tables fit without scrolling, and the demo page shows its
two pictures. Needs mkdocs and Debian's ``chromium`` and ``chromium-driver``; skipped with
the reason otherwise. Slow: it builds the whole site (about 15 s) first."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PAGES = ("results/headline/", "results/headline-scale/", "results/alignment/",
         "results/demo/", "tasks/offline/", "results/finetune-decisions/")
TABLES = """
const col = document.querySelector('.md-content__inner').getBoundingClientRect();
return {page_width: document.documentElement.scrollWidth, view: window.innerWidth,
  column_right: col.right,
  tables: [...document.querySelectorAll('.md-typeset table')].map(t => {
    const w = t.closest('.md-typeset__scrollwrap');
    return {wrapped: !!w, overflow: w ? getComputedStyle(w).overflowX : null,
            scrolls: w ? w.scrollWidth > w.clientWidth : null,
            wrap_right: w ? w.getBoundingClientRect().right : null};}),
  images: [...document.querySelectorAll('.md-typeset img')].map(
    i => [i.getAttribute('src'), i.naturalWidth])};
"""

pytestmark = pytest.mark.slow
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed "
                                "(pip install -e '.[dev]')")
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (make test installs it)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def measured(site: Path) -> dict[str, dict]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.skip(f"no chromium: {', '.join(missing)} missing "
                    "(apt-get install -y chromium chromium-driver)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 f"--user-data-dir={profile}", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=opts)
    found = {}
    try:
        for page in PAGES:
            driver.get(f"http://127.0.0.1:{httpd.server_address[1]}/{page}")
            # the theme's script wraps the tables once the page has loaded
            WebDriverWait(driver, 20).until(
                lambda d: d.execute_script(
                    "return document.querySelectorAll('.md-typeset table').length == "
                    "document.querySelectorAll('.md-typeset__scrollwrap table').length "
                    "&& [...document.images].every(i => i.complete)"))
            found[page] = driver.execute_script(TABLES)
    finally:
        driver.quit()
        httpd.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    return found


def test_every_table_scrolls_inside_the_column_never_the_page(measured) -> None:
    for page, m in measured.items():
        assert m["tables"], page
        assert m["page_width"] <= m["view"], f"{page}: the page scrolls sideways"
        for t in m["tables"]:
            assert t["wrapped"] and t["overflow"] == "auto", (page, t)
            assert t["wrap_right"] <= m["column_right"] + 20, (page, t)  # the theme's bleed


def test_the_headline_tables_fit_the_column_at_1280_px(measured) -> None:
    for page in ("results/headline/", "results/headline-scale/", "tasks/offline/"):
        assert [t for t in measured[page]["tables"] if t["scrolls"]] == [], page


def test_the_demo_page_shows_both_pictures(measured) -> None:
    images = dict(measured["results/demo/"]["images"])
    shown = {Path(src).name: width for src, width in images.items()}
    assert shown.get("demo_scenario.png", 0) > 100 and shown.get("demo.png", 0) > 100, images
