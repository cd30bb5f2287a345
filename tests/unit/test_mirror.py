"""A folder copied to another location, only what changed (cdc_platform/lake/mirror.py), here
between two local folders; tests/s3/test_data_docs_site.py copies to a bucket."""

import os

from cdc_platform.lake.mirror import mirror


def _tree(folder) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_only_changed_files_are_put_and_dropped_ones_deleted(tmp_path):
    site, copy, record = tmp_path / "site", tmp_path / "copy", tmp_path / "record.json"
    (site / "a").mkdir(parents=True)
    (site / "index.html").write_text("v1")
    (site / "a" / "page.html").write_text("page")
    (site / "a" / "old.html").write_text("old")
    assert mirror(site, str(copy), record) == (3, 0)
    assert _tree(copy) == _tree(site)
    assert mirror(site, str(copy), record) == (0, 0)

    (site / "a" / "page.html").write_text("page")  # the same bytes again (a rebuild)
    os.utime(site / "a" / "page.html", ns=(10**18, 10**18))
    (site / "index.html").write_text("v2")
    (site / "a" / "old.html").unlink()
    assert mirror(site, str(copy), record) == (1, 1)
    assert _tree(copy) == _tree(site)

    (copy / "index.html").unlink()  # lost at the location: put again
    assert mirror(site, str(copy), record) == (1, 0)
    assert mirror(site, str(tmp_path / "elsewhere"), record) == (2, 0)  # another location
