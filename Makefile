# loopwatch — developer entry points. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOOPWATCH := $(VENV)/bin/loopwatch
# Python's own default, whatever the environment says: a module is compiled once and read from
# __pycache__ by every later process.  With PYTHONDONTWRITEBYTECODE set (this machine's image
# sets it) every process of the suite compiled what it imported, and every pytest process
# rewrote every test module's asserts again (docs/benchmarks.md, "The suite").
unexport PYTHONDONTWRITEBYTECODE
# The repository's copy of the shared conformance set (tests/data/README.md).
CONFORMANCE := tests/data/conformance
STAMP := $(VENV)/.installed

.PHONY: install ops-tools lint dist test test-unit test-traces test-traces-latest test-kafka kafka kafka-secure kafka-stop \
        kafka-status run docs bench-core bench bench-backtest bench-evaluate bench-gateway bench-verdict-readers evaluate tune mcp-servers agent-clis schemas conformance clean ts-client \
        oracles oracle-openhands oracle-gemini test-traces-openhands test-traces-gemini frameworks

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[worker,test,ops,bench,langchain,openai-agents,pydantic-ai,ag2,mcp,mcp-test,otlp,otlp-test,docs]'
	# The Claude Agent SDK from its sdist: its wheels bundle a 430 MB Claude Code; the tests
	# drive the pinned one (make agent-clis).
	$(PY) -m pip install -q --no-binary claude-agent-sdk 'claude-agent-sdk==0.2.190'
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

# The npm MCP servers the gateway's tests run against (tests/mcp_gateway/servers: package.json and
# its lock file), installed under ~/.cache/loopwatch/mcp-servers; npm's cache makes a reinstall cheap.
MCP_SERVERS ?= $(HOME)/.cache/loopwatch/mcp-servers
MCP_SERVERS_SRC := tests/mcp_gateway/servers
MCP_SERVERS_DEPS := $(MCP_SERVERS)/node_modules/.package-lock.json

$(MCP_SERVERS_DEPS): $(MCP_SERVERS_SRC)/package.json $(MCP_SERVERS_SRC)/package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js >= 20) is required for the MCP gateway's test servers" >&2; exit 1; }
	mkdir -p $(MCP_SERVERS)
	cp $(MCP_SERVERS_SRC)/package.json $(MCP_SERVERS_SRC)/package-lock.json $(MCP_SERVERS)/
	cd $(MCP_SERVERS) && npm ci --no-audit --no-fund
	touch $@

mcp-servers: $(MCP_SERVERS_DEPS)

# The agent CLIs whose hooks loopwatch hook drives in the tests (Claude Code), pinned in
# tests/hooks/agent_clis' lock file, installed under ~/.cache/loopwatch/agent-clis.
AGENT_CLIS ?= $(HOME)/.cache/loopwatch/agent-clis
AGENT_CLIS_SRC := tests/hooks/agent_clis
AGENT_CLIS_DEPS := $(AGENT_CLIS)/node_modules/.package-lock.json

$(AGENT_CLIS_DEPS): $(AGENT_CLIS_SRC)/package.json $(AGENT_CLIS_SRC)/package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js >= 20) is required for the agent CLIs the hook tests drive" >&2; exit 1; }
	mkdir -p $(AGENT_CLIS)
	cp $(AGENT_CLIS_SRC)/package.json $(AGENT_CLIS_SRC)/package-lock.json $(AGENT_CLIS)/
	cd $(AGENT_CLIS) && npm ci --no-audit --no-fund
	touch $@

agent-clis: $(AGENT_CLIS_DEPS)

# The peers' own published code, the oracles of profiles openhands and gemini-cli,
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

# CrewAI and Google ADK pin what the shared venv pins otherwise (CrewAI httpx 0.28, ADK
# opentelemetry <= 1.44): each gets a venv of its own with loopwatch and its extra, under
# ~/.cache/loopwatch/frameworks, where their tests run the framework's side on the repository's
# tree (tests/integration/framework_venv.py).  A no-op once installed; pip again when
# pyproject.toml changes.
FRAMEWORKS ?= $(HOME)/.cache/loopwatch/frameworks
FRAMEWORK_VENVS := $(FRAMEWORKS)/crewai/.installed $(FRAMEWORKS)/google-adk/.installed

