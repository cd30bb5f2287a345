"""Where the lake's bytes live: a local folder (a path) or object storage (``s3://bucket/prefix``,
S3 or S3-compatible; ``az://container/prefix`` or ``abfss://container@account.dfs.core.windows.net/
prefix``, Azure Blob Storage / ADLS Gen2; ``gs://bucket/prefix``, Google Cloud Storage), and how
to reach it.

Every location of the lake (the warehouse, a landing folder, the Data Docs site's copy) is a
string: a local path, or a URI. The options use the names delta-rs and object_store read
(``AWS_*``, ``AZURE_*``, ``GOOGLE_*``: ``S3_OPTIONS``, ``AZURE_OPTIONS``, ``GCS_OPTIONS``): the
environment's, under those the sources file sets (``storage_options``, ``configure``). The
Delta log goes through delta-rs with them (``delta_options``); data files and landing files
through pyarrow's filesystem (``filesystem``), on the driver and in Spark's executors alike
(Spark's own readers reach no bucket: pyspark ships no hadoop-aws, hadoop-azure or GCS
connector). Files are listed by ``list_files``, in a bucket through obstore (object_store, as
delta-rs): pyarrow's listing has no start-after, and a listing that can start after a key costs
what is new, not the whole tree. Secrets stay in these options: nothing here logs them, and
errors name the variable, never its value.
"""

import functools
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import obstore
import pyarrow.fs as pafs
from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import AzureStore, GCSStore, S3Store

