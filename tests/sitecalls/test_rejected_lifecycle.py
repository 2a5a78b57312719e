"""Rejected telemetry's life cycle, on every provider: the reason a sender gets names the
rule and never the statement, an operator re-submits a packet once its cause is fixed
(API and console), and the purge removes rejections past
``sitecalls.rejected_retention_days``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import event_log_items, rejected_telemetry
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.sitecalls.retention import purge_site_call_history
from tests.reconciliation.harness import as_site, site_entry
from tests.sitecalls.packets import packet, stored
from tests.web.test_console_http import csrf_of

OPERATOR_TOKEN = "operator-token-0123456789"
READER_TOKEN = "reader-token-0123456789ab"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
READER = {"Authorization": f"Bearer {READER_TOKEN}"}
REFUSED_TARGET = "https://erp.example/api/refused"
NOT_FOR_A_SENDER = ("SQL", "INSERT", "sqlalche.me", "site_calls")
# The packets' site (tests.sitecalls.packets): telemetry is posted with its own token, the
# only credential that may post it (docs/design.md "Site credentials").
SITE = "site-a"
AS_SITE = as_site(SITE)


def refuse_a_target(engine: sa.Engine) -> None:
    """A rule of the store the contract does not know: a trigger refuses new calls to
    ``REFUSED_TARGET`` (an error of the data's class: the packet's fault)."""
    with begin_write(engine) as conn:
        if provider_for(engine).name == "postgresql":
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse_target() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF NEW.target = '{REFUSED_TARGET}' THEN RAISE EXCEPTION 'calls to this "
                "target are refused here' USING ERRCODE = 'invalid_parameter_value'; END IF; "
                "RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_target BEFORE INSERT ON site_calls "
                "FOR EACH ROW EXECUTE FUNCTION refuse_target()"
            )
        else:
            # On SQLite only a CHECK is the input's fault (a trigger's RAISE is classed
            # with a key violation, a bug), so the trigger breaks a CHECK named for the rule.
            conn.exec_driver_sql(
                "CREATE TABLE refused_targets (target TEXT CONSTRAINT "
                '"calls to this target are refused here" CHECK (target IS NULL))'
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_target BEFORE INSERT ON site_calls "
                f"WHEN NEW.target = '{REFUSED_TARGET}' BEGIN "
                "INSERT INTO refused_targets (target) VALUES (NEW.target); END"
            )


def allow_the_target(engine: sa.Engine) -> None:
    with begin_write(engine) as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse_target" + _on_table(engine))


def _on_table(engine: sa.Engine) -> str:
    return " ON site_calls" if provider_for(engine).name == "postgresql" else ""


@pytest.fixture
def secured(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    configured = Settings(
        data_dir=settings.data_dir,
        database_url=settings.database_url,
        auth_tokens=[
            {"name": "alice", "token": OPERATOR_TOKEN, "role": "operator"},
            {"name": "rita", "token": READER_TOKEN, "role": "reader"},
        ],
        sites=[site_entry(SITE, "http://127.0.0.1:9")],
    )
    with TestClient(create_app(configured, engine, body_store), follow_redirects=False) as client:
        yield client


def resubmission_events(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(event_log_items.c.description).where(
                    event_log_items.c.event_type == "RejectedTelemetryResubmitted"
                )
            ).scalars()
        )


def test_a_store_refusal_answers_the_rule_never_the_statement(
    secured: TestClient, engine: sa.Engine
) -> None:
    refuse_a_target(engine)
    good = packet("Submitted", op_id=str(uuid.uuid4()))
    refused = packet("Submitted", op_id=str(uuid.uuid4()), target=REFUSED_TARGET)
    answer = secured.post("/api/site-calls/telemetry", json=[good, refused], headers=AS_SITE)
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == [0]
    (rejection,) = answer.json()["rejected"]
    reason = rejection["reason"]
    assert reason.startswith("the store refused the packet: ")
    assert "calls to this target are refused here" in reason
    assert not any(word in reason for word in NOT_FOR_A_SENDER), reason
    assert "\n" not in reason


def test_an_operator_resubmits_a_rejected_packet_once_its_cause_is_fixed(
    secured: TestClient, engine: sa.Engine
) -> None:
    refuse_a_target(engine)
    op_id = str(uuid.uuid4())
    refused = packet("Submitted", op_id=op_id, target=REFUSED_TARGET)
    assert secured.post("/api/site-calls/telemetry", json=[refused], headers=AS_SITE).json()[
        "rejected"
    ]
    (kept,) = secured.get("/api/site-calls/rejected", headers=READER).json()["items"]
    path = f"/api/site-calls/rejected/{kept['id']}/resubmit"

    assert secured.post(path, headers=READER).status_code == 403
    again = secured.post(path, headers=OPERATOR)
    assert again.status_code == 409, again.text
    assert again.json()["outcome"] == "Rejected"
    assert "calls to this target are refused here" in again.json()["reason"]
    assert len(secured.get("/api/site-calls/rejected", headers=READER).json()["items"]) == 1

    allow_the_target(engine)
    accepted = secured.post(path, headers=OPERATOR)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json() == {
        "id": kept["id"],
        "outcome": "Accepted",
        "reason": None,
        "tracked_operation_id": op_id,
    }
    assert stored(engine, op_id).target == REFUSED_TARGET
    assert secured.get("/api/site-calls/rejected", headers=READER).json()["items"] == []
    assert secured.post(path, headers=OPERATOR).status_code == 404
    events = resubmission_events(engine)
    assert len(events) == 2 and all(event.startswith("alice re-submitted") for event in events)
    assert sorted(event.split(": ")[1] for event in events) == ["accepted", "rejected again"]


def test_the_console_resubmits_with_post_redirect_get_and_shows_the_outcome(
    secured: TestClient, engine: sa.Engine
) -> None:
    refuse_a_target(engine)
    op_id = str(uuid.uuid4())
    refused = packet("Submitted", op_id=op_id, target=REFUSED_TARGET)
    posted = secured.post("/api/site-calls/telemetry", json=[refused], headers=AS_SITE)
    assert posted.status_code == 200 and posted.json()["rejected"], posted.text
    secured.post("/signin", data={"token": READER_TOKEN})
    as_reader = secured.get("/site-calls/rejected")
    assert "Re-submit" not in as_reader.text
    secured.post("/signin", data={"token": OPERATOR_TOKEN})
    page = secured.get("/site-calls/rejected")
    (action,) = re.findall(r'action="(/site-calls/rejected/[0-9a-f-]{36}/resubmit)"', page.text)

    again = secured.post(action, data={"csrf_token": csrf_of(page.text)})
    assert again.status_code == 303
    shown = secured.get(again.headers["location"])
    assert "Rejected again" in shown.text
    assert "calls to this target are refused here" in shown.text

    allow_the_target(engine)
    done = secured.post(action, data={"csrf_token": csrf_of(page.text)})
    assert done.status_code == 303
    shown = secured.get(done.headers["location"])
    assert "Accepted" in shown.text and f'href="/site-calls/{op_id}"' in shown.text
    assert "No telemetry has been rejected." in shown.text
    assert stored(engine, op_id) is not None
    assert len(resubmission_events(engine)) == 2


def test_rejections_past_their_retention_are_purged(engine: sa.Engine, tmp_path: Path) -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    ages = {"old": 91, "recent": 89}
    with begin_write(engine) as conn:
        conn.execute(
            sa.insert(rejected_telemetry),
            [
                {
                    "id": str(uuid.uuid4()),
                    "source": name,
                    "packet": b"{}",
                    "reason": "test",
                    "rejected_at_utc": now - timedelta(days=days),
                }
                for name, days in ages.items()
            ],
        )
    assert Settings(data_dir=tmp_path).sitecalls.rejected_retention_days == 90
    result = purge_site_call_history(
        engine,
        now=now,
        site_call_days=365,
        audit_days=365,
        tombstone_days=30,
        rejected_days=90,
        chunk=1,
    )
    assert result.rejected_packets == 1
    with engine.connect() as conn:
        assert list(conn.execute(sa.select(rejected_telemetry.c.source)).scalars()) == ["recent"]


def test_a_resubmission_the_contract_refuses_again_names_the_call_it_claims(
    secured: TestClient,
) -> None:
    # As the first refusal did: an operator must see which call is still refused.
    op_id = str(uuid.uuid4())
    refused = packet("Submitted", op_id=op_id.upper(), surprise=1)
    answer = secured.post("/api/site-calls/telemetry", json=[refused], headers=AS_SITE)
    assert answer.json()["rejected"][0]["tracked_operation_id"] == op_id.upper()
    (kept,) = secured.get("/api/site-calls/rejected", headers=READER).json()["items"]

    again = secured.post(f"/api/site-calls/rejected/{kept['id']}/resubmit", headers=OPERATOR)

    assert again.status_code == 409, again.text
    assert again.json()["tracked_operation_id"] == op_id
