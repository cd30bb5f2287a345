"""The Delta log read and written as the protocol has it, for what delta-rs cannot do: commits
that carry deletion vectors (its ``AddAction`` and ``RemoveAction`` hold none, and a remove
of a file without its DV leaves the file live).

``replay`` gives a version's live add actions as the log holds them (descriptor, stats, tags),
its protocol and its metadata, from the newest checkpoint at or before it and the commits
since; each table's last replay is kept and moved forward commit by commit. ``commit`` writes
a version create-only (a hard link on a local disk, a put with ``If-None-Match: *`` in a
bucket): it checks the commits since the version it read for a conflict (a file it removes
removed, a transaction id it sets set, the protocol or metadata changed) and raises
``CommitFailedError``, so callers retry as they do for delta-rs's own.
"""

import json
import os
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError

from cdc_platform.lake import storage
from cdc_platform.lake.deletion_vectors import ENABLE_PROPERTY, FEATURE, Descriptor

_LOG = "_delta_log"
_ATTEMPTS = 50  # versions a commit tries past its read version before giving up


@dataclass
class Replayed:
    """One version of a table, as the log holds it."""

    version: int
    protocol: dict[str, Any]
    metadata: dict[str, Any]
    adds: dict[str, dict[str, Any]] = field(default_factory=dict)  # path in the log -> add
    stamp: tuple = ()  # its commit file's (``_stamp``): a table made anew has another

    @property
    def has_feature(self) -> bool:
        return FEATURE in (self.protocol.get("readerFeatures") or [])

    @property
    def enabled(self) -> bool:
        return (self.metadata.get("configuration") or {}).get(ENABLE_PROPERTY) == "true"

    def deletion_vectors(self) -> dict[str, Descriptor]:
        """Each live file that has a DV: its path in the log -> the descriptor."""
        return {
            p: Descriptor.from_json(a["deletionVector"])
            for p, a in self.adds.items()
            if a.get("deletionVector")
        }

    def apply(self, actions: Iterable[dict[str, Any]]) -> None:
        """One commit's actions: its removes, then its adds (a file's DV changes by both)."""
        actions = list(actions)
        for a in actions:
            if "remove" in a:
                self.adds.pop(a["remove"]["path"], None)
        for a in actions:
            if "add" in a:
                self.adds[a["add"]["path"]] = a["add"]
            elif "protocol" in a:
                self.protocol = a["protocol"]
            elif "metaData" in a:
                self.metadata = a["metaData"]


class _Replays(threading.local):
    def __init__(self) -> None:
        self.newest: dict[str, Replayed] = {}


_replays = _Replays()


def _json_name(version: int) -> str:
    return f"{version:020d}.json"


def _read_commit(fs: pafs.FileSystem, log: str, version: int) -> list[dict[str, Any]]:
    with fs.open_input_stream(f"{log}/{_json_name(version)}") as f:
        text = f.read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def replay(uri: str, version: int) -> Replayed:
    """Version ``version`` of the table at ``uri``."""
    fs, base = storage.filesystem(uri)
    log = f"{base}/{_LOG}"
    known = _replays.newest.get(uri)
    if known is None or known.version > version or _stamp(fs, log, known.version) != known.stamp:
        known = _from_checkpoint(fs, log, version)
    for v in range(known.version + 1, version + 1):
        known.apply(_read_commit(fs, log, v))
        known.version = v
    known.stamp = _stamp(fs, log, known.version)
    _replays.newest[uri] = known
    return _copy(known)


def _stamp(fs: pafs.FileSystem, log: str, version: int) -> tuple:
    """What tells a commit file from another of the same name (a table deleted and made anew):
    its modification time and size."""
    if version < 0:
        return ()
    info = fs.get_file_info(f"{log}/{_json_name(version)}")
    return (info.mtime_ns, info.size) if info.type == pafs.FileType.File else ("gone",)


def _copy(r: Replayed) -> Replayed:
    return Replayed(r.version, r.protocol, r.metadata, dict(r.adds), r.stamp)


def _from_checkpoint(fs: pafs.FileSystem, log: str, version: int) -> Replayed:
    """The newest checkpoint at or before ``version`` (none: an empty table before version 0)."""
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(log))]
    points: dict[int, list[str]] = {}
    for n in names:
        if ".checkpoint." in n and n.endswith(".parquet"):
            v = int(n.split(".", 1)[0])
            if v <= version:
                points.setdefault(v, []).append(n)
    start = Replayed(-1, {}, {})
    complete = [v for v, parts in points.items() if len(parts) == _parts(parts[0])]
    if not complete:
        return start
    at = max(complete)
    start.version = at
    for part in sorted(points[at]):
        table = pq.read_table(
            f"{log}/{part}", filesystem=fs, columns=["add", "protocol", "metaData"]
        )
        for column in ("protocol", "metaData"):
            for row in table.column(column).to_pylist():
                if row:
                    start.apply([{column: _clean(row)}])
        for row in table.column("add").to_pylist():
            if row:
                start.adds[row["path"]] = _clean(row)
    return start


def _parts(name: str) -> int:
    """How many files a checkpoint has (``<v>.checkpoint.<i>.<n>.parquet``: n; else 1)."""
    pieces = name.split(".")
    return int(pieces[3]) if len(pieces) == 5 else 1


_MAPS = {"partitionValues", "tags", "configuration", "options"}