S3_OPTIONS = (
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ALLOW_HTTP",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
)
AZURE_OPTIONS = (
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_ID",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_STORAGE_TENANT_ID",
    "AZURE_STORAGE_ENDPOINT",  # an emulator's or a private endpoint: http://host:port/account
    "AZURE_ALLOW_HTTP",
)
# delta-rs and obstore only: pyarrow's GCS client (the executors') takes Google's default
# credentials of each machine (GOOGLE_APPLICATION_CREDENTIALS, or the VM's service account).
GCS_OPTIONS = (
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
OPTION_NAMES = S3_OPTIONS + AZURE_OPTIONS + GCS_OPTIONS
_OPTIONS = {"s3": S3_OPTIONS, "azure": AZURE_OPTIONS, "gcs": GCS_OPTIONS}
# A URI's scheme -> its store, as delta-rs's and object_store's URLs name them.
_STORES = {"s3": "s3", "s3a": "s3", "az": "azure", "abfs": "azure", "abfss": "azure", "gs": "gcs"}
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_configured: dict[str, str] = {}


class StorageError(Exception):
    """A location the lake cannot use: its one line names the location and the problem."""


def configure(options: Mapping[str, str]) -> None:
    """The sources file's ``storage_options`` (``${VAR}`` taken from the environment), over the
    environment's own for this process."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise StorageError(
            f"storage_options: unknown option {unknown[0]} (known: {', '.join(OPTION_NAMES)})"
        )
    resolved = {}
    for name, value in options.items():
        missing = [v for v in _VARIABLE.findall(str(value)) if v not in os.environ]
        if missing:
            raise StorageError(
                f"storage_options.{name}: environment variable {missing[0]} is unset"
            )
        resolved[name] = _VARIABLE.sub(lambda m: os.environ[m[1]], str(value))
    _configured.clear()
    _configured.update(resolved)


def options() -> dict[str, str]:
    """The object-store options in force: the environment's, under the configured ones."""
    found = {n: os.environ[n] for n in OPTION_NAMES if os.environ.get(n)}
    return {**found, **_configured}


def store_kind(location: str | os.PathLike) -> str | None:
    """``"s3"``, ``"azure"`` or ``"gcs"`` for an object-store URI; None for a local path or
    ``file://``. Any other scheme is refused: taken as a path, it would be a local folder named
    after it."""
    scheme = urlparse(str(location)).scheme
    if scheme in _STORES:
        return _STORES[scheme]
    if len(scheme) > 1 and scheme != "file":  # one letter: a Windows drive
        raise StorageError(
            f"{location}: unknown storage scheme {scheme}:// (the lake takes a local path, "
            "s3://, az://, abfss:// or gs://)"
        )
    return None


def is_remote(location: str | os.PathLike) -> bool:
    """Whether ``location`` is an object-store URI (not a local path or ``file://``)."""
    return store_kind(location) is not None


def _bucket(location: str) -> str:
    """The bucket (S3, GCS) or container (Azure) of a URI: abfss:// names it before the @."""
    return urlparse(location).netloc.split("@", 1)[0]


def resolve(location: str | os.PathLike, base: Path) -> str:
    """A location as the lake keeps it: a URI as it is (without a trailing /), a local path
    absolute (relative ones to ``base``)."""
    text = str(location)
    if is_remote(text):
        if not _bucket(text):
            raise StorageError(f"{text}: an object-store location needs a bucket (s3://bucket/…)")
        return text.rstrip("/")
    p = Path(text.removeprefix("file://")).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def join(location: str, *parts: str) -> str:
    """``location`` with ``parts`` below it."""
    if is_remote(location):
        return "/".join([location.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(location, *parts))


def name(location: str) -> str:
    """The last part of a location (a table's name)."""
    return location.rstrip("/").rsplit("/", 1)[-1]


def relative(location: str, under: str) -> str:
    """``location``'s path below ``under``."""
    if is_remote(location):
        return location.removeprefix(under.rstrip("/") + "/")
    return os.path.relpath(os.path.abspath(location), os.path.abspath(under))


def delta_options(location: str) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for a table at ``location`` (None: a local path)."""
    return dict(_remote_settings(location)) if is_remote(location) else None


@functools.lru_cache(maxsize=8)
def _s3(settings: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    o = dict(settings)
    endpoint = o.get("AWS_ENDPOINT_URL")
    return pafs.S3FileSystem(
        access_key=o.get("AWS_ACCESS_KEY_ID"),
        secret_key=o.get("AWS_SECRET_ACCESS_KEY"),
        session_token=o.get("AWS_SESSION_TOKEN"),
        region=o.get("AWS_REGION") or o.get("AWS_DEFAULT_REGION"),
        endpoint_override=endpoint,
        scheme="http" if endpoint and endpoint.startswith("http://") else "https",
        force_virtual_addressing=o.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() == "true",
        # A store that stops answering fails the request (a transient error, retried by the
        # step) instead of hanging the run.
        connect_timeout=5,
        request_timeout=30,
    )


@functools.lru_cache(maxsize=8)
def _azure(settings: tuple[tuple[str, str], ...]) -> pafs.AzureFileSystem:
    o = dict(settings)
    at = urlparse(o.get("AZURE_STORAGE_ENDPOINT", ""))  # http://host:port/account
    authority = {"blob_storage_authority": at.netloc, "dfs_storage_authority": at.netloc}
    schemes = {"blob_storage_scheme": at.scheme, "dfs_storage_scheme": at.scheme}
    return pafs.AzureFileSystem(
        o["AZURE_STORAGE_ACCOUNT_NAME"],
        account_key=o.get("AZURE_STORAGE_ACCOUNT_KEY"),
        sas_token=o.get("AZURE_STORAGE_SAS_TOKEN"),
        client_id=o.get("AZURE_STORAGE_CLIENT_ID"),
        client_secret=o.get("AZURE_STORAGE_CLIENT_SECRET"),
        tenant_id=o.get("AZURE_STORAGE_TENANT_ID"),
        **(authority | schemes if at.netloc else {}),
    )


@functools.lru_cache(maxsize=8)
def _gcs(settings: tuple[tuple[str, str], ...]) -> pafs.GcsFileSystem:
    return pafs.GcsFileSystem(retry_time_limit=timedelta(seconds=30))


def filesystem(
    location: str, settings: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for ``location`` and the location's path on it. ``settings``: the
    options (default: ``options()``), as a Spark task gets them from the driver."""
    kind = store_kind(location)
    if kind is None:
        return pafs.LocalFileSystem(), os.path.abspath(location.removeprefix("file://"))
    client = {"s3": _s3, "azure": _azure, "gcs": _gcs}[kind]
    fs = client(_remote_settings(location, settings))
    return fs, _bucket(location) + urlparse(location).path.rstrip("/")


# The options that sign requests, by store: with none of them and an endpoint of its own, a
# client would ask an instance metadata endpoint for a role and hang. On the cloud itself (no
# endpoint) the SDK's default chain (an IAM role, a managed identity) may serve.
_SECRETS = {
    "s3": ("AWS_ACCESS_KEY_ID",),
    "azure": (
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_CLIENT_SECRET",
    ),
    "gcs": (),
}
_ENDPOINTS = {"s3": "AWS_ENDPOINT_URL", "azure": "AZURE_STORAGE_ENDPOINT"}


def _remote_settings(
    location: str, settings: Mapping[str, str] | None = None
) -> tuple[tuple[str, str], ...]:
    """The options of ``location``'s store (delta-rs's and obstore's clients refuse another's)."""
    kind = store_kind(location)
    given = options() if settings is None else settings
    chosen = {k: v for k, v in given.items() if k in _OPTIONS[kind]}
    secrets = _SECRETS[kind]
    keyless = secrets and not any(chosen.get(s) or s in os.environ for s in secrets)
    if keyless and chosen.get(_ENDPOINTS.get(kind, "")):
        raise StorageError(f"{location}: {secrets[0]} is not set")
    if kind == "azure" and "AZURE_STORAGE_ACCOUNT_NAME" not in chosen:
        host = urlparse(location).netloc.partition("@")[2]  # abfss://container@account.dfs…
        if not host:
            raise StorageError(f"{location}: AZURE_STORAGE_ACCOUNT_NAME is not set")
        chosen["AZURE_STORAGE_ACCOUNT_NAME"] = host.split(".", 1)[0]
    return tuple(sorted(chosen.items()))


def endpoint(location: str) -> str:
    """Where ``location``'s store answers, for messages (no secret in it)."""
    kind = store_kind(location)
    o = options()
    if kind == "s3":
        return o.get("AWS_ENDPOINT_URL", "the default AWS endpoint")
    if kind == "azure":
        account = o.get("AZURE_STORAGE_ACCOUNT_NAME") or urlparse(location).netloc.partition("@")[2]
        return o.get("AZURE_STORAGE_ENDPOINT", f"the account {account.split('.', 1)[0]!r}")
    return "Google Cloud Storage"


@dataclass(frozen=True)
class FileEntry:
    """A file as a listing gives it: its path below the listed location, size and mtime."""

    path: str
    size: int
    mtime_ns: int


def list_files(location: str, start_after: str | None = None) -> list[FileEntry]:
    """Every file below ``location`` (at any depth) whose path below it sorts after
    ``start_after``, in path order. In a bucket: one request (ListObjectsV2 with start-after)
    per 1,000 such keys; locally, only the folders that can hold such a path are read."""
    if not is_remote(location):
        root = os.path.abspath(location.removeprefix("file://"))
        found = list(_local_files(root, "", start_after))
    else:
        found = _object_files(location, start_after)
    return sorted(found, key=lambda f: f.path)  # a folder's own order is by name, not by path


def _object_files(location: str, start_after: str | None) -> list[FileEntry]:
    store, prefix = _store_of(location)
    found = []
    try:
        offset = prefix + start_after if start_after is not None else None
        for chunk in obstore.list(store, prefix or None, offset=offset):
            found += [
                FileEntry(m["path"][len(prefix) :], m["size"], _ns(m["last_modified"]))
                for m in chunk
            ]
    except Exception as e:  # obstore's errors are not OSError: raised as the listing's
        raise OSError(f"cannot list {location}: {e}") from None
    return found


def _ns(when) -> int:
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def _local_files(root: str, below: str, start_after: str | None) -> Iterator[FileEntry]:
    """The files under ``root/below`` after ``start_after`` (paths below ``root``), in path
    order: a folder is read only when a path in it can sort after ``start_after``."""
    try:
        entries = sorted(os.scandir(os.path.join(root, below)), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        path = f"{below}{entry.name}"
        if entry.is_dir():
            folder = path + "/"  # every path in it starts so
            if start_after is None or folder > start_after[: len(folder)]:
                yield from _local_files(root, folder, None)
            elif start_after.startswith(folder):
                yield from _local_files(root, folder, start_after)
        elif entry.is_file() and (start_after is None or path > start_after):
            stat = entry.stat()
            yield FileEntry(path, stat.st_size, stat.st_mtime_ns)


def _store_of(location: str) -> tuple[S3Store | AzureStore | GCSStore, str]:
    """obstore's client of ``location``'s bucket, and the key prefix of ``location`` ("" or
    ending in /)."""
    prefix = urlparse(location).path.strip("/")
    kind = store_kind(location)
    store = _object_store(kind, _bucket(location), _remote_settings(location))
    return store, prefix + "/" if prefix else ""


@functools.lru_cache(maxsize=8)
def _object_store(
    kind: str, bucket: str, settings: tuple[tuple[str, str], ...]
) -> S3Store | AzureStore | GCSStore:
    store = {"s3": S3Store, "azure": AzureStore, "gcs": GCSStore}[kind]
    return store(
        bucket,
        config=dict(settings),
        # As ``_s3``: a store that stops answering fails the listing, retried by the step.
        client_options={"connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=30)},
        retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=30)},
    )


def delete_files(location: str, paths: list[str]) -> None:
    """Delete ``paths`` (below ``location``); in a bucket in batches of 1,000 through obstore:
    pyarrow's delete leaves a folder marker (an empty key ending in /) where a folder becomes
    empty, which a listing then returns as a file."""
    if not is_remote(location):
        for path in paths:
            Path(location, path).unlink(missing_ok=True)
        return
    store, prefix = _store_of(location)
    try:
        obstore.delete(store, [prefix + p for p in paths])
    except Exception as e:  # obstore's errors are not OSError
        raise OSError(f"cannot delete from {location}: {e}") from None


def put_if_absent(location: str, relative: str, data: bytes) -> bool:
    """Put ``data`` at ``relative`` below ``location`` (a bucket) unless the key exists (False
    then): S3's conditional put, ``If-None-Match: *``."""
    store, prefix = _store_of(location)
    try:
        obstore.put(store, prefix + relative, data, mode="create")
    except (AlreadyExistsError, PreconditionError):
        return False
    except Exception as e:  # obstore's errors are not OSError
        raise OSError(f"cannot write {location}/{relative}: {e}") from None
    return True


def delete_tree(location: str) -> None:
    """Delete ``location`` and everything below it (nothing when it is absent)."""
    fs, path = filesystem(location)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        return


def write_whole(location: str, data: bytes) -> None:
    """Write a file so that no reader sees part of it: a local file under a hidden name (landing
    readers skip dot files), then renamed; an object in one put."""
    fs, path = filesystem(location)
    if is_remote(location):
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    folder, _, base = path.rpartition("/")
    fs.create_dir(folder)
    hidden = f"{folder}/.{base}.tmp"
    with fs.open_output_stream(hidden) as out:
        out.write(data)
    fs.move(hidden, path)


# What pyarrow's, delta-rs's and obstore's clients say when the store does not answer (down,
# stopped, overloaded), raised on the driver or in a Spark task: a retry later may succeed.
_UNAVAILABLE = (
    "NETWORK_CONNECTION",
    "curlCode: 28",  # a request timed out
    "Timeout was reached",
    "operation timed out",
    "error sending request",
    "connection closed before message completed",
    "Fail to get a new connection",  # pyarrow's Azure client
    "SLOW_DOWN",
    "SERVICE_UNAVAILABLE",
    "503 Service Unavailable",
    "500 Internal Server Error",
)


def unavailable_reason(text: str) -> str | None:
    """One line when ``text`` (an error's) says the object store did not answer, else None."""
    for marker in _UNAVAILABLE:
        if marker in text:
            o = options()
            where = o.get("AWS_ENDPOINT_URL") or o.get("AZURE_STORAGE_ENDPOINT")
            return f"the object store{f' at {where}' if where else ''} is unavailable ({marker})"
    return None


# What each store answers to a request it does not sign as valid, and the options that sign.
_REFUSALS = {
    "s3": ("SIGNATURE_DOES_NOT_MATCH", "ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "403"),
    "azure": ("AuthenticationFailed", "AuthorizationFailure", "403"),
    "gcs": ("401", "403"),
}
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
    "azure": "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
}
_UNREACHABLE = ("NETWORK_CONNECTION", "curlCode", "resolve host", "Could not connect")


def _problem(location: str, error: OSError) -> str:
    text = str(error)
    kind, at = store_kind(location), endpoint(location)
    if "NO_SUCH_BUCKET" in text or ("does not exist" in text and "bucket" in text.lower()):
        return f"{location}: bucket {_bucket(location)!r} does not exist at {at}"
    for code in _REFUSALS[kind]:
        if code in text:
            return (
                f"{location}: the store at {at} refused the credentials "
                f"({_CREDENTIALS[kind]}): {code.lower()}"
            )
    if any(marker in text for marker in _UNREACHABLE):
        return f"{location}: cannot reach the object store at {at}"
    return f"{location}: {text.splitlines()[0]}"


def check(location: str) -> None:
    """Fail with ``StorageError`` (one line naming the problem) unless ``location`` can be
    listed: a local folder is fine as it is; a bucket must exist and take the credentials."""
    if not is_remote(location):
        return
    fs, path = filesystem(location)
    bucket = path.split("/", 1)[0]
    try:
        found = fs.get_file_info(bucket).type != pafs.FileType.NotFound  # HeadBucket
        fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))  # a list: the key's rights
    except OSError as e:
        raise StorageError(_problem(location, e)) from None
    if not found:
        word = "container" if store_kind(location) == "azure" else "bucket"
        raise StorageError(f"{location}: {word} {bucket!r} does not exist at {endpoint(location)}")
