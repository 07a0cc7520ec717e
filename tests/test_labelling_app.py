"""The labelling service over real HTTP: access, bad input, rate limit, durability."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.labelling import db, tokens
from cloudrl.labelling.app import ServeConfig, TokenBucket, create_app
from cloudrl.labelling.queue import PairSpec, QueueConfig, add_pairs
from cloudrl.labelling.synthetic import synthetic_segments
from tests.support import free_port as shared_free_port

REPO = Path(__file__).resolve().parents[1]


def free_port(ports: range = range(18310, 18331)) -> int:
    """A port of the labelling tests' range that uvicorn can bind now: probed with
    SO_REUSEADDR as uvicorn binds, so a port whose closed connections still wait in
    TIME_WAIT counts as free (a port another server listens on does not)."""
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return shared_free_port(ports)  # none: its error names the range


def call(base: str, path: str, token: str | None = None, body=None, method=None,
         raw: bytes | None = None, headers: dict | None = None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method or (
        "POST" if data is not None else "GET"))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            payload = json.loads(text)
        except ValueError:
            payload = text.decode(errors="replace")
        return e.code, payload, dict(e.headers)


def seed_db(path: Path, n_pairs: int = 6, gold: int = 0, k: int = 2) -> dict[str, str]:
    conn = db.connect(path)
    segs = synthetic_segments(2 * n_pairs, seed=5)
    add_pairs(conn, [PairSpec(a=segs[2 * i], b=segs[2 * i + 1], source="t",
                              gold="a" if i < gold else None) for i in range(n_pairs)], k=k)
    out = {n: tokens.add_operator(conn, n) for n in ("alice", "bob")}
    out["admin"] = tokens.add_operator(conn, "admin", admin=True)
    conn.close()
    return out


class Server:
    """The app in a uvicorn thread on a free port of the labelling range."""

    def __init__(self, cfg: ServeConfig) -> None:
        import uvicorn

        cfg.port = free_port()
        self.base = f"http://127.0.0.1:{cfg.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1",
                                                    port=cfg.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture()
def served(tmp_path):
    toks = seed_db(tmp_path / "labels.db")
    cfg = ServeConfig(db=str(tmp_path / "labels.db"), rate_per_s=50.0, rate_burst=50,
                      queue=QueueConfig(gold_rate=0.0))
    with Server(cfg) as srv:
        yield srv, toks, tmp_path / "labels.db"


def counts(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("SELECT COUNT(*) FROM labels").fetchone()[0],
                conn.execute("SELECT COUNT(*) FROM assignments").fetchone()[0])
    finally:
        conn.close()


def test_label_flow_returns_the_next_pair_at_once(served):
    srv, toks, path = served
    status, me, _ = call(srv.base, "/api/me", toks["alice"])
    assert status == 200 and me == {"name": "alice", "admin": False, "labels": 0}
    status, got, headers = call(srv.base, "/api/next", toks["alice"])
    assert status == 200 and headers["cache-control"] == "no-store"
    task = got["task"]
    assert set(task["left"]["series"]) >= {"grid_kw", "queue", "sla", "servers:active"}
    assert "policy" in task["left"]  # kept in the view; the page does not show it
    status, out, _ = call(srv.base, "/api/labels", toks["alice"], {
        "assignment_id": task["assignment_id"], "choice": "equal", "note": " fine ",
        "time_taken_ms": 2300})
    assert status == 200 and out["stored"]["choice"] == "equal"
    assert out["task"]["assignment_id"] != task["assignment_id"]
    conn = sqlite3.connect(path)
    row = conn.execute("SELECT o.name, l.choice, l.note, l.time_taken_ms, l.created_at FROM "
                       "labels l JOIN operators o ON o.id = l.operator_id").fetchone()
    assert row[:4] == ("alice", "equal", "fine", 2300) and abs(row[4] - time.time()) < 60


def test_wrong_or_missing_token_is_401_and_changes_nothing(served):
    srv, toks, path = served
    _, got, _ = call(srv.base, "/api/next", toks["alice"])
    before = counts(path)
    for token in (None, "lbl_wrong", toks["alice"] + "x"):
        status, out, headers = call(srv.base, "/api/next", token)
        assert status == 401 and headers.get("www-authenticate") == "Bearer"
        status, out, _ = call(srv.base, "/api/labels", token, {
            "assignment_id": got["task"]["assignment_id"], "choice": "a"})
        assert status == 401 and "token" in out["detail"]
    assert call(srv.base, "/api/labels", None, {"x": 1},
                headers={"Authorization": "Basic abc"})[0] == 401
    assert counts(path) == before


def test_unknown_foreign_and_repeated_tasks_are_4xx_with_a_reason(served):
    srv, toks, path = served
    task = call(srv.base, "/api/next", toks["alice"])[1]["task"]
    status, out, _ = call(srv.base, "/api/labels", toks["alice"],
                          {"assignment_id": 99999, "choice": "a"})
    assert status == 404 and "unknown task" in out["detail"]
    status, out, _ = call(srv.base, "/api/labels", toks["bob"],
                          {"assignment_id": task["assignment_id"], "choice": "a"})
    assert status == 404  # alice's task is not bob's
    assert call(srv.base, "/api/labels", toks["alice"],
                {"assignment_id": task["assignment_id"], "choice": "b"})[0] == 200
    before = counts(path)
    status, out, _ = call(srv.base, "/api/labels", toks["alice"],
                          {"assignment_id": task["assignment_id"], "choice": "a"})
    assert status == 409 and "already labelled" in out["detail"]
    assert counts(path) == before


@pytest.mark.parametrize("body, field", [
    (b"{not json", "body"), (b"[]", "body"), (b'{"assignment_id": 1}', "body.choice"),
    (b'{"assignment_id": 1, "choice": "left"}', "body.choice"),
    (b'{"assignment_id": "x", "choice": "a"}', "body.assignment_id"),
    (b'{"assignment_id": 1, "choice": "a", "extra": 1}', "body.extra"),
    (b'{"assignment_id": 1, "choice": "a", "time_taken_ms": -5}', "body.time_taken_ms"),
    (json.dumps({"assignment_id": 1, "choice": "a", "note": "x" * 2001}).encode(), "body.note"),
])
def test_malformed_bodies_are_422_naming_the_field(served, body, field):
    srv, toks, path = served
    before = counts(path)
    status, out, _ = call(srv.base, "/api/labels", toks["alice"], raw=body)
    assert status == 422 and out["detail"].startswith(field), out
    assert counts(path) == before


def test_oversized_body_is_413(served):
    srv, toks, path = served
    status, out, _ = call(srv.base, "/api/labels", toks["alice"], raw=b"{" + b" " * 20_000 + b"}")
    assert status == 413 and "bytes" in out["detail"]


def test_admin_endpoints_need_an_admin_token(served):
    srv, toks, _ = served
    assert call(srv.base, "/api/admin/stats", toks["alice"])[0] == 403
    assert call(srv.base, "/api/admin/gold", toks["bob"], {"pair_id": 1, "answer": "a"})[0] == 403
    status, stats, _ = call(srv.base, "/api/admin/stats", toks["admin"])
    assert status == 200 and stats["queue"]["pairs"] == 6
    assert {"krippendorff_alpha", "cohen_kappa_mean", "operators"} <= set(stats["quality"])
    status, out, _ = call(srv.base, "/api/admin/gold", toks["admin"], {"pair_id": 2,
                                                                       "answer": "b"})
    assert status == 200 and out == {"pair_id": 2, "gold": "b"}
    assert call(srv.base, "/api/admin/gold", toks["admin"], {"pair_id": 999,
                                                            "answer": "b"})[0] == 404


def test_pages_and_assets_are_served_without_inline_script(served):
    srv, _, _ = served
    with urllib.request.urlopen(srv.base + "/") as r:
        html = r.read().decode()
        assert "default-src 'self'" in r.headers["content-security-policy"]
    assert '<script src="/static/label.js?v=' in html and "<script>" not in html
    for name in ("label.js", "common.js", "admin.js", "label.css"):
        with urllib.request.urlopen(f"{srv.base}/static/{name}") as r:
            assert r.status == 200 and len(r.read()) > 500
    assert call(srv.base, "/static/nope.js")[0] == 404


def test_submissions_are_rate_limited(tmp_path):
    toks = seed_db(tmp_path / "labels.db", n_pairs=8, k=1)
    cfg = ServeConfig(db=str(tmp_path / "labels.db"), rate_per_s=0.5, rate_burst=3,
                      queue=QueueConfig(gold_rate=0.0))
    with Server(cfg) as srv:
        task = call(srv.base, "/api/next", toks["alice"])[1]["task"]
        statuses = []
        for _ in range(5):
            status, out, headers = call(srv.base, "/api/labels", toks["alice"], {
                "assignment_id": task["assignment_id"], "choice": "a"})
            statuses.append(status)
            if status == 200:
                task = out["task"]
        assert statuses == [200, 200, 200, 429, 429]
        assert int(headers["retry-after"]) >= 1 and counts(tmp_path / "labels.db")[0] == 3


def test_token_bucket_refills_at_its_rate():
    b = TokenBucket(rate=2.0, burst=2)
    assert [b.take("k", now=0.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]
    assert b.take("k", now=0.5) == 0.0 and b.take("other", now=0.5) == 0.0


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``cloudrl label ARGS`` in a subprocess (its quick entry point: the same commands)."""
    return subprocess.run([sys.executable, "-m", "cloudrl.labelling", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("sync", ["normal", pytest.param("full", marks=pytest.mark.slow)])
def test_acknowledged_labels_survive_kill_9(tmp_path, sync):
    path = tmp_path / "labels.db"
    toks = seed_db(path, n_pairs=30, k=2)
    port = free_port(range(18160, 18199))
    proc = subprocess.Popen([sys.executable, "-m", "cloudrl.labelling", "serve", "--db",
                             str(path), "--port", str(port), "--gold-rate", "0", "--rate",
                             "100", "--burst", "100", "--sync", sync], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if call(base, "/healthz")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.2)
        acked = []
        for who in ("alice", "bob"):
            task = call(base, "/api/next", toks[who])[1]["task"]
            for i in range(15):
                status, out, _ = call(base, "/api/labels", toks[who], {
                    "assignment_id": task["assignment_id"], "choice": "ab"[i % 2]})
                assert status == 200
                acked.append(out["stored"]["label_id"])
                task = out["task"]
        proc.send_signal(signal.SIGKILL)  # right after the last acknowledgement
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)  # recovers from the WAL the killed server left
    stored = [r[0] for r in conn.execute("SELECT id FROM labels ORDER BY id")]
    assert stored == sorted(acked) and len(stored) == 30
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_database_that_cannot_be_opened_is_one_line_exit_2(tmp_path, capsys):
    from cloudrl.labelling.cli import main

    bad = tmp_path / "not.db"
    bad.write_bytes(b"this is not a sqlite file" * 100)
    res = _cli("serve", "--db", str(bad), "--port", "18199")  # a real process
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cloudrl: --db: labelling database {bad}")
    assert main(["serve", "--db", str(tmp_path), "--port", "18199"]) == 2
    assert capsys.readouterr().err.strip() == (f"cloudrl: --db: labelling database {tmp_path}: "
                                               "is a directory")
    assert main(["stats", "--db", str(tmp_path / "missing.db")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_operators_enqueue_stats_export_round_trip(tmp_path, capsys):
    from cloudrl.labelling.cli import main

    path = str(tmp_path / "labels.db")

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = run("operators", "add", "carol", "--db", path)
    token = json.loads(out)["token"]
    assert code == 0 and token.startswith("lbl_")
    code, _, err = run("operators", "add", "carol", "--db", path)
    assert code == 2 and "already exists" in err
    code, _, err = run("enqueue", "--db", path)
    assert code == 2 and "exactly one of" in err
    code, _, err = run("enqueue", "--db", path, "--policy", "power_aware", "--seeds", "1000000")
    assert code == 2 and "train seed" in err
    code, out, err = run("enqueue", "--db", path, "--policy", "power_aware", "--policy",
                         "round_robin", "--seeds", "0", "--n-servers", "4",
                         "--episode-length", "30", "--segment-length", "10", "--pairs", "5",
                         "--gold-fraction", "0.4")
    assert code == 0, err
    added = json.loads(out)
    assert added["added"] == 5 and added["duplicates"] == 0
    conn = sqlite3.connect(path)
    views = [json.loads(v) for (v,) in conn.execute("SELECT view_json FROM segments")]
    # same seed and start, two policies: the pairs compare one situation handled two ways
    assert {v["policy"] for v in views} == {"power_aware", "round_robin"}
    assert {v["length"] for v in views} == {10} and all(v["seed"] == 0 for v in views)
    for a, b in conn.execute("SELECT sa.view_json, sb.view_json FROM pairs p JOIN segments sa"
                             " ON sa.id = p.a_seg JOIN segments sb ON sb.id = p.b_seg"):
        a, b = json.loads(a), json.loads(b)
        assert (a["start"], a["policy"]) != (b["start"], b["policy"])
    from cloudrl.recording import record_episodes  # episodes recorded earlier, from a dir

    record_episodes("ffd", tmp_path / "demos", env_config={"n_servers": 4, "sim": {
        "episode_length": 30}}, episodes=1, seeds=[0])
    code, out, err = run("enqueue", "--db", path, "--episodes", str(tmp_path / "demos"),
                         "--n-servers", "4", "--segment-length", "10", "--pairs", "3", "--k", "1")
    assert code == 0, err
    assert json.loads(out)["added"] == 3
    assert conn.execute("SELECT COUNT(*) FROM pairs WHERE k = 1").fetchone()[0] == 3
    code, out, _ = run("stats", "--db", path)
    assert code == 0 and "Krippendorff's alpha" in out and "carol" in out
    code, out, err = run("export", "--db", path, "--out", str(tmp_path / "pairs"))
    assert code == 0 and json.loads(out)["pairs"] == 0 and "no labelled pairs" in err


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=30),
                     lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=12), kids, max_size=4), max_leaves=12)
