"""The source catalog: ``sources.yaml`` validated with pydantic; the only list factories loop over.

Relative paths in the file are relative to the file itself. ``CDC_SOURCES`` chooses the file
(``default_catalog_path``), and environment variables override its storage and Spark settings
(``CDC_WAREHOUSE``, ``CDC_LANDING``; ``CDC_SPARK_MASTER``, ``CDC_SPARK_REMOTE``,
``CDC_SPARK_CONF``: see ``spark_settings``), so the same file serves the demo, the tests and a
deployment. Kafka secrets are never in the file: a secret
setting must be an ``${ENV_VAR}`` reference, resolved only when a client is created.
"""

import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cdc_platform import formats
from cdc_platform.formats.column_specs import parse_type
from cdc_platform.lake import storage

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# The SQL models' asset group and the run tag of their automation runs (defs/runs.py).
RESERVED_SOURCE = "models"


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError("must be letters, digits and underscores, not starting with a digit")
    return v


class CatalogError(Exception):
    """A sources file that cannot be used; the message is one line naming the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _KeyAndTypes(_Strict):
    """What a table and a source both set: ``primary_key`` (a list, or ``"a, b"``) and
    ``column_types`` (checked and written as Spark SQL names)."""

    @field_validator("column_types", check_fields=False)
    @classmethod
    def _valid_types(cls, v: dict[str, str]) -> dict[str, str]:
        return {col: parse_type(t) for col, t in v.items()}

    @field_validator("primary_key", mode="before", check_fields=False)
    @classmethod
    def _split_key(cls, v: object) -> object:
        return [c.strip() for c in v.split(",")] if isinstance(v, str) else v


class QualityConfig(_Strict):
    """Overrides of the data-quality suites (expectations/) for a source or one of its tables."""

    severity: dict[str, Literal["WARN", "ERROR"]] = Field(
        default_factory=dict, description="rule -> WARN or ERROR (ERROR on a change log blocks)"
    )
    min_event_time: datetime | None = Field(None, description="event times before are flagged")
    future_tolerance_minutes: float | None = Field(
        None, ge=0, description="event times later than now plus this are flagged"
    )
    update_before_image: bool | None = Field(
        None, description="updates always carry a before image; default: by format"
    )


class TableConfig(_KeyAndTypes):
    """One source table: how to find its messages, its key and column types."""

    name: str = Field(description="asset key part: changelog/<source>/<name>, current/...")
    source_table: str | None = Field(
        None, description="qualified name in the messages (db[.schema].table); default: name"
    )
    primary_key: list[str] | None = Field(
        None, description="key columns (a list or 'a, b'); default: the message's key fields"
    )
    column_types: dict[str, str] = Field(
        default_factory=dict,
        description="column -> Spark SQL type (string boolean tinyint smallint int bigint float "
        "double decimal(p,s) date timestamp binary), or '<type> from <encoding>' for what the "
        "wire holds (docs/configuration.md); wins over the message's schema",
    )
    infer_types: bool | None = Field(
        None,
        description="type columns that no schema or column_types types from their JSON "
        "tokens: numbers bigint or double, booleans boolean; default: the source's",
    )
    column_list: list[str] | None = Field(None, description="keep only these columns (+ key)")
    except_column_list: list[str] | None = Field(None, description="drop these columns")
    ignore_null_updates: bool = Field(
        False, description="a null in an update keeps the column's previous value"
    )
    tombstone_retention_days: float | None = Field(
        None, gt=0, description="purge tombstones of deleted keys after this; default: keep"
    )
    history: bool = Field(False, description="keep an SCD type 2 history/<source>/<table>")
    merge_mode: Literal["merge-on-read", "copy-on-write"] = Field(
        "merge-on-read",
        description="merge-on-read: a merge marks replaced rows in deletion vectors and writes "
        "only new rows (Delta readers need deletion vector support); copy-on-write: it rewrites "
        "the files holding them (docs/configuration.md)",
    )
    track_history_column_list: list[str] | None = Field(
        None, description="only changes to these columns open a history version"
    )
    track_history_except_column_list: list[str] | None = Field(
        None, description="changes to any column but these open a history version"
    )
    quality: QualityConfig | None = Field(None, description="this table's quality overrides")
    max_lag_minutes: float | None = Field(
        None, gt=0, description="freshness check fails beyond this lag; default: the source's"
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v)

    @model_validator(mode="after")
    def _consistent_lists(self) -> "TableConfig":
        if self.column_list is not None and self.except_column_list is not None:
            raise ValueError("set column_list or except_column_list, not both")
        tracked = (self.track_history_column_list, self.track_history_except_column_list)
        if all(t is not None for t in tracked):
            raise ValueError(
                "set track_history_column_list or track_history_except_column_list, not both"
            )
        if any(t is not None for t in tracked) and not self.history:
            raise ValueError("track_history_* needs history: true")
        return self

    @property
    def match(self) -> str:
        return self.source_table or self.name

    def keeps(self, column: str, key: list[str]) -> bool:
        """Whether ``column`` is selected by column_list / except_column_list (keys always are)."""
        if column in key:
            return True
        if self.column_list is not None:
            return column in self.column_list
        return column not in (self.except_column_list or [])

    def tracked_columns(self, columns: list[str]) -> list[str]:
        """The columns whose changes open a new history version (all, unless configured)."""
        if self.track_history_column_list is not None:
            return [c for c in columns if c in self.track_history_column_list]
        return [c for c in columns if c not in (self.track_history_except_column_list or [])]


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# librdkafka properties holding secrets: only an ${ENV_VAR} reference is accepted for them.
_SECRET = re.compile(r"password|secret|\.pem$|^sasl\.oauthbearer\.config$")
# Set by the ingestion itself: it reads from the offsets stored in the raw table, never from the
# consumer group, and decides itself when a batch ends.
_CONTROLLED = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "auto.offset.reset",
    }
)
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def _settings(v: object) -> object:
    if isinstance(v, dict):
        return {k: str(x).lower() if isinstance(x, bool) else str(x) for k, x in v.items()}
    return v


def _comma_joined(v: object) -> object:
    """A YAML list of addresses as the one comma-separated text the clients take."""
    return ",".join(str(s) for s in v) if isinstance(v, list) else v


def _no_literal_secrets(settings: dict[str, str]) -> None:
    for k, v in settings.items():
        if _SECRET.search(k) and not _ENV_REF.fullmatch(v):
            var = "KAFKA_" + re.sub(r"[^A-Za-z0-9]+", "_", k).upper()
            raise ValueError(
                f"{k} is a secret: write an environment reference like ${{{var}}}, "
                "never the secret itself"
            )


class KafkaConfig(_Strict):
    """Where a ``transport: kafka`` source reads: brokers, topics, consumer and security settings.

    ``consumer`` and ``security`` take librdkafka property names. Any value may contain
    ``${ENV_VAR}`` references; secret properties (passwords, secrets, PEM keys) must be one.
    """

    bootstrap_servers: str = Field(description="host:port[,host:port...] (or a list)")
    topics: list[str] | None = Field(None, description="topic names; or topic_pattern")
    topic_pattern: str | None = Field(None, description="regular expression a topic fully matches")
    group_id: str | None = Field(
        None, description="consumer group for monitoring commits; default cdc-platform.<source>"
    )
    commit_consumer_offsets: bool = Field(
        True, description="after each raw commit, also commit the group's offsets (monitoring)"
    )
    max_records: int = Field(
        1_000_000,
        gt=0,
        description="records per run at most: a run takes everything waiting up to this and "
        "max_bytes, so a backlog is worked through in as few runs as memory allows",
    )
    max_bytes: int = Field(
        128 * 1024 * 1024,
        gt=0,
        description="key+value+header bytes per run at most (the run holds them in memory: "
        "about 8x this at its peak while the batch is written; a continuous run's consumer "
        "also fetches up to this much ahead)",
    )
    idle_timeout_seconds: float = Field(
        10.0, gt=0, description="end the batch when no partition delivered anything for this long"
    )
    consumer: dict[str, str] = Field(
        default_factory=dict, description="more librdkafka consumer properties"
    )
    security: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka security properties (security.protocol, sasl.*, ssl.*); "
        "secrets as ${ENV_VAR}",
    )

    _join_servers = field_validator("bootstrap_servers", mode="before")(_comma_joined)

    @field_validator("topics", mode="before")
    @classmethod
    def _one_topic(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @field_validator("topic_pattern")
    @classmethod
    def _valid_pattern(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a regular expression: {e}") from None
        return v

    @field_validator("consumer", "security", mode="before")
    @classmethod
    def _stringify(cls, v: object) -> object:
        return _settings(v)

    @field_validator("consumer")
    @classmethod
    def _valid_consumer(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k in _CONTROLLED:
                raise ValueError(f"{k} is set by the platform (see bootstrap_servers, group_id)")
            if k.startswith(_SECURITY_PREFIXES):
                raise ValueError(f"{k} belongs under security")
        _no_literal_secrets(v)
        return v

    @field_validator("security")
    @classmethod
    def _valid_security(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not k.startswith(_SECURITY_PREFIXES):
                raise ValueError(f"{k} is not a security setting (security.*, sasl.*, ssl.*)")
        protocol = v.get("security.protocol", "PLAINTEXT")
        if protocol.upper() not in _PROTOCOLS and not _ENV_REF.fullmatch(protocol):
            known = ", ".join(_PROTOCOLS)
            raise ValueError(f"security.protocol {protocol!r} must be one of {known}")
        _no_literal_secrets(v)
        return v

    @model_validator(mode="after")
    def _one_topic_selector(self) -> "KafkaConfig":
        if (self.topics is None) == (self.topic_pattern is None):
            raise ValueError("set topics or topic_pattern (one of them)")
        if self.topics is not None and not self.topics:
            raise ValueError("topics is empty")
        return self

    def client_settings(self) -> dict[str, str]:
        """librdkafka settings with every ``${ENV_VAR}`` resolved from the environment now."""
        raw = {"bootstrap.servers": self.bootstrap_servers, **self.consumer, **self.security}

        return {k: _resolve_env(f"kafka {k}", v) for k, v in raw.items()}


def _resolve_env(where: str, value: str) -> str:
    """``value`` with every ``${ENV_VAR}`` replaced from the environment now."""

    def var(m: re.Match) -> str:
        if m[1] not in os.environ:
            raise CatalogError(f"{where}: environment variable {m[1]} is not set")
        return os.environ[m[1]]

    return _ENV_REF.sub(var, value)


class SchemaRegistryConfig(_Strict):
    """A Confluent-compatible schema registry (Confluent Schema Registry, Karapace, Apicurio's
    ccompat API, Redpanda), for Avro keys and values in the Confluent wire format.

    A message names its writer schema by id, so reading needs only the registry's address and
    credentials. The subject name strategies say under which subject a key or value schema is
    registered: they matter with ``use_latest_version`` (read with the subject's newest schema).
    """

    url: str = Field(description="http(s)://host:port[/path] (or a comma-separated list)")
    basic_auth_user_info: str | None = Field(
        None, description="user:password for HTTP basic auth; the password as ${ENV_VAR}"
    )
    ssl_ca_location: str | None = Field(None, description="CA bundle (PEM) to verify the registry")
    ssl_certificate_location: str | None = Field(None, description="client certificate (PEM)")
    ssl_key_location: str | None = Field(None, description="client private key (PEM)")
    ssl_key_password: str | None = Field(None, description="the key's password, as ${ENV_VAR}")
    key_subject_name_strategy: Literal["topic", "record", "topic_record"] = Field(
        "topic", description="topic: <topic>-key; record: the record's full name; "
        "topic_record: <topic>-<record full name>",
    )  # fmt: skip
    value_subject_name_strategy: Literal["topic", "record", "topic_record"] = Field(
        "topic", description="as key_subject_name_strategy, for values (<topic>-value)"
    )
    use_latest_version: bool = Field(
        False,
        description="read every message with its subject's newest schema (Avro schema "
        "resolution) rather than the schema it was written with",
    )

    _join_urls = field_validator("url", mode="before")(_comma_joined)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        for url in v.split(","):
            if not re.match(r"^(https?|mock)://[^\s/]+", url.strip()) and not _ENV_REF.search(url):
                raise ValueError(f"{url!r} is not an http(s):// URL")
        return v

    @field_validator("basic_auth_user_info")
    @classmethod
    def _password_from_env(cls, v: str | None) -> str | None:
        if v is not None and not (
            _ENV_REF.fullmatch(v) or re.fullmatch(r"[^:]*:\$\{[A-Za-z_][A-Za-z0-9_]*\}", v)
        ):
            raise ValueError(
                "basic_auth_user_info holds a password: write user:${SCHEMA_REGISTRY_PASSWORD} "
                "(or ${VAR} for the whole), never the password itself"
            )
        return v

    @field_validator("ssl_key_password")
    @classmethod
    def _key_password_from_env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_REF.fullmatch(v):
            raise ValueError("ssl_key_password is a secret: write ${VAR}, never the secret")
        return v

    def client_settings(self) -> dict[str, str]:
        """``SchemaRegistryClient`` settings, every ``${ENV_VAR}`` resolved from the environment
        now."""
        settings = {
            "url": self.url,
            "basic.auth.user.info": self.basic_auth_user_info,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        return {
            k: _resolve_env(f"schema_registry {k}", v) for k, v in settings.items() if v is not None
        }


class ContinuousConfig(_Strict):
    """A source run continuously: one long Dagster run that ingests, normalizes and merges
    micro-batch after micro-batch, instead of a run launched per batch."""

    run_minutes: float = Field(
        30,
        gt=0,
        description="a continuous run ends after this long, or as soon as another run of the "
        "source is queued (a backfill, a manual run); the sensor then starts the next one, with "
        "the code and configuration as they are then",
    )
    poll_seconds: float = Field(
        1, gt=0, description="wait between two looks for new data when the last found none"
    )
    batch_seconds: float = Field(
        20,
        gt=0,
        description="a Kafka micro-batch takes the records that the micro-batches before it "
        "show can be finished in about this long (a backlog is worked through in micro-batches "
        "of this length), at most kafka.max_records and max_bytes (the memory bounds)",
    )
    # As a Kafka consumer's fetch.min.bytes and fetch.max.wait.ms: a small micro-batch costs
    # seconds of CPU whatever its size, so what a source trickles waits up to
    # max_wait_seconds and is merged once for several of its batches; a burst goes at once.
    min_batch_records: int = Field(
        1000,
        ge=0,
        description="a Kafka micro-batch starts once this many records wait, or max_wait_seconds "
        "after the run first saw fewer waiting",
    )
    min_batch_bytes: int = Field(
        256 * 1024,
        ge=0,
        description="a landing micro-batch starts once files of this many bytes wait, or "
        "max_wait_seconds after the run first saw fewer waiting",
    )
    max_wait_seconds: float = Field(
        60,
        ge=0,
        description="how long less than min_batch_records (min_batch_bytes) may wait for more "
        "before a micro-batch takes it; 0: a micro-batch starts as soon as anything waits",
    )


class SourceConfig(_KeyAndTypes):
    """One topic (or landing folder) and the tables it carries."""

    name: str = Field(description="asset key part and landing sub-folder")
    transport: Literal["files", "kafka"] = Field(
        "files", description="landing files, or a Kafka topic (the kafka block)"
    )
    kafka: KafkaConfig | None = Field(None, description="brokers and topics of transport: kafka")
    location: str | None = Field(None, description="landing folder; default <landing>/<name>")
    format: str = Field(
        "auto", description="message format (docs/formats.md); auto detects it per message"
    )
    format_options: dict[str, str] = Field(
        default_factory=dict, description="options of the format, e.g. lindorm.hbase: 'true'"
    )
    schema_registry: SchemaRegistryConfig | None = Field(
        None, description="where the schemas of Avro keys and values (Confluent wire format) are"
    )
    primary_key: list[str] | None = Field(
        None, description="key columns of every table that has no primary_key of its own"
    )
    column_types: dict[str, str] = Field(
        default_factory=dict,
        description="column -> type for every table (a table's own column_types win)",
    )
    infer_types: bool = Field(
        False,
        description="for messages without a schema: JSON numbers typed bigint (integral) or "
        "double, booleans boolean, merged over a batch and widened as the lake allows; strings "
        "stay strings (Debezium's JsonConverter without schemas)",
    )
    tables: list[TableConfig] = Field(
        default_factory=list,
        description="declared tables; others found in the data are routed by their name",
    )
    quality: QualityConfig | None = Field(None, description="defaults for its tables")
    sensor_interval_seconds: int = Field(
        5,
        ge=1,
        description="least time between two evaluations of the source's sensor (a tick reads "
        "the Delta log and the broker's offsets, no Spark)",
    )
    full_listing_minutes: float = Field(
        60,
        gt=0,
        description="files sources: how often the sensor (or a continuous run) lists the whole "
        "landing folder; in between it lists only the names from the last one raw holds on "
        "(new files, the last one grown). A full listing finds files landed under an earlier "
        "name, and files rewritten after a later one was read",
    )
    continuous: ContinuousConfig | None = Field(
        None,
        description="run the source continuously (true, or the block): one long run takes "
        "micro-batch after micro-batch with no launch, sensor tick or Spark session per batch",
    )
    max_lag_minutes: float = Field(
        60, gt=0, description="a table further behind its source fails its freshness check"
    )
    start_date: date | None = Field(
        None,
        description="first daily partition (YYYY-MM-DD); default: the source's earliest data",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if v == RESERVED_SOURCE:
            raise ValueError(f"{v} is reserved (the SQL models' group and run tag)")
        return _check_name(v)

    @field_validator("start_date", mode="before")
    @classmethod
    def _iso_date(cls, v: object) -> object:
        if v is None or (isinstance(v, date) and not isinstance(v, datetime)):
            return v
        if isinstance(v, str) and _ISO_DATE.match(v):
            try:
                return date.fromisoformat(v)
            except ValueError as e:
                raise ValueError(f"{v} is not a real date ({e})") from None
        raise ValueError(f"must be a date YYYY-MM-DD, not {v!r}")

    @field_validator("start_date")
    @classmethod
    def _not_in_future(cls, v: date | None) -> date | None:
        today = datetime.now(UTC).date()  # partitions are UTC days
        if v is not None and v > today:
            raise ValueError(f"{v} is after today ({today})")
        return v

    @field_validator("continuous", mode="before")
    @classmethod
    def _continuous_flag(cls, v: object) -> object:
        if v is True:
            return {}
        return None if v is False else v

    @field_validator("format_options", mode="before")
    @classmethod
    def _stringify(cls, v: object) -> object:
        if isinstance(v, dict):
            return {k: str(x).lower() if isinstance(x, bool) else str(x) for k, x in v.items()}
        return v

    def max_lag(self, table: TableConfig) -> float:
        """The freshness limit of ``table`` in minutes."""
        return table.max_lag_minutes or self.max_lag_minutes

    def with_found(self, found: dict[str, str]) -> list[TableConfig]:
        """The declared tables, then the tables found in the data without a declaration
        (``found``: table name -> qualified name, e.g. ``lake.changelog_tables``)."""
        declared = {t.name for t in self.tables}
        routed = [
            TableConfig(name=name, source_table=qualified)
            for name, qualified in sorted(found.items())
            if name not in declared
        ]
        return [*self.tables, *routed]

    @property
    def infers_any(self) -> bool:
        """Whether any table of the source may type columns from JSON tokens."""
        return self.infer_types or any(t.infer_types for t in self.tables)

    def infers(self, table: TableConfig | None) -> bool:
        """Whether ``table`` (None: a routed one) types its schemaless columns from tokens."""
        own = table.infer_types if table is not None else None
        return self.infer_types if own is None else own

    def table_config(self, name: str) -> TableConfig:
        """The declared table of that name, else defaults (a routed table)."""
        return next((t for t in self.tables if t.name == name), TableConfig(name=name))

    @model_validator(mode="after")
    def _transport_settings(self) -> "SourceConfig":
        if self.transport == "kafka" and self.kafka is None:
            raise ValueError("transport: kafka needs a kafka block (bootstrap_servers, topics)")
        if self.transport != "kafka" and self.kafka is not None:
            raise ValueError("a kafka block needs transport: kafka")
        if self.transport == "kafka" and self.location is not None:
            raise ValueError("location is a landing folder; a kafka source reads its topics")
        return self

    @model_validator(mode="after")
    def _known_format(self) -> "SourceConfig":
        formats.parser_for(self.format)
        formats.validate_options(self.format, self.format_options)
        names = [t.name for t in self.tables]
        if len(names) != len(set(names)):
            raise ValueError(f"table names repeat in source {self.name}")
        return self


class SparkConfig(_Strict):
    """Where Spark runs and its settings: the ``spark`` block, or ``spark_settings``' result."""

    master: str = Field("local[*]", description="any Spark master URL")
    remote: str | None = Field(None, description="Spark Connect URL; overrides master")
    conf: dict[str, str] = Field(default_factory=dict, description="Spark settings")

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify(cls, v: object) -> object:
        return _settings(v)

    def over(self, conf: Mapping[str, str]) -> "SparkConfig":
        """These settings with ``conf`` on top. Its ``spark.remote`` or ``spark.master`` choose
        where Spark runs: a remote wins over a master, and a master replaces an earlier remote
        (empty values are ignored); they never stay in ``conf``."""
        rest = {k: v for k, v in conf.items() if k not in (MASTER_KEY, REMOTE_KEY)}
        update: dict[str, object] = {"conf": {**self.conf, **rest}}
        if master := conf.get(MASTER_KEY):
            update |= {"master": master, "remote": None}
        if remote := conf.get(REMOTE_KEY):
            update["remote"] = remote
        return self.model_copy(update=update)


class ModelsConfig(_Strict):
    """How the SQL models (dbt_like_models) follow the tables they read."""

    rebuild_cron: str | None = Field(
        None,
        description="rebuild a model at most once per tick of this cron schedule (UTC): at the "
        "first look after a tick once an input has updated; none: after every update. A "
        "continuous source updates its tables every few seconds; this spaces the rebuilds",
    )

    @field_validator("rebuild_cron")
    @classmethod
    def _valid_cron(cls, v: str | None) -> str | None:
        return v if v is None else _cron(v)


def _cron(v: str) -> str:
    import dagster as dg  # only then: the CLI's other commands need no Dagster

    try:
        dg.AutomationCondition.cron_tick_passed(v)
    except Exception:
        raise ValueError(f"not a cron schedule: {v!r}") from None
    return v


class MaintenanceConfig(_Strict):
    """The upkeep of the tables: the ``cdc_maintenance`` job vacuums every table (daily)."""

    cron: str = Field("0 3 * * *", description="when the maintenance job runs (cron, UTC)")
    retention_hours: int = Field(
        168,  # Delta Lake's default (delta.deletedFileRetentionDuration): a week
        ge=24,
        le=168,
        description="a data file no longer in its table (replaced by a merge, or left by a "
        "crashed write) is deleted once this many hours old; time travel reaches back as far. "
        "At least 24, longer than any run: a run's files are on disk before its commit names "
        "them. At most 168: a table's log forgets replaced files after a week "
        "(delta.deletedFileRetentionDuration)",
    )

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        return _cron(v)


class Catalog(_Strict):
    """The whole sources file."""

    warehouse: str = Field(
        "var/warehouse",
        description="the Delta tables: a local folder (relative to the sources file) or "
        "s3://bucket/prefix (az://, abfss://, gs:// alike)",
    )
    landing: str = Field(
        "var/landing",
        description="landing files: <landing>/<source>/dt=YYYY-MM-DD/*; a local folder or "
        "s3://bucket/prefix",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="object-store options over the environment's, by the names delta-rs reads "
        "(AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
        "AWS_SESSION_TOKEN, AWS_ALLOW_HTTP, AWS_VIRTUAL_HOSTED_STYLE_REQUEST; AZURE_STORAGE_* "
        "and GOOGLE_* for az://, abfss://, gs://); a value may name environment variables as "
        "${VAR}, as secrets must",
    )
    spark: SparkConfig = Field(default_factory=SparkConfig, description="where Spark runs")
    sources: list[SourceConfig] = Field(description="the sources and their tables")
    models: ModelsConfig = Field(
        default_factory=ModelsConfig, description="how the SQL models follow their inputs"
    )
    maintenance: MaintenanceConfig = Field(
        default_factory=MaintenanceConfig, description="the daily vacuum of the tables"
    )
    base_dir: Path = Field(Path("."), exclude=True)

    @model_validator(mode="after")
    def _unique_sources(self) -> "Catalog":
        names = [s.name for s in self.sources]
        if len(names) != len(set(names)):
            raise ValueError("source names repeat")
        return self

    def _resolve(self, location: str) -> str:
        try:
            return storage.resolve(location, self.base_dir)
        except storage.StorageError as e:
            raise CatalogError(str(e)) from None

    @property
    def warehouse_uri(self) -> str:
        """The warehouse: an absolute local path, or an ``s3://`` URI."""
        return self._resolve(os.environ.get("CDC_WAREHOUSE") or self.warehouse)

    @property
    def landing_uri(self) -> str:
        return self._resolve(os.environ.get("CDC_LANDING") or self.landing)

    def landing_for(self, source: SourceConfig) -> str:
        if source.location:
            return self._resolve(source.location)
        return storage.join(self.landing_uri, source.name)

    def configure_storage(self) -> None:
        """Make ``storage_options`` this process's object-store options (CatalogError naming a
        bad option or an unset variable)."""
        try:
            storage.configure(self.storage_options)
        except storage.StorageError as e:
            raise CatalogError(str(e)) from None

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise CatalogError(f"no source named {name!r} in the catalog")


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, except that a date-like scalar that is no real date (2024-02-30) stays
    a string, so validation reports it under its key instead of YAML failing without one."""


def _timestamp(loader: yaml.SafeLoader, node: yaml.Node) -> object:
    try:
        return yaml.SafeLoader.construct_yaml_timestamp(loader, node)
    except ValueError:
        return loader.construct_scalar(node)


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


def _where(error: dict) -> str:
    return ".".join(str(p) for p in error["loc"]) or "(top level)"


def load_catalog(path: str | os.PathLike) -> Catalog:
    """Read and validate a sources file; CatalogError with one line naming the bad key."""
    p = Path(path)
    if not p.is_file():
        raise CatalogError(f"sources file not found: {p}")
    try:
        data = yaml.load(p.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise CatalogError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{p}: expected a mapping with a 'sources' list")
    try:
        catalog = Catalog(**data, base_dir=p.resolve().parent)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise CatalogError(f"{p}: {_where(err)}: {msg}") from None
    except TypeError as e:
        raise CatalogError(f"{p}: {e}") from None
    # Every process reads its storage through the options of the file it runs from.
    catalog.configure_storage()
    return catalog


def default_catalog_path() -> Path:
    """``CDC_SOURCES``, else ``sources.yaml`` in the working directory."""
    return Path(os.environ.get("CDC_SOURCES", "sources.yaml"))


def catalog_if_present(path: str | os.PathLike | None = None) -> Catalog | None:
    """The sources file at ``path`` (CatalogError when missing); without one the default
    (``default_catalog_path``) if that file exists, else None."""
    if path is not None:
        return load_catalog(path)
    default = default_catalog_path()
    return load_catalog(default) if default.is_file() else None


# Spark settings: the keys that choose where Spark runs, and the environment's overrides.
MASTER_KEY = "spark.master"
REMOTE_KEY = "spark.remote"
_SPARK_ENV = {"CDC_SPARK_MASTER": MASTER_KEY, "CDC_SPARK_REMOTE": REMOTE_KEY}


def parse_pairs(items: Iterable[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; CatalogError naming ``what`` for an item without '='."""
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CatalogError(f"{what} must look like KEY=VALUE, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def spark_settings(
    catalog: Catalog | None = None, overrides: Mapping[str, str] | None = None
) -> SparkConfig:
    """Where a command's or a run's Spark runs and with what settings; each level over the ones
    before: the sources file's ``spark`` block (no file: ``local[*]``); then ``CDC_SPARK_CONF``
    ("k1=v1,k2=v2": values cannot hold a comma), ``CDC_SPARK_MASTER`` and ``CDC_SPARK_REMOTE``;
    then ``overrides`` (the command line's ``--spark-conf``). ``spark.master`` and
    ``spark.remote`` keys choose master or remote as ``SparkConfig.over`` says."""
    base = catalog.spark if catalog is not None else SparkConfig()
    settings = SparkConfig(master=base.master, remote=base.remote).over(base.conf)
    text = os.environ.get("CDC_SPARK_CONF", "")
    env = parse_pairs([i for i in text.split(",") if i.strip()], "CDC_SPARK_CONF")
    env |= {key: os.environ[var] for var, key in _SPARK_ENV.items() if os.environ.get(var)}
    return settings.over(env).over(overrides or {})
