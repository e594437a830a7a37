# loopwatch — developer entry points. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOOPWATCH := $(VENV)/bin/loopwatch
# The repository's copy of the shared conformance set (tests/data/README.md).
CONFORMANCE := tests/data/conformance
STAMP := $(VENV)/.installed

.PHONY: install ops-tools test test-unit test-traces test-kafka kafka kafka-stop kafka-status run \
        bench-core bench schemas conformance clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,ops]'
	touch $(STAMP)

# helm, kubeconform, promtool/prometheus and kubeconform's offline schemas for the ops tests,
# cached under ~/.cache/loopwatch: a no-op (well under a second) once they are there.
ops-tools: install
	LOOPWATCH_VENV=$(VENV) bash scripts/install-ops-tools.sh

# The full suite: unit, conformance, golden traces, ops checks and integration tests on the
# real broker.  pytest exits non-zero (5) when it collects no tests, which fails the target;
# -rs lists every skipped test with its reason (with CI set, any skip fails the run).
test: install ops-tools kafka
	$(PY) -m pytest -q -rs -p no:cacheprovider tests

test-unit: install ops-tools
	$(PY) -m pytest -q -rs -p no:cacheprovider tests -m "not kafka"

# Step-for-step agreement with upstream on the golden traces (issue 5).
test-traces: install
	$(LOOPWATCH) conformance --traces $(CONFORMANCE)/traces/one-run-sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/traces/expected.jsonl.gz

conformance: install
	$(LOOPWATCH) conformance $(CONFORMANCE)/openclaw-cases.json

# Regenerate the JSON Schema files runners in other languages consume.
schemas: install
	$(LOOPWATCH) schemas export schemas/jsonschema

kafka:
	scripts/kafka.sh start

kafka-stop:
	scripts/kafka.sh stop

kafka-status:
	scripts/kafka.sh status

run: install kafka
	$(LOOPWATCH) demo

bench-core: install
	$(PY) -m streams.bench.core

bench: install kafka
	$(PY) -m streams.bench.kafka

clean:
	rm -rf .pytest_cache .hypothesis build *.egg-info
