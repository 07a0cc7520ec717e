"""``cloudrl backup`` / ``cloudrl restore``: what weeks of the loop produced, to a directory or a
``pyarrow.fs`` URI and back, verified.

A backup holds

* ``checkpoints/<i>_<name>/``: policy and reward-model checkpoint directories (a path or a
  registry URI such as ``models:/cloudrl-policy@champion``, resolved first);
* ``replay/<i>_<name>/``: replay shard directories, when given;
* ``feedback/state.db``: the feedback database, copied with SQLite's online backup API
  (``sqlite3.Connection.backup`` in one step: a consistent snapshot taken in one read
  transaction, while the service keeps writing; every committed batch is in it or not,
  never half of it);
* ``registry/mlflow.db`` + ``registry/mlartifacts/``: the MLflow store of the registry (a
  SQLite tracking URI; the database through the same backup API, the artifacts next to it);
* ``manifest.json``, written last: every file's path, size and SHA-256, and where each part
  came from. A backup without it is incomplete.

The destination is a local path or any URI ``pyarrow.fs.FileSystem.from_uri`` opens
(``file:///...``, ``s3://bucket/prefix``, ``gs://...``). ``restore`` reads the manifest,
copies every file into a staging directory next to ``--into`` while hashing it, and refuses
the backup (:class:`BackupError`, one line naming the file) when a file is missing or its
checksum differs; only a fully verified copy is renamed to ``--into``. The restored registry
database is rewritten to point at its restored artifacts, so
``MLFLOW_TRACKING_URI=sqlite:///<into>/registry/mlflow.db`` resolves the same
``models:/...`` URIs as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 1
CHUNK = 1 << 20
FEEDBACK_FILE = "feedback/state.db"
REGISTRY_DB = "registry/mlflow.db"
REGISTRY_ARTIFACTS = "registry/mlartifacts"
# MLflow columns holding artifact locations (rewritten on restore)
LOCATION_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                    ("model_versions", "source"), ("model_versions", "storage_location"),
                    ("logged_models", "artifact_location"))


class BackupError(ValueError):
    """A bad source, destination or backup; the message names the file or flag."""


def _filesystem(uri: str | Path) -> tuple[Any, str]:
    """(pyarrow filesystem, path in it) of a local path or a ``scheme://`` URI."""
    from pyarrow import fs

    text = str(uri)
    if "://" not in text:
        return fs.LocalFileSystem(), str(Path(text).expanduser().resolve())
    try:
        return fs.FileSystem.from_uri(text)
    except Exception as e:  # noqa: BLE001 - any unsupported or malformed URI is bad input
        raise BackupError(f"{text}: not a usable pyarrow.fs URI ({e})") from None


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            yield path


def sqlite_snapshot(db: str | Path, dst: str | Path) -> int:
    """A consistent copy of a live SQLite database (the online backup API, in one step);
    returns the number of pages copied."""
    src = sqlite3.connect(str(Path(db).resolve()), timeout=30)  # only reads
    out = sqlite3.connect(str(dst))
    try:
        src.backup(out)  # pages=-1: the whole database in one step, one read transaction
        pages = int(out.execute("PRAGMA page_count").fetchone()[0])
        out.execute("PRAGMA journal_mode=DELETE")  # a self-contained file, no -wal beside it
    finally:
        out.close()
        src.close()
    return pages


class _Writer:
    """Puts files under the destination and records them for the manifest."""

    def __init__(self, dest: str | Path) -> None:
        self.fs, self.root = _filesystem(dest)
        from pyarrow import fs

        info = self.fs.get_file_info(self.root)
        if info.type == fs.FileType.File:
            raise BackupError(f"{dest}: is a file; give a directory for the backup")
        if info.type == fs.FileType.Directory and self.fs.get_file_info(
                f"{self.root}/{MANIFEST}").type == fs.FileType.File:
            raise BackupError(f"{dest}: already holds a backup ({MANIFEST}); give a new "
                              "directory")
        self.fs.create_dir(self.root, recursive=True)
        self.files: list[dict[str, Any]] = []

    def put(self, local: Path, rel: str) -> None:
        digest, size = hashlib.sha256(), 0
        target = f"{self.root}/{rel}"
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with open(local, "rb") as f, self.fs.open_output_stream(target) as out:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        self.files.append({"path": rel, "size": size, "sha256": digest.hexdigest()})

    def put_dir(self, local: Path, rel: str) -> int:
        n = 0
        for path in _files(local):
            self.put(path, f"{rel}/{path.relative_to(local).as_posix()}")
            n += 1
        return n

    def finish(self, manifest: dict[str, Any]) -> None:
        data = json.dumps(manifest, indent=1).encode()
        with self.fs.open_output_stream(f"{self.root}/{MANIFEST}") as out:
            out.write(data)


