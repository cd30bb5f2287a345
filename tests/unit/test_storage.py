"""Locations and options of the lake's storage (cdc_platform/lake/storage.py), without a server:
what a location is, how options resolve, and what a user is told."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cdc_platform.catalog import CatalogError, load_catalog
from cdc_platform.lake import storage


def test_a_location_is_a_local_path_made_absolute_or_an_s3_uri_as_it_is(tmp_path):
    assert storage.resolve("var/w", tmp_path) == str(tmp_path / "var" / "w")
    assert storage.resolve("s3://lake/w/", tmp_path) == "s3://lake/w"
    assert storage.join("s3://lake/w", "raw", "shop") == "s3://lake/w/raw/shop"
    assert storage.join(str(tmp_path), "raw") == str(tmp_path / "raw")
    assert storage.relative("s3://lake/w/raw/x.parquet", "s3://lake/w") == "raw/x.parquet"
    assert storage.name("s3://lake/w/current/shop/orders") == "orders"
    assert storage.delta_options(str(tmp_path)) is None


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("hdfs://nn/w", "unknown storage scheme hdfs://"),
        ("gcs://lake/w", "unknown storage scheme gcs://"),
        ("s3:///w", "needs a bucket"),
        ("az:///w", "needs a bucket"),
    ],
)
def test_a_location_the_lake_cannot_use_is_one_line(tmp_path, location, message):
    with pytest.raises(storage.StorageError, match=message):
        storage.resolve(location, tmp_path)


def test_each_store_gets_its_own_options_and_its_container_from_the_uri(monkeypatch):
    """delta-rs's and obstore's clients refuse another store's keys: each URI gets only its
    store's, and an abfss:// URI names its account (taken when none is set)."""
    for name, value in {
        "AWS_REGION": "eu-west-1",
        "AZURE_STORAGE_ACCOUNT_KEY": "k",
        "GOOGLE_SERVICE_ACCOUNT": "/sa.json",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    assert storage.delta_options("s3://lake/w") == {"AWS_REGION": "eu-west-1"}
    abfss = "abfss://lake@acct.dfs.core.windows.net/w"
    assert storage.delta_options(abfss) == {
        "AZURE_STORAGE_ACCOUNT_KEY": "k",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
    }
    assert storage.delta_options("gs://lake/w") == {"GOOGLE_SERVICE_ACCOUNT": "/sa.json"}
    assert storage.filesystem(abfss)[1] == "lake/w"  # the container, not container@account
    with pytest.raises(storage.StorageError, match="AZURE_STORAGE_ACCOUNT_NAME is not set"):
        storage.delta_options("az://lake/w")


def test_options_come_from_the_environment_under_the_sources_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("LAKE_SECRET", "s3cr3t")
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "warehouse: s3://lake/w\nstorage_options:\n  AWS_ACCESS_KEY_ID: mine\n"
        "  AWS_SECRET_ACCESS_KEY: ${LAKE_SECRET}\nsources: []\n"
    )
    try:
        catalog = load_catalog(sources)
        assert catalog.warehouse_uri == "s3://lake/w"
        got = storage.options()
        assert (got["AWS_REGION"], got["AWS_ACCESS_KEY_ID"]) == ("eu-west-1", "mine")
        assert got["AWS_SECRET_ACCESS_KEY"] == "s3cr3t"
        assert "s3cr3t" not in catalog.model_dump_json()  # the file's text, not the value
    finally:
        storage.configure({})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("  AWS_SECRET: x\n", "storage_options: unknown option AWS_SECRET"),
        ("  AWS_SECRET_ACCESS_KEY: ${NOT_SET_ANYWHERE}\n", "NOT_SET_ANYWHERE is unset"),
    ],
)
def test_a_bad_storage_option_is_one_line(tmp_path, options, message):
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"storage_options:\n{options}sources: []\n")
    with pytest.raises(CatalogError, match=message):
        load_catalog(sources)


def test_a_store_that_does_not_answer_is_transient_and_a_refusal_is_not():
    timeout = "AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 28, Timeout"
    assert "unavailable" in storage.unavailable_reason(timeout)
    assert storage.unavailable_reason("AWS Error ACCESS_DENIED during PutObject") is None


def test_a_local_folder_needs_no_check(tmp_path):
    storage.check(str(Path(tmp_path, "absent")))  # created by the first write


# Names chosen so that folder order and path order differ: "-" and "." sort before "/".
_NAMES = st.sampled_from(["a", "a-b", "a.b", "b", "dt=2026-12-01", "dt=2026-12-010", ".x"])


@given(
    tree=st.sets(st.lists(_NAMES, min_size=1, max_size=3).map("/".join), max_size=12),
    after=st.one_of(st.none(), st.lists(_NAMES, min_size=1, max_size=3).map("/".join)),
)
@example(tree={"a/b", "a-b"}, after="a")  # "a-b" sorts after "a" but before "a/b"
def test_a_local_listing_after_a_path_is_every_later_file_in_path_order(tree, after):
    with tempfile.TemporaryDirectory() as root:
        files = set()
        for path in sorted(tree, key=len, reverse=True):  # deepest first: a file never shadows
            target = Path(root, path)
            if target.exists() or any(
                Path(root, *path.split("/")[:i]).is_file() for i in range(1, path.count("/") + 1)
            ):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path)
            files.add(path)
        listed = storage.list_files(root, after)
    expected = sorted(p for p in files if after is None or p > after)
    assert [f.path for f in listed] == expected
    assert all(f.size == len(f.path) for f in listed)
