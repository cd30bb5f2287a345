"""A local folder copied to a location (a bucket prefix, or another folder), only what changed:
how the Data Docs site, built locally by Great Expectations, reaches the lake's bucket.

A file is put when the location lacks it, holds another size, or its content changed since the
last copy: a record beside the folder keeps each file's size, mtime and SHA-1 as last put, so
a file rewritten with the same bytes (GX copies its static files on every build) is not put
again, and only a file whose size or mtime moved is read to tell.
"""

import hashlib
import json
from pathlib import Path

from cdc_platform.lake import storage


def mirror(folder: Path, location: str, record: Path) -> tuple[int, int]:
    """Make ``location`` hold what ``folder`` holds: put what changed, delete what ``folder``
    no longer has. One listing of each side, a request per file put, one per 1,000 deleted.
    ``record``: the copy's record (JSON). Returns (files put, deleted)."""
    here = {f.path: f for f in storage.list_files(str(folder))}
    there = {f.path: f for f in storage.list_files(location)}
    sent = _read(record, location)
    put = 0
    for path, f in here.items():
        last = sent.get(path)
        if last is not None and (last[0], last[1]) == (f.size, f.mtime_ns):
            digest = last[2]
        else:
            digest = hashlib.sha1((folder / path).read_bytes()).hexdigest()
        known = path in there and there[path].size == f.size
        if not (known and last is not None and last[2] == digest):
            storage.write_whole(storage.join(location, path), (folder / path).read_bytes())
            put += 1
        sent[path] = [f.size, f.mtime_ns, digest]
    gone = [p for p in there if p not in here]
    if gone:
        storage.delete_files(location, gone)
    for path in list(sent):
        if path not in here:
            del sent[path]
    record.write_text(json.dumps({"location": location, "files": sent}))
    return put, len(gone)


def _read(record: Path, location: str) -> dict[str, list]:
    """The record of the last copy to ``location`` (none: empty)."""
    try:
        data = json.loads(record.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data.get("files", {}) if data.get("location") == location else {}