def _safe_name(path: Path) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in path.name) or "dir"


def _tracking_db(tracking_uri: str | None) -> Path | None:
    from cloudrl import tracking

    uri = tracking.resolve_tracking_uri(tracking_uri)
    db = tracking.sqlite_path(uri)
    if db is None:
        raise BackupError(f"--tracking-uri {uri}: only a SQLite store is backed up here (back "
                          "up a tracking server's database and artifact store with its own "
                          "tools), or give --no-registry")
    return db if db.is_file() else None


def backup(dest: str | Path, *, checkpoints: list[str] | tuple[str, ...] = (),
           replay: list[str] | tuple[str, ...] = (), feedback_db: str | Path | None = None,
           tracking_uri: str | None = None, registry: bool = True) -> dict[str, Any]:
    """Write a backup to ``dest`` (see the module docstring); returns its manifest."""
    from cloudrl.loop import registry as reg

    sources: dict[str, Any] = {"checkpoints": {}, "replay": {}}
    local_dirs: list[tuple[str, Path, str]] = []
    for i, spec in enumerate(checkpoints):
        try:
            path = reg.resolve(spec, tracking_uri=tracking_uri)
        except reg.RegistryError as e:
            raise BackupError(f"--checkpoint {spec}: {e}") from None
        if not path.is_dir():
            raise BackupError(f"--checkpoint {spec}: not a directory")
        local_dirs.append(("checkpoints", path, f"checkpoints/{i}_{_safe_name(path)}"))
        sources["checkpoints"][f"checkpoints/{i}_{_safe_name(path)}"] = str(spec)
    for i, spec in enumerate(replay):
        path = Path(spec)
        if not path.is_dir():
            raise BackupError(f"--replay {spec}: not a directory")
        local_dirs.append(("replay", path, f"replay/{i}_{_safe_name(path)}"))
        sources["replay"][f"replay/{i}_{_safe_name(path)}"] = str(spec)
    if feedback_db is not None and not Path(feedback_db).is_file():
        raise BackupError(f"--feedback-db {feedback_db}: no such file")
    registry_db = _tracking_db(tracking_uri) if registry else None

    writer = _Writer(dest)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="cloudrl-backup-") as tmp:
        if feedback_db is not None:
            snap = Path(tmp) / "state.db"
            try:
                sqlite_snapshot(feedback_db, snap)
                con = sqlite3.connect(str(snap))
                try:
                    rows = con.execute(
                        "SELECT COUNT(*), COALESCE(MAX(id), 0) FROM feedback").fetchone()
                finally:
                    con.close()
            except sqlite3.DatabaseError as exc:
                raise BackupError(f"--feedback-db {feedback_db}: not a feedback database "
                                  f"({exc})") from None
            writer.put(snap, FEEDBACK_FILE)
            sources["feedback_db"] = {"path": str(Path(feedback_db).resolve()),
                                      "rows": int(rows[0]), "max_id": int(rows[1])}
        if registry_db is not None:
            snap = Path(tmp) / "mlflow.db"
            sqlite_snapshot(registry_db, snap)
            writer.put(snap, REGISTRY_DB)
            artifacts = registry_db.parent / "mlartifacts"
            n = writer.put_dir(artifacts, REGISTRY_ARTIFACTS) if artifacts.is_dir() else 0
            sources["registry"] = {"db": str(registry_db.resolve()),
                                   "root": str(registry_db.parent.resolve()), "artifacts": n}
    for _, path, rel in local_dirs:
        if writer.put_dir(path, rel) == 0:
            raise BackupError(f"{path}: an empty directory")
    manifest = {"format": FORMAT, "created_at": started, "finished_at": time.time(),
                "sources": sources, "files": writer.files}
    writer.finish(manifest)
    return manifest


# ----------------------------------------------------------------------------- restore