_label_like = st.fixed_dictionaries(
    {"assignment_id": st.integers(-5, 2**70) | st.text(max_size=5) | st.none(),
     "choice": st.sampled_from(["a", "b", "equal", "skip", "left", ""]) | st.integers()},
    optional={"note": st.text(max_size=40) | st.integers(), "time_taken_ms": st.integers(),
              "x": _json})


def test_fuzzed_bodies_never_get_a_5xx(tmp_path):
    toks = seed_db(tmp_path / "labels.db", n_pairs=40, k=3)
    cfg = ServeConfig(db=str(tmp_path / "labels.db"), rate_per_s=1000.0, rate_burst=1000,
                      queue=QueueConfig(gold_rate=0.0))
    with Server(cfg) as srv:
        @settings(max_examples=30, deadline=None)
        @given(body=_json | _label_like, path=st.sampled_from(["/api/labels",
                                                              "/api/admin/gold"]),
               raw=st.booleans(), who=st.sampled_from(["alice", "admin", "nobody"]))
        def fuzz(body, path, raw, who):
            data = (json.dumps(body)[:-1].encode() if raw else json.dumps(body).encode())
            status, out, _ = call(srv.base, path, toks.get(who, "lbl_x"), raw=data)
            assert status < 500, (status, out)
            if who == "nobody":
                assert status == 401

        fuzz()


