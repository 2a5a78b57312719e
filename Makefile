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
# Two live site agents (controlroom site demo) call flaky targets beside the server.
DEMO_SITES := [{"id":"north","base_url":"http://127.0.0.1:8091"},{"id":"south","base_url":"http://127.0.0.1:8092"}]

demo: $(STAMP)
	$(BIN)/controlroom demo
	$(BIN)/controlroom site demo & trap 'kill $$!' EXIT; \
	CONTROLROOM_SITES='$(DEMO_SITES)' $(BIN)/controlroom serve

serve: $(STAMP)
	$(BIN)/controlroom serve

# The tests run in parallel processes (pytest-xdist): one per core, at most 4 (they share
# the PostgreSQL and RabbitMQ servers); `make test PYTEST_WORKERS=0` runs them in one.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))

test: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/ingest.py

clean:
	rm -rf $(VENV) controlroom-data
