"""``cloudrl backup`` / ``cloudrl restore``: online-consistent SQLite copies, a checksummed
manifest, a restore drill with a killed writer, and refusal of a corrupt backup."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cloudrl.cli import main
from cloudrl.loop.backup import FEEDBACK_FILE, backup, restore

BATCH = 4
WRITER = """
import json, sys
from cloudrl.feedback import FeedbackStore
store, i = FeedbackStore(sys.argv[1]), 0
while True:
    ids, _ = store.add_pairs([{"a": {"trajectory_id": f"a{i}-{k}"},
                               "b": {"trajectory_id": f"b{i}-{k}"}, "preferred": "a"}
                              for k in range(__BATCH__)], policy_version="v1")
    print(json.dumps(ids), flush=True)
    i += 1
""".replace("__BATCH__", str(BATCH))


def _ids(db: Path) -> list[int]:
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [r[0] for r in conn.execute("SELECT id FROM feedback ORDER BY id")]
    finally:
        conn.close()


def _pair(i: int, k: int) -> dict:
    return {"a": {"trajectory_id": f"a{i}-{k}"}, "b": {"trajectory_id": f"b{i}-{k}"},
            "preferred": "a"}


def test_backup_of_a_database_being_written_is_consistent(tmp_path):
    """A writer commits batches of 4 pairs (one transaction each) while three backups run:
    each copy passes integrity_check, holds whole batches only, ids 1..n without a gap,
    and every row acknowledged before the backup started. (A plain file copy of the WAL
    database loses the rows still in the -wal file.)"""
    from cloudrl.feedback import FeedbackStore

    db = tmp_path / "state.db"
    store = FeedbackStore(db)
    acked: list[int] = []
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            ids, _ = store.add_pairs([_pair(i, k) for k in range(BATCH)])
            acked.extend(ids)
            i += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while len(acked) < 40:
            time.sleep(0.01)
        for n in range(3):
            before = set(acked)
            manifest = backup(tmp_path / f"bk{n}", feedback_db=db, registry=False)
            copy = _ids(tmp_path / f"bk{n}" / FEEDBACK_FILE)
            assert before <= set(copy), f"backup {n} lost acknowledged rows"
            assert copy == list(range(1, len(copy) + 1)) and len(copy) % BATCH == 0
            assert manifest["sources"]["feedback_db"]["rows"] == len(copy)
    finally:
        stop.set()
        writer.join(10)
        store.close()
    assert len(acked) > len(before)  # the writer kept writing during the backups


def _start_writer(db: Path) -> tuple[subprocess.Popen, list[int], threading.Thread]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1])
    acked: list[int] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            acked.extend(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, acked, reader


def test_restore_drill_a_killed_writer_loses_no_acknowledged_row(tmp_path, capsys):
    """Start a writer process, back up (checkpoint, replay shard, feedback database) to a
    file:// URI while it writes, kill it, restore into a fresh directory: every row
    acknowledged before the backup is there, nothing that was never committed is, and the
    restored store takes new rows."""
    from cloudrl.feedback import FeedbackStore

    ck = tmp_path / "ck"
    (ck / "sub").mkdir(parents=True)
    (ck / "cloudrl.json").write_text('{"algo": "dqn"}')
    (ck / "sub" / "w.bin").write_bytes(bytes(range(256)) * 40)
    shard = tmp_path / "replay0"
    shard.mkdir()
    (shard / "shard.npz").write_bytes(b"\x00\x01" * 5000)
    db = tmp_path / "state.db"
    proc, acked, reader = _start_writer(db)
    try:
        deadline = time.time() + 60
        while len(acked) < 40 and time.time() < deadline:
            time.sleep(0.02)
        assert acked, "the writer never acknowledged a row"
        before = set(acked)
        dest = f"file://{tmp_path / 'bk'}"
        assert main(["backup", dest, "--checkpoint", str(ck), "--replay", str(shard),
                     "--feedback-db", str(db), "--no-registry"]) == 0
        assert "files" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait(10)
        reader.join(10)
    committed = _ids(db)
    into = tmp_path / "restored"
    assert main(["restore", dest, "--into", str(into)]) == 0
    restored = _ids(into / FEEDBACK_FILE)
    assert before <= set(restored) <= set(committed)
    assert restored == committed[:len(restored)] and len(restored) % BATCH == 0
    assert (into / "checkpoints" / "0_ck" / "sub" / "w.bin").read_bytes() == \
        (ck / "sub" / "w.bin").read_bytes()
    assert (into / "replay" / "0_replay0" / "shard.npz").read_bytes() == b"\x00\x01" * 5000
    store = FeedbackStore(into / FEEDBACK_FILE)
    ids, _ = store.add_pairs([_pair(10**6, 0)])
    store.close()
    assert ids == [max(restored) + 1]


def test_restore_refuses_a_corrupt_or_incomplete_backup_naming_the_file(tmp_path, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "a.bin").write_bytes(b"x" * 1000)
    (ck / "b.bin").write_bytes(b"y" * 10)
    backup(tmp_path / "bk", checkpoints=[str(ck)], registry=False)
    assert main(["backup", str(tmp_path / "bk"), "--checkpoint", str(ck),
                 "--no-registry"]) == 2  # never over an existing backup
    assert "already holds a backup" in capsys.readouterr().err
    target = tmp_path / "bk" / "checkpoints" / "0_ck" / "a.bin"
    data = bytearray(target.read_bytes())
    data[500] ^= 0xFF  # one flipped bit pattern, same size
    target.write_bytes(bytes(data))
    assert main(["restore", str(tmp_path / "bk"), "--into", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checkpoints/0_ck/a.bin: checksum mismatch" in err
    assert not (tmp_path / "r1").exists()
    assert not any(p.name.startswith(".r1.") for p in tmp_path.iterdir())  # no staging left
    (tmp_path / "bk" / "checkpoints" / "0_ck" / "b.bin").unlink()
    target.write_bytes(b"x" * 1000)  # repaired; now the other file is missing
    with pytest.raises(ValueError, match="0_ck/b.bin: missing"):
        restore(tmp_path / "bk", tmp_path / "r2")
    (tmp_path / "bk" / "manifest.json").unlink()
    assert main(["restore", str(tmp_path / "bk"), "--into", str(tmp_path / "r3")]) == 2
    assert "no manifest.json" in capsys.readouterr().err



@pytest.mark.parametrize("content", ["sqlite-other-schema", "not-sqlite"])
def test_backup_of_a_file_that_is_not_a_feedback_database_is_one_line(tmp_path, capsys,
                                                                       content):
    db = tmp_path / "state.db"
    if content == "not-sqlite":
        db.write_text("hello, not a database\n" * 100)
    else:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE other (x)")
        con.commit()
        con.close()
    assert main(["backup", str(tmp_path / "bk"), "--feedback-db", str(db), "--no-registry"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--feedback-db {db}: not a feedback database" in err
    assert not (tmp_path / "bk" / "manifest.json").exists()

@pytest.mark.slow
def test_restored_registry_resolves_the_same_uris(tmp_path):
    """The MLflow registry (database + artifacts) restored elsewhere: models:/ URIs resolve
    to the restored files, not the originals, with the same content and aliases."""
    from cloudrl.loop import registry

    uri = f"sqlite:///{tmp_path / 'live' / 'mlflow.db'}"
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "cloudrl.json").write_text('{"algo": "dqn"}')
    v = registry.register_policy(ck, eval_table={"reward": -1.0}, lineage={"rows": [1, 2]},
                                 tracking_uri=uri, aliases=("champion",))
    backup(tmp_path / "bk", tracking_uri=uri,
           checkpoints=["models:/cloudrl-policy@champion"])
    restore(tmp_path / "bk", tmp_path / "restored")
    new_uri = f"sqlite:///{tmp_path / 'restored' / 'registry' / 'mlflow.db'}"
    path = registry.resolve("models:/cloudrl-policy@champion", tracking_uri=new_uri)
    assert path.is_relative_to(tmp_path / "restored")
    assert (path / "cloudrl.json").read_text() == '{"algo": "dqn"}'
    got = registry.get_version("cloudrl-policy", "champion", tracking_uri=new_uri)
    assert (got.version, got.lineage) == (v, {"rows": [1, 2]})
    assert (tmp_path / "restored" / "checkpoints" / "0_checkpoint" / "cloudrl.json").is_file()
    # the restored registry takes new versions, its artifacts next to the restored database
    v2 = registry.register_policy(ck, eval_table={}, lineage={}, tracking_uri=new_uri)
    assert registry.resolve(f"models:/cloudrl-policy/{v2}", tracking_uri=new_uri) \
        .is_relative_to(tmp_path / "restored")