$(FRAMEWORKS)/%/.installed: pyproject.toml
	test -x $(FRAMEWORKS)/$*/bin/python || $(PYTHON) -m venv $(FRAMEWORKS)/$*
	$(FRAMEWORKS)/$*/bin/python -m pip install -q --upgrade pip
	$(FRAMEWORKS)/$*/bin/python -m pip install -q '.[$*]'
	touch $@

frameworks: $(FRAMEWORK_VENVS)

# helm, kubeconform, promtool/prometheus and kubeconform's offline schemas for the ops tests,
# cached under ~/.cache/loopwatch: a no-op (well under a second) once they are there.
ops-tools: install
	LOOPWATCH_VENV=$(VENV) bash scripts/install-ops-tools.sh

# Lint, format, types (mypy's files: pyproject.toml) and the import contracts, before any test.
lint: install
	$(VENV)/bin/ruff check streams schemas tests bench harness
	$(VENV)/bin/ruff format --check streams schemas tests bench harness
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml, docs/; the front page is README.md), built with --strict:
# a broken link or anchor fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/site

# The sdist and the wheel a release would publish, checked as PyPI checks an upload;
# tests/packaging installs this wheel into fresh venvs.  setuptools' build/lib goes too: it
# would otherwise copy a module deleted since the last build into the wheel.
dist: install
	rm -rf dist build/lib build/bdist.*
	$(PY) -m build --quiet --sdist --wheel --outdir dist/
	$(VENV)/bin/twine check --strict dist/*

# The full suite: unit, conformance, golden traces, ops checks and integration tests on the
# real broker.  pytest exits non-zero (5) when it collects no tests, which fails the target;
# -rs lists every skipped test with its reason (with CI set, any skip fails the run).
# It stops the brokers it started (the plain one here, the secured one the security tests
# start) and leaves running those that were running before; PYTEST_ARGS narrows the run.
# Tests run in PYTEST_WORKERS processes (pytest-xdist): many tests wait on a broker, a worker
# or a subprocess rather than compute, and 6 processes keep 2 cores busy through those waits
# (docs/benchmarks.md, "The suite": 6 finished sooner than 4 on the 2-core machine).  Every
# broker test has its own topics and group (harness.WorkerNames), every server its own port;
# the tests of a module that share one worker stay together (tests/conftest.py, loadgroup).
# PYTEST_WORKERS=0 runs them in this process, one after another.
# The brokers the tests start (the plain one, the secured one, the fault suite's own) run with
# the JVM's first compiler only: a test broker lives minutes, and the optimizing compiler's
# work never paid back (half the broker's CPU, docs/benchmarks.md).  KAFKA_HEAP overrides it.
PYTEST_ARGS ?= tests
PYTEST_WORKERS ?= 6
TEST_BROKER_JVM ?= -Xmx512m -XX:TieredStopAtLevel=1
test: lint docs dist install ops-tools ts-client mcp-servers agent-clis oracles frameworks
	@export KAFKA_HEAP="$${KAFKA_HEAP:-$(TEST_BROKER_JVM)}"; \
	plain=$$(scripts/kafka.sh status >/dev/null 2>&1 && echo running); \
	secure=$$(scripts/kafka.sh --secure status >/dev/null 2>&1 && echo running); \
	scripts/kafka.sh start || exit 1; \
	LOOPWATCH_MCP_SERVERS=$(MCP_SERVERS) LOOPWATCH_AGENT_CLIS=$(AGENT_CLIS) LOOPWATCH_ORACLES=$(ORACLES) \
	    LOOPWATCH_FRAMEWORKS=$(FRAMEWORKS) $(PY) -m pytest -q -rs -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15 $(PYTEST_ARGS); status=$$?; \
	[ -n "$$plain" ] || scripts/kafka.sh stop; \
	[ -n "$$secure" ] || scripts/kafka.sh --secure stop >/dev/null 2>&1 || true; \
	exit $$status

test-unit: install ops-tools ts-client mcp-servers oracles
	LOOPWATCH_MCP_SERVERS=$(MCP_SERVERS) LOOPWATCH_ORACLES=$(ORACLES) $(PY) -m pytest -q -rs -p no:cacheprovider -n $(PYTEST_WORKERS) tests -m "not kafka"

# Step-for-step agreement with upstream on the golden traces.
test-traces: install
	$(LOOPWATCH) conformance --traces $(CONFORMANCE)/traces/one-run-sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/traces/expected.jsonl.gz

# The same for profile latest, on the repository's own copy of the traces.
test-traces-latest: install
	$(LOOPWATCH) conformance --profile latest --traces tests/data/conformance/latest/sessions.jsonl.gz \
	    --expected tests/data/conformance/latest/expected.jsonl.gz

conformance: install
	$(LOOPWATCH) conformance $(CONFORMANCE)/openclaw-cases.json

# Profile openhands: the golden traces, and the peer's unit-test cases transcribed.
test-traces-openhands: install
	$(LOOPWATCH) conformance --profile openhands --traces $(CONFORMANCE)/openhands/sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/openhands/expected.jsonl.gz
	$(LOOPWATCH) conformance --profile openhands --traces $(CONFORMANCE)/openhands/cases.jsonl \
	    --expected $(CONFORMANCE)/openhands/cases-expected.jsonl

# Profile gemini-cli: the golden traces, and Gemini's unit-test cases transcribed.
test-traces-gemini: install
	$(LOOPWATCH) conformance --profile gemini-cli --traces $(CONFORMANCE)/gemini-cli/sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/gemini-cli/expected.jsonl.gz
	$(LOOPWATCH) conformance --profile gemini-cli --traces $(CONFORMANCE)/gemini-cli/cases.jsonl \
	    --expected $(CONFORMANCE)/gemini-cli/cases-expected.jsonl
	$(LOOPWATCH) conformance --profile gemini-cli --traces $(CONFORMANCE)/gemini-cli-content/sessions.jsonl.gz \
	    --expected $(CONFORMANCE)/gemini-cli-content/expected.jsonl.gz
	$(LOOPWATCH) conformance --profile gemini-cli --traces $(CONFORMANCE)/gemini-cli-content/cases.jsonl \
	    --expected $(CONFORMANCE)/gemini-cli-content/cases-expected.jsonl

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
	$(LOOPWATCH) demo $(if $(KEEP),--keep-worker)

bench-core: install
	$(PY) -m bench.core
	$(PY) -m bench.peer_profiles

bench: install kafka
	$(PY) -m bench.kafka $(BENCH_ARGS)

# loopwatch backtest over a generated fleet file, on one core.
bench-backtest: install
	$(PY) -m bench.backtest $(BENCH_ARGS)

# The MCP gateway's own cost per call over a direct MCP call, alternated.
bench-gateway: install kafka
	$(PY) -m bench.gateway $(BENCH_ARGS)

# What other runners' clients cost a gated call, reading every verdict partition or only their
# runs' (LoopwatchClient verdict_partitions), alternated.
bench-verdict-readers: install kafka
	$(PY) -m bench.verdict_readers $(BENCH_ARGS)

# Import and evaluate throughput on one core: tool calls/s, per config.  With
# DATA=<directory> (as for `make evaluate`) it also times the recorded sets.
bench-evaluate: install
	$(PY) -m bench.evaluate $(if $(DATA),--data $(DATA)) $(BENCH_ARGS)

# The full evaluation over recorded trajectories, read from DATA (a directory; no
# default). It expects the files of the MIT-licensed sets docs/evaluation.md lists under "The
# data", each from its project's repository: mini-swe-agent-gemini-3-pro-swebench-verified.tar.gz
# (gruckion/mini-swe-agent, swebench_results/20251118_gemini-3-pro-74pct packed as trajs/ and
# results_summary.json), tau-bench-gpt-4o-airline.json.gz (sierra-research/tau-bench,
# historical_trajectories/gpt-4o-airline.json, gzipped) and openhands/*.json* (All-Hands-AI/OpenHands
# example outputs and test trajectories); a set that is missing is left out.  Writes the
# events, report.txt, report.json and evaluation.png to $(EVALUATION).
EVALUATION ?= build/evaluation
EVALUATION_ROWS ?= --profile configurable-final --profile latest --profile gemini-cli --profile openhands --config examples/recommended.yaml
MINI_SWE := mini-swe-agent-gemini-3-pro-swebench-verified.tar.gz
evaluate: install
	@test -n "$(DATA)" || { echo "make evaluate: give DATA=<directory of recorded trajectories> (docs/evaluation.md, \"The data\", says where to get them)" >&2; exit 2; }
	@test -d "$(DATA)" || { echo "make evaluate: DATA=$(DATA) is not a directory" >&2; exit 2; }
	rm -rf $(EVALUATION) && mkdir -p $(EVALUATION)/unpacked
	if [ -f "$(DATA)/$(MINI_SWE)" ]; then \
	    tar -xzf "$(DATA)/$(MINI_SWE)" -C $(EVALUATION)/unpacked && \
	    $(LOOPWATCH) import mini-swe-agent $(EVALUATION)/unpacked/trajs/*/*.traj.json \
	        --labels $(EVALUATION)/unpacked/results_summary.json -o $(EVALUATION)/mini-swe-agent.jsonl.gz; fi
	if [ -f "$(DATA)/tau-bench-gpt-4o-airline.json.gz" ]; then \
	    $(LOOPWATCH) import openai-chat "$(DATA)/tau-bench-gpt-4o-airline.json.gz" -o $(EVALUATION)/tau-bench.jsonl.gz; fi
	if ls "$(DATA)"/openhands/*.json* >/dev/null 2>&1; then \
	    $(LOOPWATCH) import openhands "$(DATA)"/openhands/*.json* -o $(EVALUATION)/openhands.jsonl.gz; fi
	rm -rf $(EVALUATION)/unpacked
	@ls $(EVALUATION)/*.jsonl.gz >/dev/null 2>&1 || { echo "make evaluate: none of the sets docs/evaluation.md lists is in $(DATA)" >&2; exit 1; }
	$(LOOPWATCH) evaluate $(EVALUATION)/*.jsonl.gz $(EVALUATION_ROWS) --plot $(EVALUATION)/evaluation.png | tee $(EVALUATION)/report.txt
	$(LOOPWATCH) evaluate $(EVALUATION)/*.jsonl.gz $(EVALUATION_ROWS) --json > $(EVALUATION)/report.json

# loopwatch tune over the same sets (run `make evaluate DATA=...` first: it writes the events):
# a loop planted into 30% of the runs (seed 28), then 800 seeded trials of configurable-final's
# settings, 5 folds, at most 1% of successful runs stopped outside a loop.  Writes
# $(EVALUATION)/planted.jsonl.gz, tuned.yaml (held-out figures in its comments) and front.png;
# docs/evaluation.md, "Tuning on planted loops", has the figures.
TUNE_ARGS ?= --trials 800 --folds 5 --seed 28 --max-false-alarms 0.01
tune: install
	@ls $(EVALUATION)/*.jsonl.gz >/dev/null 2>&1 || { echo "make tune: run make evaluate DATA=<directory> first (it imports the sets into $(EVALUATION))" >&2; exit 2; }
	$(LOOPWATCH) plant $$(ls $(EVALUATION)/*.jsonl.gz | grep -v /planted.jsonl.gz) -o $(EVALUATION)/planted.jsonl.gz --seed 28 --fraction 0.3
	$(LOOPWATCH) tune $(EVALUATION)/planted.jsonl.gz -o $(EVALUATION)/tuned.yaml $(TUNE_ARGS) --plot $(EVALUATION)/front.png | tee $(EVALUATION)/tune.txt

clean:
	rm -rf .pytest_cache .hypothesis build dist *.egg-info $(TS)/dist
