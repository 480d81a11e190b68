# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo test lint typecheck pytest docs bench bench-servers bench-capacity bench-charts bench-reference clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

# The demo runs offline on the scripted model and keeps its workspace in ./.workspace; it prints
# the console URL with a fresh admin token (#token=...) unless ATMOSPHERE_ADMIN_TOKEN is set.
demo: $(VENV)/.installed
	LLM_RUNTIME=$${LLM_RUNTIME:-scripted} \
	ATMOSPHERE_WORKSPACE_ROOT=$${ATMOSPHERE_WORKSPACE_ROOT:-$(CURDIR)/.workspace} \
	HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m samples.personal_assistant

test: $(VENV)/.installed-dev lint typecheck pytest docs

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

pytest: $(VENV)/.installed-dev
	$(BIN)/pytest

docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

# Benchmarks print JSON comparing ours with the peer in the same run; the peer (deepagents) lives
# in its own venv so the test environment stays as users install it. `make bench` runs them all,
# showing progress and an ETA, and writes benchmarks/results.json (headline figures),
# benchmarks/results/*.json (each script's whole document) and benchmarks/charts/*.png, all
# git-ignored. The committed run is benchmarks/reference/; `make bench-reference` makes the last
# run the committed one and redraws docs/images/bench-*.png (`make bench-charts` only
# redraws). docs/benchmarks.md explains the figures.
BENCH_VENV := .venv-bench

$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet -e '.[bench]'
	touch $@

bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/run_all.py

# The agent-server anchor and long runs in flight, not part of `make bench` (about an hour; the
# first run also installs Aegra and langgraph dev, which need Python >= 3.12, into
# benchmarks/.work/peers/): servers.py (ours against Aegra and langgraph dev: latency, runs/s,
# CPU per run, follower lag), inflight.py (slow-streaming runs in flight, ramped until p99 frame
# delay > 100 ms, with a py-spy profile of the server at INFLIGHT_PROFILE_AT runs) and
# kept_data.py (per-turn and upkeep cost with 1 k to 1 M kept runs). Each writes
# benchmarks/results/<name>.json (git-ignored); docs/benchmarks.md explains the figures.
INFLIGHT_PROFILE_AT ?= 400

bench-servers: $(BENCH_VENV)/.installed
	mkdir -p benchmarks/results
	$(BENCH_VENV)/bin/python benchmarks/servers.py > benchmarks/results/servers.json.tmp
	mv benchmarks/results/servers.json.tmp benchmarks/results/servers.json
	$(BENCH_VENV)/bin/python benchmarks/inflight.py --profile-at $(INFLIGHT_PROFILE_AT) \
		> benchmarks/results/inflight.json.tmp
	mv benchmarks/results/inflight.json.tmp benchmarks/results/inflight.json
	$(BENCH_VENV)/bin/python benchmarks/kept_data.py > benchmarks/results/kept_data.json.tmp
	mv benchmarks/results/kept_data.json.tmp benchmarks/results/kept_data.json

# capacity.py: per-run and per-token costs for sizing a deployment (docs/capacity.md).
bench-capacity: $(BENCH_VENV)/.installed
	mkdir -p benchmarks/results
	$(BENCH_VENV)/bin/python benchmarks/capacity.py > benchmarks/results/capacity.json.tmp
	mv benchmarks/results/capacity.json.tmp benchmarks/results/capacity.json

bench-charts: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/charts.py --from benchmarks/reference --out docs/images

bench-reference: $(BENCH_VENV)/.installed
	test -f benchmarks/results.json
	rm -rf benchmarks/reference/results
	mkdir -p benchmarks/reference
	cp -r benchmarks/results benchmarks/results.json benchmarks/reference/
	if [ -f benchmarks/timings.json ]; then cp benchmarks/timings.json benchmarks/reference/; fi
	$(MAKE) bench-charts

clean:
	rm -rf $(VENV) $(BENCH_VENV) .site .mypy_cache .pytest_cache .ruff_cache
