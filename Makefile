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
# Beside the server: two live site agents (controlroom site demo) call flaky targets, and
# the demo's endpoints (controlroom demo endpoints) take the messages an operator retries,
# confirming most and failing some again.
# Each site has two secrets (controlroom.site.demo.demo_secrets; loopback only): the token
# central presents to its agent, and the one its agent posts telemetry with.
DEMO_SITES := [{"id":"north","base_url":"http://127.0.0.1:8091","token":"demo-north-agent-secret","central_token":"demo-north-telemetry-secret"},{"id":"south","base_url":"http://127.0.0.1:8092","token":"demo-south-agent-secret","central_token":"demo-south-telemetry-secret"}]

# The trap covers INT and TERM too: sh starts background jobs with SIGINT ignored and
# skips an EXIT trap when SIGINT kills it, so Ctrl+C alone left the site agents running.
demo: $(STAMP)
	$(BIN)/controlroom demo --no-next-steps
	$(BIN)/controlroom site demo --central-url http://127.0.0.1:$${CONTROLROOM_PORT:-8080} & sites=$$!; \
	$(BIN)/controlroom demo endpoints & endpoints=$$!; \
	trap 'kill $$sites $$endpoints 2>/dev/null' EXIT INT TERM; \
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
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/serve.py

clean:
	rm -rf $(VENV) controlroom-data
