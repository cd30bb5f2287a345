"""Landing files listed in a bucket (SeaweedFS on loopback) as a sensor tick lists them: from a
name on (S3's start-after), so that a tick's requests follow what is new, not the landing tree."""

import pytest

from cdc_platform.ingest import landing

pytestmark = pytest.mark.s3
DAY, NEXT = "2026-12-01", "2026-12-02"
FILES = 1_001  # one more than a listing request returns


@pytest.fixture
def landed(s3_server, s3_bucket, monkeypatch):
    """A source's landing prefix: FILES files on DAY, 2 on NEXT, a file being written (hidden)
    and one outside any dt= folder."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    fs = s3_server.filesystem()
    names = [f"dt={DAY}/{i:05d}.jsonl" for i in range(FILES)]
    names += [f"dt={NEXT}/00000.jsonl", f"dt={NEXT}/sub/00001.jsonl"]
    for name in [*names, f"dt={NEXT}/.00002.jsonl.tmp", "README"]:
        with fs.open_output_stream(f"{s3_bucket}/landing/src/{name}") as out:
            out.write(name.encode())
    return f"s3://{s3_bucket}/landing/src", names


def _lists(s3_server, listing) -> tuple[list[str], int]:
    before = s3_server.requests().get("LIST", 0)
    found = [f.name for f in listing()]
    return found, s3_server.requests().get("LIST", 0) - before


def test_a_listing_from_a_name_on_asks_for_what_follows_it_alone(s3_server, landed):
    source, names = landed
    every, requests = _lists(s3_server, lambda: landing.files_after(source, None))
    assert every == names and requests == 2  # 1,004 keys: two pages

    last = names[FILES - 1]  # the last file of DAY, listed again (it may have grown)
    after, requests = _lists(s3_server, lambda: landing.files_after(source, last[:-1]))
    assert after == names[FILES - 1 :] and requests == 1

    day, _ = _lists(s3_server, lambda: landing.files_for_date(source, NEXT))
    assert day == names[FILES:]
    listed = landing.files_after(source, last)
    assert [(f.name, f.size) for f in listed] == [(n, len(n)) for n in names[FILES:]]
    assert listed[0].location == f"{source}/dt={NEXT}/00000.jsonl"


def test_a_listing_the_store_refuses_is_one_line(s3_server, landed, monkeypatch):
    source, _ = landed
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(landing.LandingError, match=f"cannot list landing folder {source}: ") as e:
        landing.files_after(source, None)
    assert "\n" not in str(e.value).split(": ", 1)[0]
    assert "not-the-secret" not in str(e.value)
