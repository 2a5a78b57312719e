"""A failed Python task's page: its traceback as frames (the application's shown, library
runs folded), its arguments from the body, all of it text; in-process on every provider,
and in Chromium."""

from __future__ import annotations

import html
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.nsb import failed_headers
from tests.python_tasks import CELERY_GROUP as CELERY
from tests.python_tasks import DRAMATIQ_GROUP as DRAMATIQ
from tests.python_tasks import celery_failure, dramatiq_failure, sample_traceback
from tests.python_tasks import ingest_tasks as ingest
from tests.retries.conftest import TIMEOUT, store_failed
from tests.web.conftest import ConsoleServer

expect.set_options(timeout=TIMEOUT * 1000)


@pytest.fixture
def put(
    settings: Settings, writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore
) -> Any:
    def put(headers: dict[str, str | None], body: bytes) -> str:
        return store_failed(settings, writer, body_store, headers, body).unique_message_id

    return put


def test_a_celery_task_shows_its_frames_and_arguments(console: TestClient, put: Any) -> None:
    message_id = put(*celery_failure("task-1"))
    page = console.get(f"/messages/{message_id}").text
    assert 'data-testid="python-traceback"' in page
    assert "Python task" in page and "shop.tasks.charge_card" in page
    # Two application frames shown, the celery frames above and requests below folded.
    assert page.count('data-testid="app-frame"') == 2
    assert page.count('data-testid="library-frames"') == 2
    assert page.count('data-testid="library-frame"') == 3
    assert "2 library frames" in page and "1 library frame\n" in page
    assert "/app/shop/payments.py</span>, line 88, in" in page
    assert "response.raise_for_status()" in page
    body = html.unescape(console.get(f"/messages/{message_id}/body/view").text)
    assert 'data-testid="task-arguments"' in body
    assert '<pre data-testid="task-arg">"order-4411"</pre>' in body
    assert '<pre data-testid="task-arg">1999</pre>' in body
    assert "<dt>currency=</dt>" in body and '"EUR"' in body


def test_a_dramatiq_actor_shows_its_arguments(console: TestClient, put: Any) -> None:
    message_id = put(*dramatiq_failure("task-2"))
    body = html.unescape(console.get(f"/messages/{message_id}/body/view").text)
    assert '<pre data-testid="task-arg">"quarterly-2026-q3"</pre>' in body
    assert "region=" in body
    page = console.get(f"/messages/{message_id}").text
    # The stdlib's json frames are folded; the actor's module is shown.
    assert page.count('data-testid="app-frame"') == 2
    assert "reports/storage.py" in page


def test_a_chained_traceback_shows_each_section(console: TestClient, put: Any) -> None:
    headers, body = celery_failure("task-3", trace="celery_chained_cause.txt")
    message_id = put(headers, body)
    page = console.get(f"/messages/{message_id}").text
    assert page.count('data-testid="traceback-section"') == 2
    assert "The above exception was the direct cause of the following exception:" in page


def test_a_body_of_another_shape_is_shown_as_a_body(console: TestClient, put: Any) -> None:
    headers, _ = celery_failure("task-4")
    message_id = put(headers, b'{"not": "a celery body"}')
    body = console.get(f"/messages/{message_id}/body/view").text
    assert "task-arguments" not in body and 'data-testid="body"' in body
    headers = {**headers, "Controlroom.TaskQueue": None}
    message_id = put({**headers, "NServiceBus.MessageId": "task-5"}, celery_failure("x")[1])
    body = console.get(f"/messages/{message_id}/body/view").text
    assert "task-arguments" not in body  # not a task: the body as today


def test_everything_of_a_traceback_and_arguments_is_text(console: TestClient, put: Any) -> None:
    evil = "<script>alert(1)</script>"
    trace = (
        sample_traceback("celery_http_error.txt")
        .replace("charge_card", evil)
        .replace("response.raise_for_status()", f"x = '{evil}'")
    )
    headers, _ = celery_failure("task-6")
    headers["NServiceBus.ExceptionInfo.StackTrace"] = trace.replace("/app/shop", f"/app/{evil}")
    body = f'[["{evil}"], {{"{evil}": "{evil}"}}, null]'.encode()
    message_id = put(headers, body)
    for path in (f"/messages/{message_id}", f"/messages/{message_id}/body/view"):
        text = console.get(path).text
        assert evil not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_a_task_whose_body_was_not_kept_says_so_and_why(console: TestClient, put: Any) -> None:
    reason = "the broker refused the body: <PRECONDITION_FAILED - message size 20971520>"
    headers, _ = celery_failure("task-7")
    message_id = put(headers | {"Controlroom.TaskQueue.BodyNotKept": reason}, b"")
    for path in (f"/messages/{message_id}", f"/messages/{message_id}/body/view"):
        page = html.unescape(console.get(path).text)
        assert 'data-testid="body-not-kept"' in page
        assert f"The body was not kept: {reason}" in page
    assert "&lt;PRECONDITION_FAILED" in console.get(f"/messages/{message_id}/body/view").text
    kept = put(*celery_failure("task-8"))
    assert "body-not-kept" not in console.get(f"/messages/{kept}").text