# ----------------------------------------------------------------------------- strict bodies

_NUMBER_AS_OTHER = (st.integers(1, 10**6).map(str) | st.booleans() | st.none()
                    | st.floats(allow_nan=False, allow_infinity=False)
                    | st.integers(1, 99).map(float) | st.lists(st.integers(1, 9), max_size=2)
                    | st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=1))
_TEXT_AS_OTHER = (st.integers() | st.booleans() | st.floats(allow_nan=False)
                  | st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2)
                  | st.dictionaries(st.sampled_from("ab"), st.sampled_from("ab"), max_size=1))
# (path, field, wrong values): null is wrong only where the field is not nullable
_WRONG = [("/api/labels", "assignment_id", _NUMBER_AS_OTHER),
          ("/api/labels", "choice", _TEXT_AS_OTHER | st.none()),
          ("/api/labels", "note", _TEXT_AS_OTHER),
          ("/api/labels", "time_taken_ms", _NUMBER_AS_OTHER),
          ("/api/admin/gold", "pair_id", _NUMBER_AS_OTHER),
          ("/api/admin/gold", "answer", _TEXT_AS_OTHER)]


def test_wrong_json_types_are_422_naming_the_field(tmp_path):
    toks = seed_db(tmp_path / "labels.db", n_pairs=4, k=2)
    path = tmp_path / "labels.db"
    cfg = ServeConfig(db=str(path), rate_per_s=1000.0, rate_burst=1000,
                      queue=QueueConfig(gold_rate=0.0))
    with Server(cfg) as srv:
        aid = call(srv.base, "/api/next", toks["alice"])[1]["task"]["assignment_id"]
        valid = {"/api/labels": {"assignment_id": aid, "choice": "b", "note": "n",
                                 "time_taken_ms": 1200},
                 "/api/admin/gold": {"pair_id": 3, "answer": "a"}}
        who = {"/api/labels": toks["alice"], "/api/admin/gold": toks["admin"]}

        @settings(max_examples=60, deadline=None)
        @given(case=st.sampled_from(range(len(_WRONG))), data=st.data())
        def wrong_type(case, data):
            route, name, values = _WRONG[case]
            body = {**valid[route], name: data.draw(values)}
            before = counts(path)
            status, out, _ = call(srv.base, route, who[route], body)
            assert status == 422 and out["detail"].startswith(f"body.{name}:"), (body, out)
            assert counts(path) == before

        wrong_type()
        # whole bodies of another JSON type than an object
        for raw in (b"true", b"9", b'"a"', b"null", b"[1]"):
            status, out, _ = call(srv.base, "/api/labels", toks["alice"], raw=raw)
            assert status == 422 and out["detail"].startswith("body:"), (raw, out)
        # and the valid bodies still go through (nothing above was stored)
        assert counts(path)[0] == 0
        assert call(srv.base, "/api/labels", toks["alice"], valid["/api/labels"])[0] == 200
        assert call(srv.base, "/api/admin/gold", toks["admin"], valid["/api/admin/gold"]
                    )[0] == 200
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT note, time_taken_ms FROM labels").fetchall() == [("n", 1200)]
        assert conn.execute("SELECT gold FROM pairs WHERE id = 3").fetchone()[0] == "a"
        conn.close()


