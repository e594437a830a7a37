# loopwatch — developer entry points. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOOPWATCH := $(VENV)/bin/loopwatch
# The repository's copy of the shared conformance set (tests/data/README.md).
CONFORMANCE := tests/data/conformance
STAMP := $(VENV)/.installed

.PHONY: install ops-tools test test-unit test-traces test-traces-latest test-kafka kafka kafka-secure kafka-stop \
        kafka-status run bench-core bench bench-backtest schemas conformance clean ts-client \
        oracles oracle-openhands oracle-gemini test-traces-openhands test-traces-gemini

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,ops,bench]'
	touch $(STAMP)

# The TypeScript client (clients/typescript): npm dependencies from its lock file (npm's cache
# makes a reinstall cheap), then the build its tests and the end-to-end runner use.
TS := clients/typescript
TS_DEPS := $(TS)/node_modules/.package-lock.json
TS_BUILT := $(TS)/dist/.built
TS_SOURCES := $(shell find $(TS)/src $(TS)/test -name '*.ts' 2>/dev/null) $(TS)/tsconfig.json $(TS)/openclaw.plugin.json

$(TS_DEPS): $(TS)/package.json $(TS)/package-lock.json
	@command -v node >/dev/null || { echo "Node.js >= 20.19 (with npm) is required for $(TS)" >&2; exit 1; }
	@node -e 'const [a, b] = process.versions.node.split(".").map(Number); if (a < 20 || (a === 20 && b < 19)) { console.error(`Node.js >= 20.19 is required for $(TS), this is ${process.version}`); process.exit(1); }'
	cd $(TS) && npm ci --no-audit --no-fund
	touch $@

$(TS_BUILT): $(TS_DEPS) $(TS_SOURCES)
	cd $(TS) && npm run build
	touch $@

ts-client: $(TS_BUILT)

# The peers' own published code, the oracles of profiles openhands and gemini-cli (issue 29),
# cached under ~/.cache/loopwatch/oracles.  openhands-sdk needs Python >= 3.12 and pins
# dependencies loopwatch's env does not want: a venv of its own, from a frozen requirements file.
ORACLES ?= $(HOME)/.cache/loopwatch/oracles
OPENHANDS_ORACLE := $(ORACLES)/openhands
OPENHANDS_REQS := tests/oracles/openhands-requirements.txt
# The first Python >= 3.12 that runs (pyenv's shims exist for versions that are not selected).
OPENHANDS_PYTHON ?= $(shell for c in python3.12 python3.13 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3; do \
    $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$c; break; }; done)

$(OPENHANDS_ORACLE)/.installed: $(OPENHANDS_REQS)
	@test -n "$(OPENHANDS_PYTHON)" || { echo "Python >= 3.12 is required for the openhands-sdk oracle (set OPENHANDS_PYTHON)" >&2; exit 1; }
	rm -rf $(OPENHANDS_ORACLE)
	$(OPENHANDS_PYTHON) -m venv $(OPENHANDS_ORACLE)
	$(OPENHANDS_ORACLE)/bin/python -m pip install -q --upgrade pip
	$(OPENHANDS_ORACLE)/bin/python -m pip install -q -r $(OPENHANDS_REQS)
	cp $(OPENHANDS_REQS) $@

oracle-openhands: $(OPENHANDS_ORACLE)/.installed

# @google/gemini-cli-core from its lock file (tests/oracles/gemini); only its loop detection
# is loaded, so its install scripts are not run.
GEMINI_ORACLE := $(ORACLES)/gemini
GEMINI_PKG := tests/oracles/gemini

$(GEMINI_ORACLE)/.installed: $(GEMINI_PKG)/package.json $(GEMINI_PKG)/package-lock.json
	@command -v node >/dev/null || { echo "Node.js (with npm) is required for the gemini-cli oracle" >&2; exit 1; }
	mkdir -p $(GEMINI_ORACLE)
	cp $(GEMINI_PKG)/package.json $(GEMINI_PKG)/package-lock.json $(GEMINI_ORACLE)/
	cd $(GEMINI_ORACLE) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

oracle-gemini: $(GEMINI_ORACLE)/.installed

oracles: oracle-openhands oracle-gemini

# helm, kubeconform, promtool/prometheus and kubeconform's offline schemas for the ops tests,
# cached under ~/.cache/loopwatch: a no-op (well under a second) once they are there.
ops-tools: install
	LOOPWATCH_VENV=$(VENV) bash scripts/install-ops-tools.sh

# The full suite: unit, conformance, golden traces, ops checks and integration tests on the
# real broker.  pytest exits non-zero (5) when it collects no tests, which fails the target;
# -rs lists every skipped test with its reason (with CI set, any skip fails the run).
test: install ops-tools kafka ts-client oracles
	LOOPWATCH_ORACLES=$(ORACLES) $(PY) -m pytest -q -rs -p no:cacheprovider tests

test-unit: install ops-tools ts-client oracles
	LOOPWATCH_ORACLES=$(ORACLES) $(PY) -m pytest -q -rs -p no:cacheprovider tests -m "not kafka"

# Step-for-step agreement with upstream on the golden traces (issue 5).
test-traces: install
	$(LOOPWATCH) conformance --traces $(CONFORMANCE)/traces/one-run-sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/traces/expected.jsonl.gz

# The same for profile latest (issue 14), on the repository's own copy of the traces.
test-traces-latest: install
	$(LOOPWATCH) conformance --profile latest --traces tests/data/conformance/latest/sessions.jsonl.gz \
	    --expected tests/data/conformance/latest/expected.jsonl.gz

conformance: install
	$(LOOPWATCH) conformance $(CONFORMANCE)/openclaw-cases.json

# Profile openhands (issue 29): the golden traces, and the peer's unit-test cases transcribed.
test-traces-openhands: install
	$(LOOPWATCH) conformance --profile openhands --traces $(CONFORMANCE)/openhands/sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/openhands/expected.jsonl.gz
	$(LOOPWATCH) conformance --profile openhands --traces $(CONFORMANCE)/openhands/cases.jsonl \
	    --expected $(CONFORMANCE)/openhands/cases-expected.jsonl

# Profile gemini-cli (issue 29): the golden traces, and Gemini's unit-test cases transcribed.
test-traces-gemini: install
	$(LOOPWATCH) conformance --profile gemini-cli --traces $(CONFORMANCE)/gemini-cli/sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/gemini-cli/expected.jsonl.gz
	$(LOOPWATCH) conformance --profile gemini-cli --traces $(CONFORMANCE)/gemini-cli/cases.jsonl \
	    --expected $(CONFORMANCE)/gemini-cli/cases-expected.jsonl

# Regenerate the JSON Schema files runners in other languages consume.
schemas: install
	$(LOOPWATCH) schemas export schemas/jsonschema

kafka:
	scripts/kafka.sh start

# The secured broker (TLS, SCRAM, ACLs) the security tests use; they start it themselves.
kafka-secure:
	scripts/kafka.sh --secure start

kafka-stop:
	scripts/kafka.sh stop
	scripts/kafka.sh --secure stop

kafka-status:
	scripts/kafka.sh status

run: install kafka
	$(LOOPWATCH) demo

bench-core: install
	$(PY) -m bench.core
	$(PY) -m bench.peer_profiles

bench: install kafka
	$(PY) -m bench.kafka $(BENCH_ARGS)

# loopwatch backtest over a generated fleet file, on one core (issue 16).
bench-backtest: install
	$(PY) -m bench.backtest $(BENCH_ARGS)

clean:
	rm -rf .pytest_cache .hypothesis build *.egg-info $(TS)/dist
