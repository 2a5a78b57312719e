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
# A demo already serving this data directory makes the first command refuse, before it
# publishes anything. The agents' ports follow CONTROLROOM_PORT (11-13 past it), and
# central gets them, each site with its two secrets (controlroom.site.demo.demo_secrets;
# loopback only), from `controlroom site demo --print-sites`. The notification sinks
# (controlroom demo notifications: a webhook sink refusing `pager`, an SMTP sink) take
# ports 14 and 15 past it, and central their channels and rules from --print-settings.
DEMO_CENTRAL := http://127.0.0.1:$${CONTROLROOM_PORT:-8080}

# The trap covers INT and TERM too: sh starts background jobs with SIGINT ignored and
# skips an EXIT trap when SIGINT kills it, so Ctrl+C alone left the site agents running.
demo: $(STAMP)
	$(BIN)/controlroom demo --no-next-steps --refuse-if-serving
	sites_json=$$($(BIN)/controlroom site demo --print-sites --central-url $(DEMO_CENTRAL)) || exit 1; \
	outbox_json=$$($(BIN)/controlroom demo notifications --print-settings --central-url $(DEMO_CENTRAL)) || exit 1; \
	$(BIN)/controlroom site demo --central-url $(DEMO_CENTRAL) & sites=$$!; \
	$(BIN)/controlroom demo endpoints & endpoints=$$!; \
	$(BIN)/controlroom demo notifications --central-url $(DEMO_CENTRAL) & sinks=$$!; \
	trap 'kill $$sites $$endpoints $$sinks 2>/dev/null' EXIT INT TERM; \
	CONTROLROOM_SITES="$$sites_json" CONTROLROOM_NOTIFICATIONS="$$outbox_json" $(BIN)/controlroom serve

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