# ----------------------------------------------------------------------------- OpenAPI, 405

# the errors each /api call can answer (what the handlers raise)
API_ERRORS = {("/api/me", "get"): {401}, ("/api/next", "get"): {401},
              ("/api/labels", "post"): {401, 404, 409, 413, 422, 429},
              ("/api/admin/stats", "get"): {401, 403}, ("/api/admin/votes", "get"): {401, 403},
              ("/api/admin/gold", "post"): {401, 403, 404, 413, 422}}


def test_openapi_declares_bodies_the_token_scheme_and_the_errors(served):
    srv, _, _ = served
    status, doc, _ = call(srv.base, "/api/openapi.json")
    assert status == 200
    comps = doc["components"]
    assert comps["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": comps["securitySchemes"][
            "bearerAuth"]["description"]}
    ops = {(p, m): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert set(ops) == set(API_ERRORS) | {("/healthz", "get")}
    assert "security" not in ops[("/healthz", "get")]
    for key, codes in API_ERRORS.items():
        op = ops[key]
        assert op["security"] == [{"bearerAuth": []}], key
        declared = {int(c) for c in op["responses"] if c != "200"}
        assert declared == codes, key
        for c in codes:
            ref = op["responses"][str(c)]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorOut"
    for key, model in ((("/api/labels", "post"), "LabelIn"),
                       (("/api/admin/gold", "post"), "GoldIn")):
        body = ops[key]["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model}"}
    label = comps["schemas"]["LabelIn"]
    assert set(label["required"]) == {"assignment_id", "choice"}
    assert label["properties"]["choice"]["enum"] == ["a", "b", "equal", "skip"]
    assert label["additionalProperties"] is False
    assert set(comps["schemas"]["GoldIn"]["required"]) == {"pair_id", "answer"}
    assert all("requestBody" not in op for k, op in ops.items() if k[1] == "get")


def test_a_wrong_method_is_405_with_allow(served):
    srv, toks, db_path = served
    before = counts(db_path)
    for path, allowed in [("/api/labels", "POST"), ("/api/admin/gold", "POST"),
                          ("/api/next", "GET"), ("/api/admin/stats", "GET"), ("/", "GET"),
                          ("/static/common.js", "GET"), ("/favicon.ico", "GET"),
                          ("/healthz", "GET")]:
        for method in ("PUT", "DELETE", "PATCH", "GET" if allowed == "POST" else "POST"):
            status, out, headers = call(srv.base, path, toks["admin"], method=method,
                                        raw=b"{}" if method != "GET" else None)
            assert status == 405, (method, path)
            assert headers["allow"] == allowed
            assert out["detail"] == f"{method} {path}: method not allowed (allowed: {allowed})"
    assert counts(db_path) == before


# ----------------------------------------------------------------------------- favicon


def test_favicon_is_a_16px_ico(served):
    import struct

    srv, _, _ = served
    with urllib.request.urlopen(srv.base + "/favicon.ico") as r:
        assert r.status == 200 and r.headers["content-type"] == "image/x-icon"
        ico = r.read()
    reserved, kind, n = struct.unpack("<HHH", ico[:6])
    w, h, _, _, planes, bpp, size, offset = struct.unpack("<BBBBHHII", ico[6:22])
    assert (reserved, kind, n, w, h, planes, bpp) == (0, 1, 1, 16, 16, 1, 32)
    assert offset == 22 and offset + size == len(ico)
    header = struct.unpack("<IiiHHI", ico[offset:offset + 20])
    assert header == (40, 16, 32, 1, 32, 0)  # BITMAPINFOHEADER, height doubled (mask)
    pixels = ico[offset + 40:offset + 40 + 16 * 16 * 4]
    assert all(pixels[i] == 255 for i in range(3, len(pixels), 4))  # opaque
    assert len({pixels[i:i + 3] for i in range(0, len(pixels), 4)}) == 3  # three colours
    assert "<link rel=\"icon\" href=\"/favicon.ico\"" in urllib.request.urlopen(
        srv.base + "/").read().decode()


# ----------------------------------------------------------------------------- missing extra


def test_scenario_enqueue_without_pvlib_is_one_line_exit_2(tmp_path):
    """pvlib blocked in the child (an import of it fails as if it were not installed)."""
    db_path = tmp_path / "labels.db"
    wrapper = ("import sys; sys.modules['pvlib'] = None; "
               "from cloudrl.cli import main; sys.exit(main(sys.argv[1:]))")
    res = subprocess.run(
        [sys.executable, "-c", wrapper, "label", "enqueue", "--db", str(db_path),
         "--from-scenario", "solar_site", "--controller", "mpc", "--controller",
         "run_at_once", "--seeds", "2", "--pairs", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("cloudrl: enqueue: --from-scenario solar_site: ")
    assert lines[0].endswith("its solar signal needs pvlib, the 'solar' extra: "
                             "pip install 'cloudrl[solar]'")
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT COUNT(*) FROM pairs").fetchone()[0] == 0
    conn.close()


# ----------------------------------------------------------------------------- palette


def _lab(hex_colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB colour."""
    lin = [(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
           for c in (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))]
    xyz = [sum(m * v for m, v in zip(row, lin, strict=True)) for row in (
        (0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505))]

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    fx, fy, fz = f(xyz[0] / 0.95047), f(xyz[1]), f(xyz[2] / 1.08883)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_every_power_state_has_its_own_colour_and_nothing_is_styled_inline():
    import itertools

    from cloudrl.labelling import ui
    from cloudrl.labelling.scenario_segments import STATES

    states = ui.STATE_COLORS
    # the states the producers emit (scenarios; the synthetic and cluster segments)
    assert set(STATES) | {"active", "waking", "asleep"} <= set(states)
    for palette in (list(states.values()), ui.LINE_COLORS, ui.SLA_COLORS):
        assert len({c.lower() for c in palette}) == len(palette), palette
    # and far apart to the eye (CIE76 distance; 2.3 is a just-noticeable difference)
    closest = min((math.dist(_lab(states[a]), _lab(states[b])), a, b)
                  for a, b in itertools.combinations(states, 2))
    assert closest[0] > 25, closest
    for name, colour in states.items():  # the legend's classes carry the same colours
        assert f".sw.state-{name} {{ background:{colour}; }}" in ui.CSS
    for js in (ui.LABEL_JS, ui.COMMON_JS, ui.ADMIN_JS):
        assert "style:" not in js and '"style"' not in js and ".style =" not in js
    for html in (ui.LABEL_HTML, ui.ADMIN_HTML):
        assert "style=" not in html and "<style" not in html
