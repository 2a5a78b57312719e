"""Realistic NServiceBus failed messages for ``controlroom demo`` (pure: no I/O).

``generate_demo_messages`` returns the messages a small shop's endpoints would leave in an
error queue: header sets modelled on the real ones in ``../shared/samples`` (NServiceBus
v5 to v10), generated here in code. The set always holds one of each variety an operator
should see (docs/decisions.md "The demo shows every variety an operator meets"):

* several endpoints (Sales, Billing, Shipping, Warehouse, a legacy v5 fulfilment endpoint)
  on several hosts, each host with a stable ``$.diagnostics.hostid`` (32 hex digits);
* one message failing three times (same ``NServiceBus.MessageId``, later
  ``NServiceBus.TimeOfFailure``: ingestion folds them into one row with three attempts);
* one event failing in two subscriber endpoints (same message id, two rows);
* JSON, XML, binary (``application/octet-stream``) and gzip'd (``Content-Encoding:
  gzip``) bodies, small ones and one over 102400 bytes;
* multi-line .NET stack traces (with an inner exception) and Python tracebacks (one
  chained);
* ``queue@MACHINE`` (MSMQ) addresses, and a v5 message without
  ``NServiceBus.ProcessingEndpoint`` (the endpoint comes from ``NServiceBus.FailedQ``);
* exactly one deliberately broken message without ``NServiceBus.FailedQ``, which becomes
  a failed import.

The rest of ``count`` are ordinary failures of the same endpoints, some failing again.
Messages come back sorted by time of failure, the order an error queue receives them.

``failed_again_headers`` is the other side, for ``controlroom demo endpoints``: the headers
with which one of these endpoints moves a retried message back to the error queue when it
fails again (``demo_endpoint_queues`` names the queues the retries arrive in).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from controlroom.demo_sizes import DEFAULT_COUNT, MIN_COUNT
from controlroom.errors.ingest import headers as h

BIG_BODY_MIN_BYTES = 110_000
"""Size the big body exceeds: above the default ``max_body_size_to_store`` (102400)."""

_WINDOW_SECONDS = 2 * 3600  # failures are spread over the two hours before ``now``


@dataclass(frozen=True, slots=True)
class DemoMessage:
    """One message as it sits in the error queue: headers and the exact body bytes."""

    headers: dict[str, str | None]
    body: bytes


def format_nsb_time(instant: datetime) -> str:
    """``instant`` in the NServiceBus wire format ``yyyy-MM-dd HH:mm:ss:ffffff Z`` (UTC).

    Raises ``ValueError`` for a naive ``datetime``.
    """
    if instant.tzinfo is None:
        raise ValueError("an NServiceBus timestamp needs a timezone-aware datetime")
    utc = instant.astimezone(UTC)
    return f"{utc.year:04d}-{utc:%m-%d %H:%M:%S:%f} Z"  # not %Y: four digits always


def host_id(host: str) -> str:
    """The stable ``$.diagnostics.hostid`` of ``host``: 32 lower-case hex digits.

    NServiceBus derives its host id deterministically from the machine and install path;
    an MD5 of the host name gives the same shape and the same stability.
    """
    return hashlib.md5(f"controlroom-demo/{host}".encode(), usedforsecurity=False).hexdigest()


def generate_demo_messages(
    count: int = DEFAULT_COUNT, *, seed: int, now: datetime
) -> list[DemoMessage]:
    """``count`` failed messages, every variety of the module docstring among them.

    Deterministic: the same ``count``, ``seed`` and ``now`` give the same messages, byte
    for byte. Every time of failure lies in the two hours before ``now`` (UTC).
    Raises ``ValueError`` when ``count < MIN_COUNT`` or ``now`` is naive.
    """
    if count < MIN_COUNT:
        raise ValueError(f"count must be at least {MIN_COUNT} (one message of each variety)")
    if now.tzinfo is None:
        raise ValueError("now must be a timezone-aware datetime")
    factory = _FailureFactory(random.Random(seed), now.astimezone(UTC))
    failures = factory.showcase()
    failures.extend(factory.fillers(count - len(failures)))
    failures.sort(key=lambda failure: failure.time_of_failure)
    return [DemoMessage(headers=_headers(failure), body=failure.body) for failure in failures]


# --- endpoints and hosts ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Endpoint:
    name: str
    hosts: tuple[str, ...]
    version: str | None  # NServiceBus version; None for the Python service
    msmq: bool = False  # MSMQ addresses are queue@MACHINE
    v5: bool = False  # NServiceBus v5 writes no ProcessingEndpoint / ProcessingMachine

    def address(self, host: str) -> str:
        return f"{self.name}@{host}" if self.msmq else self.name


_CLIENT = _Endpoint("ClientUI", ("WEB-01", "WEB-02"), "9.2.3")
_SALES = _Endpoint("Sales", ("SALES-VM01", "SALES-VM02"), "9.2.3")
_BILLING = _Endpoint("Billing", ("BILLING-VM01",), "7.8.4", msmq=True)
_SHIPPING = _Endpoint("Shipping", ("SHIP-VM01", "SHIP-VM02"), "10.2.0")
_WAREHOUSE = _Endpoint("Warehouse", ("wh-py-01",), None)
_LEGACY = _Endpoint("Legacy.Fulfillment", ("LEGACY-SRV",), "5.2.14", msmq=True, v5=True)
# The endpoints that fail messages (ClientUI only sends), so the ones retries go back to.
_RECEIVERS = (_SALES, _BILLING, _SHIPPING, _WAREHOUSE, _LEGACY)


# --- exceptions ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Exception:
    type: str
    message: str
    source: str
    stack_trace: str


# The receive pipeline below a handler, as NServiceBus 8-10 on RabbitMQ print it (also
# used by the benchmarks to shape their stack traces).
NSB_RECEIVE_PIPELINE = (
    "NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext context)",
    "NServiceBus.LoadHandlersConnector.Invoke(IIncomingLogicalMessageContext context, "
    "Func`2 stage)",
    "NServiceBus.DeserializeMessageConnector.Invoke(IIncomingPhysicalMessageContext context, "
    "Func`2 stage)",
    "NServiceBus.ProcessingStatisticsBehavior.Invoke(IIncomingPhysicalMessageContext context, "
    "Func`2 next)",
    "NServiceBus.TransportReceiveToPhysicalMessageConnector.Invoke(ITransportReceiveContext "
    "context, Func`2 next)",
    "NServiceBus.RetryAcknowledgementBehavior.Invoke(ITransportReceiveContext context, "
    "Func`2 next)",
    "NServiceBus.MainPipelineExecutor.Invoke(MessageContext messageContext, "
    "CancellationToken cancellationToken)",
    "NServiceBus.Transport.RabbitMQ.MessagePump.Process(AsyncEventingBasicConsumer consumer, "
    "BasicDeliverEventArgs message, CancellationToken messageProcessingCancellationToken)",
)

# NServiceBus 5 on MSMQ: a synchronous pipeline (see the v5 sample).
_PIPELINE_V5 = (
    "NServiceBus.Unicast.MessageHandlerRegistry.Invoke(Object handler, Object message, "
    "Dictionary`2 dictionary)",
    "NServiceBus.InvokeHandlersBehavior.Invoke(IncomingContext context, Action next)",
    "NServiceBus.LoadHandlersBehavior.Invoke(IncomingContext context, Action next)",
    "NServiceBus.UnitOfWorkBehavior.Invoke(IncomingContext context, Action next)",
    "NServiceBus.ProcessingStatisticsBehavior.Invoke(IncomingContext context, Action next)",
    "NServiceBus.Unicast.Transport.TransportReceiver.ProcessMessage(TransportMessage message)",
    "NServiceBus.Transports.Msmq.MsmqDequeueStrategy.Action()",
)

_ASYNC_BOUNDARY = "--- End of stack trace from previous location ---"
_DURING_HANDLING = "During handling of the above exception, another exception occurred:"


def _at(frames: list[str]) -> str:
    return "\n".join(frame if frame.startswith("---") else f"   at {frame}" for frame in frames)


def _dotnet_exception(
    kind: str,
    message: str,
    source: str,
    frames: list[str],
    *,
    inner: tuple[str, str, list[str]] | None = None,
    v5: bool = False,
) -> _Exception:
    """A .NET exception as ``Exception.ToString()`` prints it: an inner exception's frames
    first when there is one, then ``frames`` (throw site first), then the receive pipeline
    (behind an async boundary from NServiceBus 6 on)."""
    head = f"{kind}: {message}"
    parts: list[str] = []
    if inner is not None:
        inner_kind, inner_message, inner_frames = inner
        head += f" ---> {inner_kind}: {inner_message}"
        parts += [_at(inner_frames), "   --- End of inner exception stack trace ---"]
    pipeline = [*frames, *_PIPELINE_V5] if v5 else [*frames, _ASYNC_BOUNDARY, *NSB_RECEIVE_PIPELINE]
    parts.append(_at(pipeline))
    return _Exception(kind, message, source, "\n".join([head, *parts]))


def _python_exception(
    kind: str, message: str, frames: list[tuple[str, int, str, str]], *, cause: str = ""
) -> _Exception:
    """A Python traceback: ``frames`` are (path, line, function, source line), outermost
    first; ``cause`` is an earlier traceback this one was raised while handling."""
    lines = ["Traceback (most recent call last):"]
    for path, line, function, code in frames:
        lines += [f'  File "{path}", line {line}, in {function}', f"    {code}"]
    lines.append(f"{kind}: {message}")
    trace = "\n".join(lines)
    if cause:
        trace = f"{cause}\n\n{_DURING_HANDLING}\n\n{trace}"
    return _Exception(kind, message, kind.partition(".")[0], trace)


# --- one failure, before it becomes headers -----------------------------------------------
@dataclass(frozen=True, slots=True)
class _Failure:
    message_id: str
    message_type: str  # full .NET type name
    assembly: str
    intent: str  # Send | Publish
    sender: _Endpoint
    sender_host: str
    receiver: _Endpoint
    receiver_host: str
    content_type: str
    body: bytes
    exception: _Exception
    time_sent: datetime
    time_of_failure: datetime
    conversation_id: str
    content_encoding: str | None = None
    delayed_retries: int = 0
    broken: bool = False  # drop NServiceBus.FailedQ: the message becomes a failed import


def _headers(failure: _Failure) -> dict[str, str | None]:
    """The header set NServiceBus writes on a message it moves to the error queue."""
    receiver, sender, exc = failure.receiver, failure.sender, failure.exception
    headers: dict[str, str | None] = {
        h.HOST_DISPLAY_NAME: failure.receiver_host,
        h.HOST_ID: host_id(failure.receiver_host),
        h.ORIGINATING_HOST_ID: host_id(failure.sender_host),
        h.CONTENT_TYPE: failure.content_type,
        h.CONVERSATION_ID: failure.conversation_id,
        "NServiceBus.CorrelationId": failure.message_id,
        h.ENCLOSED_MESSAGE_TYPES: f"{failure.message_type}, {failure.assembly}, "
        "Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
        h.EXCEPTION_TYPE: exc.type,
        h.EXCEPTION_MESSAGE: exc.message,
        h.EXCEPTION_SOURCE: exc.source,
        h.EXCEPTION_STACK_TRACE: exc.stack_trace,
        h.FAILED_Q: receiver.address(failure.receiver_host),
        h.MESSAGE_ID: failure.message_id,
        h.MESSAGE_INTENT: failure.intent,
        h.ORIGINATING_ENDPOINT: sender.name,
        h.ORIGINATING_MACHINE: failure.sender_host,
        h.PROCESSING_ENDPOINT: receiver.name,
        h.PROCESSING_MACHINE: failure.receiver_host,
        h.REPLY_TO_ADDRESS: sender.address(failure.sender_host),
        h.TIME_OF_FAILURE: format_nsb_time(failure.time_of_failure),
        h.TIME_SENT: format_nsb_time(failure.time_sent),
    }
    if receiver.version is not None:
        headers["NServiceBus.Version"] = receiver.version
        if not receiver.version.startswith("10."):
            headers["NServiceBus.ExceptionInfo.HelpLink"] = None  # v5-v9 write a null one
    if receiver.v5:
        del headers[h.PROCESSING_ENDPOINT], headers[h.PROCESSING_MACHINE]
        headers["CorrId"] = f"{failure.message_id}\\0"
        headers["WinIdName"] = f"{failure.receiver_host}\\svc-fulfillment"
    else:
        headers.update(_exception_data(failure))
    if failure.delayed_retries:
        headers["NServiceBus.Retries"] = str(failure.delayed_retries)
        headers["NServiceBus.Retries.Timestamp"] = format_nsb_time(
            failure.time_of_failure - timedelta(seconds=10)
        )
    if failure.content_encoding is not None:
        headers[h.CONTENT_ENCODING] = failure.content_encoding
    if failure.broken:
        del headers[h.FAILED_Q]
    return dict(sorted(headers.items()))


def _exception_data(failure: _Failure) -> dict[str, str | None]:
    """``NServiceBus.ExceptionInfo.Data.*``: what NServiceBus 7+ adds about the handler."""
    short_type = failure.message_type.rpartition(".")[2]
    started = failure.time_of_failure - timedelta(milliseconds=42)
    return {
        "NServiceBus.ExceptionInfo.Data.Message ID": failure.message_id,
        "NServiceBus.ExceptionInfo.Data.Message type": failure.message_type,
        "NServiceBus.ExceptionInfo.Data.Handler type": (
            f"{failure.receiver.name}.{short_type}Handler"
        ),
        "NServiceBus.ExceptionInfo.Data.Handler start time": format_nsb_time(started),
        "NServiceBus.ExceptionInfo.Data.Handler failure time": format_nsb_time(
            failure.time_of_failure
        ),
        "NServiceBus.ExceptionInfo.Data.Transport message ID": failure.message_id,
    }


# --- bodies -------------------------------------------------------------------------------
def _json(value: object) -> bytes:
    # NServiceBus's SystemJsonSerializer writes compact UTF-8 JSON.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _xml(root: str, namespace: str, fields: dict[str, str]) -> bytes:
    # NServiceBus's XmlSerializer: the message namespace under http://tempuri.net/.
    elements = "".join(f"  <{name}>{value}</{name}>\n" for name, value in fields.items())
    return (
        '<?xml version="1.0"?>\n'
        f'<{root} xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        f'xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns="http://tempuri.net/{namespace}">\n'
        f"{elements}</{root}>\n"
    ).encode()


_PRODUCTS = (
    ("BLU-CHAIR-04", "Blue chair"),
    ("OAK-TABLE-12", "Oak table"),
    ("CAFE-CUP-02", "Café crème cup"),
    ("LAMP-GRN-07", "Grüne Lampe"),
    ("RUG-WOOL-33", "Tapis tissé à la main"),
)


# --- the generator ------------------------------------------------------------------------
class _FailureFactory:
    """Builds failures from one random stream, so a seed fixes every value."""

    def __init__(self, rng: random.Random, now: datetime) -> None:
        self._rng = rng
        self._now = now

    # identifiers and times
    def _guid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _failure_time(self) -> datetime:
        return self._now - timedelta(seconds=self._rng.uniform(600, _WINDOW_SECONDS))

    def _later(self, instant: datetime, low: float, high: float) -> datetime:
        """``low`` to ``high`` seconds after ``instant``, narrowed to stay before ``now``
        (never clamped onto it: two attempts at one time would count as one)."""
        remaining = (self._now - instant).total_seconds()
        seconds = self._rng.uniform(min(low, remaining / 2), min(high, remaining))
        return instant + timedelta(seconds=seconds)

    def _order_id(self) -> str:
        return f"ORD-{self._rng.randrange(100_000, 999_999)}"

    def _amount(self) -> str:
        return f"{self._rng.randrange(500, 250_000) / 100:.2f}"

    def _failure(
        self,
        message_type: str,
        sender: _Endpoint,
        receiver: _Endpoint,
        body: bytes,
        exception: _Exception,
        *,
        content_type: str = "application/json",
        intent: str = "Send",
        content_encoding: str | None = None,
        delayed_retries: int = 0,
    ) -> _Failure:
        failed_at = self._failure_time()
        return _Failure(
            message_id=self._guid(),
            message_type=message_type,
            assembly=message_type.rpartition(".")[0],
            intent=intent,
            sender=sender,
            sender_host=self._rng.choice(sender.hosts),
            receiver=receiver,
            receiver_host=self._rng.choice(receiver.hosts),
            content_type=content_type,
            body=body,
            exception=exception,
            time_sent=failed_at - timedelta(seconds=self._rng.uniform(0.05, 30)),
            time_of_failure=failed_at,
            conversation_id=self._guid(),
            content_encoding=content_encoding,
            delayed_retries=delayed_retries,
        )

    def _again(self, failure: _Failure, exception: _Exception | None = None) -> _Failure:
        """The same message failing again later (after an operator retried it)."""
        return replace(
            failure,
            time_of_failure=self._later(failure.time_of_failure, 60, 1800),
            exception=exception or failure.exception,
        )

    # --- the showcase: one of each variety ------------------------------------------------
    def showcase(self) -> list[_Failure]:
        """``MIN_COUNT`` failures covering every variety of the module docstring."""
        place_order = self.place_order()
        deadlock = self.sales_deadlock()
        again = [self._again(place_order, deadlock) for _ in range(2)]
        failures = [place_order, *again, *self.order_placed_in_two_subscribers()]
        failures += [
            self.charge_credit_card(),
            self.invoice_pdf(),
            self.catalog_sync_gzip(),
            self.price_list_import(),
            self.reserve_stock(),
            self.legacy_shipment(),
            self.broken_ship_order(),
        ]
        assert len(failures) == MIN_COUNT
        return failures

    def fillers(self, count: int) -> list[_Failure]:
        """``count`` ordinary failures; about one in five is an earlier one failing again
        (always a first failure, which lies at least 10 minutes before ``now``, so every
        repeat has room to be later than it)."""
        kinds: tuple[Callable[[], _Failure], ...] = (
            self.place_order,
            self.charge_credit_card,
            self.ship_order,
            self.reserve_stock,
        )
        firsts: list[_Failure] = []
        failures: list[_Failure] = []
        for _ in range(count):
            if firsts and self._rng.random() < 0.2:
                failures.append(self._again(self._rng.choice(firsts)))
            else:
                firsts.append(self._rng.choice(kinds)())
                failures.append(firsts[-1])
        return failures

    # --- Sales ----------------------------------------------------------------------------
    def place_order(self) -> _Failure:
        sku, _ = self._rng.choice(_PRODUCTS)
        body = _json(
            {
                "OrderId": self._order_id(),
                "CustomerId": f"CUST-{self._rng.randrange(1000, 9999)}",
                "Lines": [{"Sku": sku, "Quantity": self._rng.randrange(1, 6)}],
            }
        )
        exception = _dotnet_exception(
            "System.InvalidOperationException",
            f"Customer CUST-{self._rng.randrange(1000, 9999)} is on credit hold; "
            "the order cannot be placed.",
            "Sales",
            [
                "Sales.Domain.Order.Place(CustomerStatus status) in "
                "/src/Sales/Domain/Order.cs:line 58",
                "Sales.PlaceOrderHandler.Handle(PlaceOrder message, IMessageHandlerContext "
                "context) in /src/Sales/PlaceOrderHandler.cs:line 27",
            ],
        )
        return self._failure("Sales.Messages.Commands.PlaceOrder", _CLIENT, _SALES, body, exception)

    def sales_deadlock(self) -> _Exception:
        sql_message = (
            f"Transaction (Process ID {self._rng.randrange(50, 400)}) was deadlocked on lock "
            "resources with another process and has been chosen as the deadlock victim. "
            "Rerun the transaction."
        )
        return _dotnet_exception(
            "System.Data.DataException",
            "Saving order failed.",
            "Sales",
            [
                "Sales.Data.OrderRepository.SaveAsync(Order order, CancellationToken token) in "
                "/src/Sales/Data/OrderRepository.cs:line 74",
                "Sales.PlaceOrderHandler.Handle(PlaceOrder message, IMessageHandlerContext "
                "context) in /src/Sales/PlaceOrderHandler.cs:line 33",
            ],
            inner=(
                "Microsoft.Data.SqlClient.SqlException",
                sql_message,
                [
                    "Microsoft.Data.SqlClient.SqlConnection.OnError(SqlException exception, "
                    "Boolean breakConnection, Action`1 wrapCloseInAction)",
                    "Microsoft.Data.SqlClient.TdsParser.TryRun(RunBehavior runBehavior, "
                    "SqlCommand cmdHandler, SqlDataReader dataStream, BulkCopySimpleResultSet "
                    "bulkCopyHandler, TdsParserStateObject stateObj, Boolean& dataReady)",
                    "Microsoft.Data.SqlClient.SqlCommand.EndExecuteNonQueryAsync(IAsyncResult "
                    "asyncResult)",
                ],
            ),
        )

    def price_list_import(self) -> _Failure:
        """A price list over ``BIG_BODY_MIN_BYTES``, with multi-byte characters throughout,
        so its searchable prefix must be cut on a UTF-8 boundary."""
        entries = []
        size = 0
        while size <= BIG_BODY_MIN_BYTES:
            sku, name = self._rng.choice(_PRODUCTS)
            entry = {"Sku": sku, "Name": name, "Price": self._amount(), "Currency": "EUR"}
            entries.append(entry)
            size += len(_json(entry)) + 1
        body = _json({"PriceListId": self._guid(), "ValidFrom": "2026-02-01", "Entries": entries})
        exception = _dotnet_exception(
            "System.ArgumentOutOfRangeException",
            f"Price list has {len(entries)} entries; at most 1000 are accepted per message. "
            "(Parameter 'Entries')",
            "Sales",
            [
                "Sales.Pricing.PriceListValidator.Validate(ImportPriceList message) in "
                "/src/Sales/Pricing/PriceListValidator.cs:line 19",
                "Sales.Pricing.ImportPriceListHandler.Handle(ImportPriceList message, "
                "IMessageHandlerContext context) in /src/Sales/Pricing/ImportPriceListHandler.cs"
                ":line 22",
            ],
        )
        return self._failure(
            "Sales.Messages.Commands.ImportPriceList", _CLIENT, _SALES, body, exception
        )

    def order_placed_in_two_subscribers(self) -> list[_Failure]:
        """One ``OrderPlaced`` event that fails in both Billing and Shipping."""
        order_id = self._order_id()
        body = _json({"OrderId": order_id, "Total": self._amount(), "Currency": "EUR"})
        billing = _dotnet_exception(
            "System.Collections.Generic.KeyNotFoundException",
            "The given key 'EUR-DE-REDUCED' was not present in the dictionary.",
            "Billing",
            [
                "System.Collections.Generic.Dictionary`2.get_Item(TKey key)",
                "Billing.Tax.VatTable.RateFor(String code) in /src/Billing/Tax/VatTable.cs:line 31",
                "Billing.OrderPlacedHandler.Handle(OrderPlaced message, IMessageHandlerContext "
                "context) in /src/Billing/OrderPlacedHandler.cs:line 24",
            ],
        )
        shipping = _dotnet_exception(
            "System.Text.Json.JsonException",
            "The JSON value could not be converted to Shipping.Address. Path: $.ShippingAddress "
            "| LineNumber: 0 | BytePositionInLine: 97.",
            "System.Text.Json",
            [
                "System.Text.Json.ThrowHelper.ThrowJsonException(String message)",
                "Shipping.AddressBook.Resolve(OrderPlaced message) in "
                "/src/Shipping/AddressBook.cs:line 44",
                "Shipping.OrderPlacedHandler.Handle(OrderPlaced message, IMessageHandlerContext "
                "context) in /src/Shipping/OrderPlacedHandler.cs:line 19",
            ],
        )
        in_billing = self._failure(
            "Sales.Messages.Events.OrderPlaced",
            _SALES,
            _BILLING,
            body,
            billing,
            intent="Publish",
        )
        in_shipping = replace(
            in_billing,
            receiver=_SHIPPING,
            receiver_host=self._rng.choice(_SHIPPING.hosts),
            exception=shipping,
            time_of_failure=self._later(in_billing.time_of_failure, 0.01, 2),
        )
        return [in_billing, in_shipping]

    # --- Billing --------------------------------------------------------------------------
    def charge_credit_card(self) -> _Failure:
        body = _xml(
            "ChargeCreditCard",
            "Billing.Messages.Commands",
            {
                "OrderId": self._order_id(),
                "Amount": self._amount(),
                "Currency": "EUR",
                "CardToken": f"tok_{self._rng.getrandbits(64):016x}",
            },
        )
        exception = _dotnet_exception(
            "System.Net.Http.HttpRequestException",
            "Response status code does not indicate success: 503 (Service Unavailable).",
            "System.Net.Http",
            [
                "System.Net.Http.HttpResponseMessage.EnsureSuccessStatusCode()",
                "Billing.Payments.PaymentGatewayClient.ChargeAsync(ChargeRequest request, "
                "CancellationToken cancellationToken) in /src/Billing/Payments/"
                "PaymentGatewayClient.cs:line 88",
                "Billing.ChargeCreditCardHandler.Handle(ChargeCreditCard message, "
                "IMessageHandlerContext context) in /src/Billing/ChargeCreditCardHandler.cs"
                ":line 36",
            ],
        )
        return self._failure(
            "Billing.Messages.Commands.ChargeCreditCard",
            _SALES,
            _BILLING,
            body,
            exception,
            content_type="text/xml",
            delayed_retries=self._rng.randrange(0, 3),
        )

    def invoice_pdf(self) -> _Failure:
        """A binary body: a PDF-like blob with NUL bytes, not valid UTF-8."""
        body = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nstream\n" + self._rng.randbytes(4096)
        exception = _dotnet_exception(
            "System.IO.IOException",
            "The process cannot access the file '\\\\fileserver\\invoices\\archive.lock' "
            "because it is being used by another process.",
            "System.Private.CoreLib",
            [
                "System.IO.FileStream.ValidateFileHandle(SafeFileHandle fileHandle)",
                "Billing.Invoices.InvoiceArchive.Store(Byte[] pdf, String orderId) in "
                "/src/Billing/Invoices/InvoiceArchive.cs:line 52",
                "Billing.ArchiveInvoiceHandler.Handle(ArchiveInvoice message, "
                "IMessageHandlerContext context) in /src/Billing/ArchiveInvoiceHandler.cs:line 18",
            ],
        )
        return self._failure(
            "Billing.Messages.Commands.ArchiveInvoice",
            _BILLING,
            _BILLING,
            body,
            exception,
            content_type="application/octet-stream",
        )

    # --- Shipping -------------------------------------------------------------------------
    def ship_order(self) -> _Failure:
        body = _json({"OrderId": self._order_id(), "Carrier": self._rng.choice(("DHL", "UPS"))})
        exception = _dotnet_exception(
            "System.NullReferenceException",
            "Object reference not set to an instance of an object.",
            "Shipping",
            [
                "Shipping.Carriers.CarrierSelector.Select(Address destination, Parcel parcel) in "
                "/src/Shipping/Carriers/CarrierSelector.cs:line 63",
                "Shipping.ShipOrderHandler.Handle(ShipOrder message, IMessageHandlerContext "
                "context) in /src/Shipping/ShipOrderHandler.cs:line 29",
            ],
        )
        return self._failure(
            "Shipping.Messages.Commands.ShipOrder", _SHIPPING, _SHIPPING, body, exception
        )

    def broken_ship_order(self) -> _Failure:
        """The one message without ``NServiceBus.FailedQ``: a failed import by design."""
        return replace(self.ship_order(), broken=True)

    def legacy_shipment(self) -> _Failure:
        """NServiceBus v5 on MSMQ: XML body, ``queue@MACHINE``, no ProcessingEndpoint."""
        body = _xml(
            "ProcessShipment",
            "Legacy.Fulfillment.Messages",
            {"OrderId": self._order_id(), "Warehouse": "DC-NORTH"},
        )
        exception = _dotnet_exception(
            "System.Data.SqlClient.SqlException",
            "Timeout expired.  The timeout period elapsed prior to completion of the operation "
            "or the server is not responding.",
            ".Net SqlClient Data Provider",
            [
                "System.Data.SqlClient.SqlConnection.OnError(SqlException exception, Boolean "
                "breakConnection, Action`1 wrapCloseInAction)",
                "Legacy.Fulfillment.ShipmentStore.Insert(Shipment shipment)",
                "Legacy.Fulfillment.ProcessShipmentHandler.Handle(ProcessShipment message)",
            ],
            v5=True,
        )
        return self._failure(
            "Legacy.Fulfillment.Messages.ProcessShipment",
            _LEGACY,
            _LEGACY,
            body,
            exception,
            content_type="text/xml",
        )

    # --- Warehouse (a Python service) -----------------------------------------------------
    def reserve_stock(self) -> _Failure:
        sku, _ = self._rng.choice(_PRODUCTS)
        requested = self._rng.randrange(3, 20)
        available = self._rng.randrange(0, requested)
        body = _json({"OrderId": self._order_id(), "Sku": sku, "Quantity": requested})
        exception = _python_exception(
            "warehouse.stock.OutOfStockError",
            f"SKU {sku!r} has {available} left, {requested} requested",
            [
                (
                    "/srv/warehouse/warehouse/handlers.py",
                    57,
                    "handle_reserve_stock",
                    'reservation = stock.reserve(message["Sku"], message["Quantity"])',
                ),
                (
                    "/srv/warehouse/warehouse/stock.py",
                    112,
                    "reserve",
                    "raise OutOfStockError(sku, requested=quantity, available=level.available)",
                ),
            ],
        )
        return self._failure("Warehouse.Messages.ReserveStock", _SALES, _WAREHOUSE, body, exception)

    def catalog_sync_gzip(self) -> _Failure:
        """A gzip'd JSON body (``Content-Encoding: gzip``) failing with a chained Python
        traceback."""
        items = [{"Sku": sku, "Name": name} for sku, name in _PRODUCTS]
        # mtime=0: the gzip header carries no time, so the bytes depend on the seed only.
        body = gzip.compress(_json({"CatalogVersion": 42, "Items": items}), mtime=0)
        cause = _python_exception(
            "psycopg.errors.SerializationFailure",
            "could not serialize access due to concurrent update",
            [
                (
                    "/srv/warehouse/warehouse/catalog.py",
                    88,
                    "upsert_items",
                    "cur.executemany(SQL, rows)",
                ),
            ],
        ).stack_trace
        exception = _python_exception(
            "warehouse.db.StoreUnavailableError",
            "catalog sync gave up after 3 attempts",
            [
                (
                    "/srv/warehouse/warehouse/handlers.py",
                    91,
                    "handle_sync_catalog",
                    "catalog.sync(decode_items(body))",
                ),
                (
                    "/srv/warehouse/warehouse/catalog.py",
                    95,
                    "sync",
                    'raise StoreUnavailableError("catalog sync gave up after 3 attempts")',
                ),
            ],
            cause=cause,
        )
        return self._failure(
            "Warehouse.Messages.SyncCatalog",
            _SALES,
            _WAREHOUSE,
            body,
            exception,
            content_encoding="gzip",
        )


# --- failing again: what the demo's endpoints add to a retried message --------------------
def demo_endpoint_queues() -> tuple[str, ...]:
    """The input queues of the demo's endpoints that fail messages: where Controlroom sends
    their retries (``NServiceBus.FailedQ`` before the ``@``)."""
    return tuple(endpoint.name for endpoint in _RECEIVERS)


def failed_again_headers(
    queue: str, received: Mapping[str, str | None], *, now: datetime
) -> dict[str, str | None]:
    """The headers with which the demo endpoint of ``queue`` moves a message it received
    (``received``: its headers, a retry's) to the error queue when it fails again at ``now``.

    The received headers plus what NServiceBus's recoverability adds when it moves a
    message to the error queue: ``NServiceBus.FailedQ`` (the endpoint's address),
    ``NServiceBus.TimeOfFailure`` (``now``, a new attempt), the exception headers (the
    endpoint's "still failing" exception), and the processing endpoint, machine and host
    (none of the first two from the v5 endpoint, as v5 wrote them). The retry headers
    (``ServiceControl.Retry.UniqueMessageId``) stay, so ingestion folds the new attempt
    into the same failed message. Raises ``ValueError`` for a queue that is not a demo
    endpoint's (``demo_endpoint_queues``) or a naive ``now``.
    """
    endpoint = next((e for e in _RECEIVERS if e.name == queue), None)
    if endpoint is None:
        raise ValueError(f"queue {queue!r} is not the input queue of a demo endpoint")
    # The host that processed the message before, when it is one of the endpoint's.
    previous = received.get(h.HOST_DISPLAY_NAME)
    host = previous if previous in endpoint.hosts else endpoint.hosts[0]
    exc = _STILL_FAILING[endpoint.name]
    headers = dict(received)
    headers.update(
        {
            h.FAILED_Q: endpoint.address(host),
            h.TIME_OF_FAILURE: format_nsb_time(now),
            h.EXCEPTION_TYPE: exc.type,
            h.EXCEPTION_MESSAGE: exc.message,
            h.EXCEPTION_SOURCE: exc.source,
            h.EXCEPTION_STACK_TRACE: exc.stack_trace,
            h.HOST_DISPLAY_NAME: host,
            h.HOST_ID: host_id(host),
        }
    )
    if not endpoint.v5:
        headers[h.PROCESSING_ENDPOINT] = endpoint.name
        headers[h.PROCESSING_MACHINE] = host
    return dict(sorted(headers.items()))


# What each endpoint's handlers keep failing with when an operator retries too early: the
# database, a payment ledger or a carrier API is still not answering.
_STILL_FAILING: dict[str, _Exception] = {
    _SALES.name: _dotnet_exception(
        "System.TimeoutException",
        "The sales database did not answer within 30 seconds.",
        "Sales",
        [
            "Sales.Data.SalesDbContext.SaveChangesAsync(CancellationToken cancellationToken) in "
            "/src/Sales/Data/SalesDbContext.cs:line 41",
        ],
    ),
    _BILLING.name: _dotnet_exception(
        "System.Net.Http.HttpRequestException",
        "Response status code does not indicate success: 503 (Service Unavailable).",
        "System.Net.Http",
        [
            "System.Net.Http.HttpResponseMessage.EnsureSuccessStatusCode()",
            "Billing.Infrastructure.LedgerClient.PostAsync(LedgerEntry entry, "
            "CancellationToken cancellationToken) in /src/Billing/Infrastructure/"
            "LedgerClient.cs:line 57",
        ],
    ),
    _SHIPPING.name: _dotnet_exception(
        "System.TimeoutException",
        "The carrier API did not answer within 30 seconds.",
        "Shipping",
        [
            "Shipping.Carriers.CarrierApi.BookAsync(Shipment shipment, CancellationToken "
            "cancellationToken) in /src/Shipping/Carriers/CarrierApi.cs:line 88",
        ],
    ),
    _WAREHOUSE.name: _python_exception(
        "warehouse.db.StoreUnavailableError",
        "the stock store refused the connection",
        [
            (
                "/srv/warehouse/warehouse/db.py",
                44,
                "connect",
                'raise StoreUnavailableError("the stock store refused the connection")',
            ),
        ],
    ),
    _LEGACY.name: _dotnet_exception(
        "System.Data.SqlClient.SqlException",
        "Timeout expired.  The timeout period elapsed prior to completion of the operation "
        "or the server is not responding.",
        ".Net SqlClient Data Provider",
        [
            "System.Data.SqlClient.SqlConnection.OnError(SqlException exception, Boolean "
            "breakConnection, Action`1 wrapCloseInAction)",
            "Legacy.Fulfillment.ShipmentStore.Insert(Shipment shipment)",
        ],
        v5=True,
    ),
}
