"""Resources: Spark from dagster-pyspark (one lazy session per process) and the lake's paths."""

from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from cdc_platform.catalog import Catalog
from cdc_platform.spark.session import DEFAULT_CONF, prepare_local


class LakeResource(dg.ConfigurableResource):
    """Where the Delta tables and the landing files live."""

    warehouse: str
    landing: str

    @property
    def warehouse_path(self) -> Path:
        return Path(self.warehouse)


def spark_session(spark: LazyPySparkResource) -> SparkSession:
    """The run's SparkSession (created on first use; the in-process executor shares it)."""
    prepare_local()
    return spark.spark_session


def build_resources(catalog: Catalog) -> dict[str, dg.ConfigurableResource]:
    settings = catalog.spark_settings()
    spark_config = {**DEFAULT_CONF, **settings.conf}
    if settings.remote:
        spark_config["spark.remote"] = settings.remote
    else:
        spark_config["spark.master"] = settings.master
    return {
        "spark": LazyPySparkResource(spark_config=spark_config),
        "lake": LakeResource(
            warehouse=str(catalog.warehouse_path), landing=str(catalog.landing_path)
        ),
    }