def test_a_dotnet_trace_is_shown_as_before(console: TestClient, store: Any) -> None:
    message_id = store("dotnet-1", b"{}")
    page = console.get(f"/messages/{message_id}").text
    assert "python-traceback" not in page and 'data-testid="stack-trace"' in page
    assert "Python task" not in page


# --- the "Python task" filter -------------------------------------------------------------
def test_the_console_list_filters_by_task_queue(
    writer: FailedMessageBatchWriter, console: TestClient
) -> None:
    ids = ingest(writer)
    page = console.get("/messages").text
    assert 'data-testid="python-task-filter"' in page
    assert "Celery (2 unresolved)" in page and "Dramatiq (1 unresolved)" in page
    filtered = console.get(f"/messages?group={DRAMATIQ}").text
    assert ids["dramatiq-1"] in filtered
    assert not {ids["celery-1"], ids["celery-2"], ids["dotnet-1"]} & set(filtered.split('"'))
    assert f'<option value="{DRAMATIQ}" selected>' in filtered


def test_no_python_task_no_filter(writer: FailedMessageBatchWriter, console: TestClient) -> None:
    attempt = parse_failed_message(failed_headers("dotnet-1"), b"{}", max_body_size_to_store=10)
    writer.write(IngestionBatch(attempts=[attempt]))
    assert "python-task-filter" not in console.get("/messages").text


# --- in Chromium --------------------------------------------------------------------------
def test_library_frames_unfold_and_arguments_load(console_server: ConsoleServer, page: Any) -> None:
    headers, body = celery_failure("browser-1")
    console_server.publish(headers, body)
    console_server.wait_until_stored(1)
    page.goto(console_server.base_url + "/messages")
    page.locator("table.messages tbody a").first.click()
    traceback = page.get_by_test_id("python-traceback")
    expect(traceback.get_by_test_id("app-frame")).to_have_count(2)
    expect(traceback.get_by_test_id("app-frame").last).to_contain_text("in charge")
    library = traceback.get_by_test_id("library-frame")
    expect(library).to_have_count(3)
    expect(library.first).to_be_hidden()
    traceback.get_by_text("2 library frames").click()
    expect(library.first).to_be_visible()
    expect(library.first).to_contain_text("celery/app/trace.py")
    expect(traceback.get_by_test_id("stack-trace")).to_be_hidden()  # the text, folded
    arguments = page.get_by_test_id("task-arguments")
    expect(arguments).to_contain_text('"order-4411"')
    expect(arguments).to_contain_text("card_token=")
    expect(page.get_by_test_id("body")).to_be_hidden()


def test_the_python_task_filter_in_the_browser(console_server: ConsoleServer, page: Any) -> None:
    for headers, body in (celery_failure("c-1"), dramatiq_failure("d-1"), celery_failure("c-2")):
        console_server.publish(headers, body)
    console_server.publish(failed_headers("dotnet-1"), b"{}")
    console_server.wait_until_stored(4)
    page.goto(console_server.base_url + "/messages")
    expect(page.get_by_test_id("total")).to_have_text("4 messages")
    page.get_by_label("Python task").select_option(label="Celery (2 unresolved)")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_test_id("total")).to_have_text("2 messages")
    expect(page.locator("table.messages tbody")).to_contain_text("shop.tasks.charge_card")
    assert CELERY in page.url


def test_a_line_number_past_pythons_digit_limit_is_shown_not_a_500(
    console: TestClient, client: TestClient, put: Any
) -> None:
    # int() refuses more than 4,300 digits (sys.get_int_max_str_digits): a traceback that
    # came from anywhere must still render, its frame's line as written.
    digits = "9" * 5000
    headers, body = celery_failure("task-7")
    headers["NServiceBus.ExceptionInfo.StackTrace"] = (
        "Traceback (most recent call last):\n"
        f'  File "/app/shop/tasks.py", line {digits}, in charge_card\n'
        "    pay()\n"
        "ValueError: boom\n"
    )
    message_id = put(headers, body)
    page = console.get(f"/messages/{message_id}")
    assert page.status_code == 200
    assert "charge_card" in page.text
    detail = client.get(f"/api/errors/{message_id}")
    assert detail.status_code == 200
    (section,) = detail.json()["python_traceback"]["sections"]
    assert [frame["function"] for frame in section["frames"]] == ["charge_card"]