def read_manifest(src: str | Path) -> tuple[Any, str, dict[str, Any]]:
    """(filesystem, root, manifest) of a backup; BackupError when it is not one."""
    from pyarrow import fs

    filesystem, root = _filesystem(src)
    if filesystem.get_file_info(f"{root}/{MANIFEST}").type != fs.FileType.File:
        raise BackupError(f"{src}: no {MANIFEST} (not a backup, or an incomplete one)")
    with filesystem.open_input_stream(f"{root}/{MANIFEST}") as f:
        raw = f.read()
    try:
        manifest = json.loads(raw)
        files = manifest["files"]
        if not all({"path", "size", "sha256"} <= set(e) for e in files):
            raise ValueError("a file entry lacks path, size or sha256")
    except (ValueError, KeyError, TypeError) as e:
        raise BackupError(f"{src}/{MANIFEST}: malformed ({e})") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{src}/{MANIFEST}: format {manifest.get('format')!r}, this "
                          f"version reads {FORMAT}")
    for entry in files:
        rel = Path(entry["path"])
        if rel.is_absolute() or ".." in rel.parts:
            raise BackupError(f"{src}/{MANIFEST}: file path {entry['path']!r} leaves the "
                              "backup")
    return filesystem, root, manifest


def _copy_verified(filesystem: Any, root: str, entry: dict[str, Any], dst: Path) -> None:
    rel = entry["path"]
    dst.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    try:
        with filesystem.open_input_stream(f"{root}/{rel}") as f, open(dst, "wb") as out:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except (FileNotFoundError, OSError) as e:
        raise BackupError(f"corrupt backup: {rel}: missing or unreadable "
                          f"({type(e).__name__})") from None
    if size != entry["size"] or digest.hexdigest() != entry["sha256"]:
        raise BackupError(f"corrupt backup: {rel}: checksum mismatch (sha256 "
                          f"{digest.hexdigest()[:12]}..., manifest {entry['sha256'][:12]}...,"
                          f" {size} vs {entry['size']} bytes)")


def relocate_registry(db: Path, old_root: str, new_root: str) -> int:
    """Point a restored MLflow store's artifact locations from ``old_root`` (the original
    database's directory) to ``new_root``; returns the number of values changed."""
    old_uri, new_uri = Path(old_root).as_uri(), Path(new_root).as_uri()
    conn = sqlite3.connect(str(db))
    changed = 0
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE "
                                             "type = 'table'")}
        for table, column in LOCATION_COLUMNS:
            if table not in tables:
                continue
            cols = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
            if column not in cols:
                continue
            for old, new in ((old_uri, new_uri), (old_root, new_root)):
                cur = conn.execute(
                    f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
                    f'WHERE substr("{column}", 1, ?) = ? AND (length("{column}") = ? OR '
                    f'substr("{column}", ?, 1) = \'/\')',
                    (new, len(old) + 1, len(old), old, len(old), len(old) + 1))
                changed += cur.rowcount
        conn.commit()
    finally:
        conn.close()
    return changed


def restore(src: str | Path, into: str | Path) -> dict[str, Any]:
    """Verify and restore a backup into the new directory ``into``; returns the manifest with
    ``files`` and ``next_steps`` (how to point the service and the loop at it)."""
    filesystem, root, manifest = read_manifest(src)
    target = Path(into).expanduser().resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BackupError(f"--into {into}: exists and is not empty; restore into a fresh "
                          "directory")
    staging = target.parent / f".{target.name}.restoring-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for entry in manifest["files"]:
            _copy_verified(filesystem, root, entry, staging / entry["path"])
        reg = manifest["sources"].get("registry")
        if reg is not None:
            relocate_registry(staging / REGISTRY_DB, reg["root"],
                              str((target / REGISTRY_DB).parent))
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    steps = []
    if "feedback_db" in manifest["sources"]:
        steps.append(f"feedback database: {target / FEEDBACK_FILE} (cloudrl serve "
                     f"--state-db {target / FEEDBACK_FILE})")
    if reg is not None:
        steps.append(f"registry: export MLFLOW_TRACKING_URI=sqlite:///{target / REGISTRY_DB}")
    for rel, spec in manifest["sources"].get("checkpoints", {}).items():
        steps.append(f"checkpoint {spec}: {target / rel}")
    return {**manifest, "next_steps": steps}


__all__ = ["BackupError", "backup", "read_manifest", "relocate_registry", "restore",
           "sqlite_snapshot"]
