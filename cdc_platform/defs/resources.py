"""Resources: the run's Spark session (one lazy session per process) and the lake's paths."""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from cdc_platform.catalog import MASTER_KEY, REMOTE_KEY, Catalog, spark_settings
from cdc_platform.lake import storage
from cdc_platform.spark.session import DEFAULT_CONF, get_spark


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, built by ``cdc_platform.spark.session.get_spark``.

    ``spark_config`` holds ``spark.master`` for a local session, which finds a JDK first, or
    ``spark.remote`` for a Spark Connect client, which needs no JDK at all.
    """

    @property
    def spark_session(self) -> SparkSession:
        if self._spark_session is None:
            conf = dict(self.spark_config)
            remote = conf.pop(REMOTE_KEY, None)
            master = conf.pop(MASTER_KEY, "local[*]")
            self._spark_session = get_spark(master, conf, remote=remote)
        return self._spark_session

    def reset(self) -> None:
        """Drop the session (its server went away): the next use connects a new one. Nothing is
        asked of the old server, which may be gone."""
        session, self._spark_session = self._spark_session, None
        if session is not None:
            session.release_session_on_close = False  # a Connect session; local ones ignore it
            session.stop()
        _forget_connect_sessions()


def _forget_connect_sessions() -> None:
    """Clear Spark Connect's default and active sessions. A session whose build failed half way
    (the server restarting under ``getOrCreate``) stays registered there, stopped, and was never
    ours to stop: the next ``getOrCreate`` returns it, a new session is not made active while
    it is registered, and PySpark's lookups of the active session then fail
    (NO_ACTIVE_OR_DEFAULT_SESSION, met under the stack test's kill). PySpark has no public call
    for this (``stop`` clears only the session it is called on)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    with ConnectSession._lock:  # noqa: SLF001
        ConnectSession._default_session = None  # noqa: SLF001
        ConnectSession._active_session.session = None  # noqa: SLF001

    @property
    def spark_context(self) -> object | None:
        """The SparkContext of a local session; None for a Spark Connect client (it has none)."""
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        session = self.spark_session
        return None if isinstance(session, ConnectSession) else session.sparkContext


class LakeResource(dg.ConfigurableResource):
    """Where the Delta tables and the landing files live: what assets and sensors read."""

    warehouse: str
    landing: str
    locations: dict[str, str] = {}
    """Landing folders of the sources that have their own ``location``, by source name."""

    @property
    def warehouse_uri(self) -> str:
        return self.warehouse

    def landing_for(self, source: str) -> str:
        """The landing folder of ``source``: its own location, else ``<landing>/<source>``."""
        return self.locations.get(source) or storage.join(self.landing, source)


def build_resources(catalog: Catalog) -> dict[str, dg.ConfigurableResource]:
    """The run's resources. Spark's settings are resolved as the CLI's (``spark_settings``: the
    sources file, then the ``CDC_SPARK_*`` variables; a run has no ``--spark-conf``)."""
    settings = spark_settings(catalog)
    spark_config = {**DEFAULT_CONF, **settings.conf}
    if settings.remote:
        spark_config[REMOTE_KEY] = settings.remote
    else:
        spark_config[MASTER_KEY] = settings.master
    return {
        "spark": SparkResource(spark_config=spark_config),
        "lake": LakeResource(
            warehouse=catalog.warehouse_uri,
            landing=catalog.landing_uri,
            locations={s.name: catalog.landing_for(s) for s in catalog.sources if s.location},
        ),
    }