def _clean(value: Any, key: str | None = None) -> Any:
    """A checkpoint's action as its JSON would be: maps as objects, no null fields."""
    if isinstance(value, dict):
        return {k: _clean(v, k) for k, v in value.items() if v is not None}
    if key in _MAPS and isinstance(value, list):
        return dict(value)
    return value


def remove_of(add: dict[str, Any], now: int) -> dict[str, Any]:
    """The remove of a live file exactly as it is (its DV included: a file's identity)."""
    remove = {
        "path": add["path"], "deletionTimestamp": now, "dataChange": True,
        "extendedFileMetadata": True, "partitionValues": add.get("partitionValues") or {},
        "size": add["size"],
    }  # fmt: skip
    for k in ("tags", "deletionVector", "baseRowId", "defaultRowCommitVersion"):
        if add.get(k) is not None:
            remove[k] = add[k]
    return {"remove": remove}


def with_deletion_vector(add: dict[str, Any], dv: Descriptor) -> dict[str, Any]:
    """``add`` again with ``dv``: its stats keep the physical row count, no longer tight."""
    again = {k: v for k, v in add.items() if v is not None}
    again["deletionVector"] = dv.to_json()
    if add.get("stats"):
        stats = json.loads(add["stats"])
        stats["tightBounds"] = False
        again["stats"] = json.dumps(stats)
    return {"add": again}


def enabling(r: Replayed) -> list[dict[str, Any]]:
    """The protocol and metadata actions that let the table hold deletion vectors (reader 3,
    writer 7, the feature, ``delta.enableDeletionVectors``); none when it has them."""
    out = []
    if not r.has_feature:
        reader = list(r.protocol.get("readerFeatures") or [])
        writer = list(r.protocol.get("writerFeatures") or [])
        if r.protocol.get("minWriterVersion", 2) < 7:
            # Writer 2's features, listed: a writer-7 table names every feature it uses.
            writer += ["appendOnly", "invariants"]
        protocol = {
            "minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": sorted({*reader, FEATURE}),
            "writerFeatures": sorted({*writer, FEATURE}),
        }  # fmt: skip
        out.append({"protocol": protocol})
    if not r.enabled:
        metadata = dict(r.metadata)
        metadata["configuration"] = {
            **(r.metadata.get("configuration") or {}),
            ENABLE_PROPERTY: "true",
        }
        out.append({"metaData": metadata})
    return out


def commit(
    uri: str,
    read_version: int,
    actions: list[dict[str, Any]],
    *,
    operation: str,
    custom: dict[str, str] | None = None,
    txns: dict[str, int] | None = None,
) -> int:
    """Commit ``actions`` (and ``txns``: app id -> version) against ``read_version``; returns
    the version written. ``custom``: commit metadata, as delta-rs's ``custom_metadata``."""
    now = int(time.time() * 1000)
    info = {
        "timestamp": now, "operation": operation, "operationParameters": {},
        "readVersion": read_version, "isBlindAppend": False,
        "clientVersion": "cdc-platform", **(custom or {}),
    }  # fmt: skip
    txn = [{"txn": {"appId": a, "version": v, "lastUpdated": now}} for a, v in (txns or {}).items()]
    body = "\n".join(json.dumps(a) for a in [{"commitInfo": info}, *actions, *txn]) + "\n"
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    fs, base = storage.filesystem(uri)
    log = f"{base}/{_LOG}"
    version = read_version + 1
    for _ in range(_ATTEMPTS):
        if _put_if_absent(uri, f"{_LOG}/{_json_name(version)}", body.encode()):
            _checkpoint_if_due(uri, version)
            return version
        _check(_read_commit(fs, log, version), removed, set(txns or {}), uri, version)
        version += 1
    raise CommitFailedError(f"{uri}: no free version after {_ATTEMPTS} tries")


def _check(won: list[dict[str, Any]], removed: set[str], apps: set[str], uri: str, v: int):
    """Raise when the commit ``won`` (version ``v``) conflicts with ours."""
    for a in won:
        if "remove" in a and a["remove"]["path"] in removed:
            raise CommitFailedError(f"{uri}: version {v} removed a file this commit changes")
        if "txn" in a and a["txn"]["appId"] in apps:
            raise CommitFailedError(f"{uri}: version {v} set transaction {a['txn']['appId']}")
        if "metaData" in a or "protocol" in a:
            raise CommitFailedError(f"{uri}: version {v} changed the table's metadata")


def _put_if_absent(uri: str, relative: str, data: bytes) -> bool:
    """Write ``relative`` (below the table) unless it exists (False then), atomically: no
    reader sees part of it."""
    if storage.is_remote(uri):
        return storage.put_if_absent(uri, relative, data)
    path = os.path.join(uri, relative)
    hidden = os.path.join(os.path.dirname(path), f".{uuid.uuid4().hex}.tmp")
    with open(hidden, "wb") as out:
        out.write(data)
    try:
        os.link(hidden, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(hidden)


def _checkpoint_if_due(uri: str, version: int) -> None:
    """A checkpoint at the table's interval, as delta-rs's own commits make (it keeps DVs)."""
    from cdc_platform.lake.tables import open_table

    dt = open_table(uri, version)
    interval = int(dt.metadata().configuration.get("delta.checkpointInterval", "100"))
    if version % interval == 0:
        dt.create_checkpoint()
