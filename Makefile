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

# Publish realistic failed messages to the embedded error queue, then serve them
# (controlroom demo run). Beside the server: two live site agents (controlroom site demo)
# call flaky targets, the demo's endpoints (controlroom demo endpoints) take the messages
# an operator retries, and the notification sinks (controlroom demo notifications) take
# what the outbox sends. It takes CONTROLROOM_PORT (8080) and 11-15 past it, checked
# before anything is published; a demo already serving this data directory is refused
# first; when any of its processes exits, it stops the others.
demo: $(STAMP)
	$(BIN)/controlroom demo run

serve: $(STAMP)
	$(BIN)/controlroom serve

# The tests run in parallel processes (pytest-xdist): one per core, at most 4 (they share
# the PostgreSQL and RabbitMQ servers); `make test PYTEST_WORKERS=0` runs them in one.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))

test: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/serve.py

clean:
	rm -rf $(VENV) controlroom-data controlroom-data-* controlroom-celery controlroom-site src/controlroom.egg-info
