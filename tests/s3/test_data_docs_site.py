"""The Data Docs site in a bucket (CDC_REPORTS_SITE on SeaweedFS): each publish copies what
changed in the site, and what the site drops goes from the bucket too."""

import pytest

from cdc_platform.lake import storage
from cdc_platform.quality import docs
from tests.quality.data_docs import CURRENT, RUN_ID, balance_run

pytestmark = pytest.mark.s3


def _bucket_files(location: str) -> dict[str, bytes]:
    fs, base = storage.filesystem(location)
    return {
        f.path: fs.open_input_stream(f"{base}/{f.path}").readall()
        for f in storage.list_files(location)
    }


def _local_files(folder) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_each_publish_copies_the_changed_site_into_the_bucket(
    s3_server, s3_bucket, tmp_path, monkeypatch
):
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    site = f"s3://{s3_bucket}/data_docs"
    monkeypatch.setenv("CDC_REPORTS_SITE", site)
    monkeypatch.setenv("CDC_REPORTS_KEEP", "1")
    reports = tmp_path / "reports"
    subject = docs.Subject(asset=CURRENT, batch="merge", run_id=RUN_ID)

    first = next(iter(docs.publish([(balance_run(2), subject)], reports).values()))
    assert _bucket_files(site) == _local_files(docs.site_dir(reports))
    assert "index.html" in _bucket_files(site)

    before = s3_server.requests().get("PUT", 0)
    second = docs.publish([(balance_run(3), subject)], reports)
    puts = s3_server.requests().get("PUT", 0) - before
    assert _bucket_files(site) == _local_files(docs.site_dir(reports))
    old_page = first.relative_to(docs.site_dir(reports)).as_posix()
    assert old_page not in _bucket_files(site)  # pruned (keep 1) here and there
    # The new page, the suite's page and the index, not the site's 100-odd vendored files.
    assert len(second) == 1 and puts < 10
