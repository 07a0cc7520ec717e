"""The labelling page in a real browser: headless Chromium driven by Selenium.

Needs Debian's ``chromium`` and ``chromium-driver`` packages (``/usr/bin/chromium``,
``/usr/bin/chromedriver``) and ``selenium`` (the dev extra); skipped, with the reason,
where either is missing.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from cloudrl.labelling import db, tokens
from cloudrl.labelling.app import ServeConfig
from cloudrl.labelling.export import export_labels
from cloudrl.labelling.queue import FLIP, PairSpec, QueueConfig, add_pairs
from cloudrl.labelling.synthetic import synthetic_segments
from tests.test_labelling_app import Server

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed "
                                "(pip install -e '.[dev]')")
if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
    pytest.skip(f"no browser: {CHROMIUM} or {DRIVER} missing (apt-get install -y chromium "
                "chromium-driver)", allow_module_level=True)

from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture()
def browser():
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 "--window-size=1366,768"):
        opts.add_argument(flag)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=webdriver.ChromeService(DRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


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


def sign_in(driver, base, token, page="/"):
    driver.get(base + page)
    box = wait(driver, lambda d: d.find_elements(By.ID, "token"))[0]
    box.send_keys(token)
    driver.find_element(By.ID, "sign-in").click()


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


def test_two_operators_label_with_keyboard_and_mouse(browser, site):
    base, toks, path = site
    d = browser
    sign_in(d, base, "lbl_not-a-token")
    wait(d, lambda d: "not valid" in d.find_element(By.ID, "login-msg").text)

    # alice: keyboard only
    sign_in(d, base, toks["alice"])
    wait(d, lambda d: d.find_elements(By.ID, "pair"))
    assert d.find_element(By.ID, "who").text == "alice"
    panels = wait(d, lambda d: {e.get_attribute("data-panel")
                                for e in d.find_elements(By.CSS_SELECTOR, ".panel")})
    assert panels == {"grid", "price", "carbon", "queue", "sla", "servers"}
    legend = wait(d, lambda d: d.find_element(By.CSS_SELECTOR,
                                              '.panel[data-panel="queue"] .legend').text)
    assert "latency" in legend and "batch" in legend
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

    # bob: mouse only (sign out first: the token lives in the tab's session storage)
    d.find_element(By.ID, "sign-out").click()
    sign_in(d, base, toks["bob"])
    wait(d, lambda d: d.find_elements(By.ID, "pair"))
    for n, button in enumerate(["choose-b", "choose-a", "choose-equal"], 1):
        aid, who, swapped, _ = current(path)
        assert who == "bob"
        shown = {"choose-a": "a", "choose-b": "b"}.get(button, "equal")
        expected.append((aid, FLIP[shown] if swapped else shown))
        d.find_element(By.ID, button).click()
        labelled(d, n)

    conn = sqlite3.connect(path)
    rows = {aid: (choice, note, ms) for aid, choice, note, ms in conn.execute(
        "SELECT assignment_id, choice, note, time_taken_ms FROM labels")}
    assert {aid: rows[aid][0] for aid, _ in expected} == dict(expected)
    assert len(rows) == 8 and all(ms > 0 for _, _, ms in rows.values())
    assert rows[expected[4][0]][1] == "queue spiky; s and = typed here"
    # gold: a quarter of each operator's tasks, each answer scored
    gold = conn.execute("SELECT o.name, COUNT(*), SUM(l.gold_correct IS NOT NULL OR "
                        "l.choice = 'skip') FROM labels l JOIN operators o ON o.id = "
                        "l.operator_id WHERE l.is_gold = 1 GROUP BY o.name").fetchall()
    assert {name: (n, scored) for name, n, scored in gold} == {"alice": (2, 2), "bob": (1, 1)}
    # nobody saw a pair twice
    assert conn.execute("SELECT COUNT(*) FROM (SELECT pair_id, operator_id FROM assignments "
                        "GROUP BY 1, 2 HAVING COUNT(*) > 1)").fetchone()[0] == 0

    # the admin page shows the figures
    d.find_element(By.ID, "sign-out").click()
    sign_in(d, base, toks["root"], "/admin")
    wait(d, lambda d: d.find_elements(By.ID, "alpha"))
    text = d.find_element(By.TAG_NAME, "main").text
    assert "alice" in text and "bob" in text and "Cohen's kappa" in text

    # the export holds every decided pair, gold ones with their known answer
    out = Path(tempfile.mkdtemp())
    res = export_labels(sqlite3.connect(path, isolation_level=None), out)
    decided = conn.execute("SELECT COUNT(DISTINCT pair_id) FROM labels WHERE choice != 'skip' "
                           "OR is_gold = 1").fetchone()[0]
    assert res.written == decided and res.written >= 5
    shutil.rmtree(out, ignore_errors=True)


def test_empty_queue_and_admin_only_page(browser, site):
    base, toks, path = site
    conn = sqlite3.connect(path)
    conn.execute("UPDATE pairs SET taken = k, gold = NULL")
    conn.commit()
    sign_in(browser, base, toks["alice"])
    wait(browser, lambda d: d.find_elements(By.ID, "empty"))
    assert browser.find_element(By.ID, "choices").get_attribute("hidden") is not None
    browser.get(base + "/admin")  # the same tab keeps alice's token: not an admin
    wait(browser, lambda d: "needs an admin token" in d.find_element(By.TAG_NAME, "main").text)
    assert not browser.find_elements(By.ID, "alpha")
