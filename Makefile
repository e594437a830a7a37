# loopwatch — developer entry points. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOOPWATCH := $(VENV)/bin/loopwatch
SHARED ?= $(or $(LOOPWATCH_SHARED),../shared)
STAMP := $(VENV)/.installed

.PHONY: install test test-unit test-traces test-traces-latest test-kafka kafka kafka-stop kafka-status run \
        bench-core bench schemas conformance clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,ops]'
	touch $(STAMP)

# The full suite: unit, conformance, golden traces, ops checks and integration tests on the
# real broker.  pytest exits non-zero (5) when it collects no tests, which fails the target.
test: install kafka
	LOOPWATCH_SHARED=$(SHARED) $(PY) -m pytest -q -p no:cacheprovider tests

test-unit: install
	LOOPWATCH_SHARED=$(SHARED) $(PY) -m pytest -q -p no:cacheprovider tests -m "not kafka"

# Step-for-step agreement with upstream on the shared golden traces (issue 5).
test-traces: install
	$(LOOPWATCH) conformance --traces $(SHARED)/conformance/traces/one-run-sessions.jsonl.gz \
	    --expected $(SHARED)/conformance/traces/expected.jsonl.gz

# The same for profile latest (issue 14), on the repository's own copy of the traces.
test-traces-latest: install
	$(LOOPWATCH) conformance --profile latest --traces tests/data/conformance/latest/sessions.jsonl.gz \
	    --expected tests/data/conformance/latest/expected.jsonl.gz

conformance: install
	$(LOOPWATCH) conformance $(SHARED)/conformance/openclaw-cases.json

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
