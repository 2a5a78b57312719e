# The two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo serve test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Publish realistic failed messages to the embedded error queue, then serve them.
demo: $(STAMP)
	$(BIN)/controlroom demo
	$(BIN)/controlroom serve

serve: $(STAMP)
	$(BIN)/controlroom serve

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/ingest.py

clean:
	rm -rf $(VENV) controlroom-data
