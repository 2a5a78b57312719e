"""NServiceBus-format failed messages for tests, shaped like the samples in tests/data."""

from __future__ import annotations

from datetime import datetime

from tests.factories import at

HOST_ID = "daaf5ebc8d6a51b7b0dccdd8b15c3626"


def nsb_time(when: datetime) -> str:
    """``yyyy-MM-dd HH:mm:ss:ffffff Z`` (the wire format of NServiceBus times)."""
    return when.strftime("%Y-%m-%d %H:%M:%S:%f Z")


def failed_headers(
    message_id: str,
    *,
    endpoint: str = "Sales",
    failed_at: datetime | None = None,
    exception_type: str = "System.InvalidOperationException",
    exception_message: str = "The order could not be placed.",
    stack_trace: str | None = None,
    content_type: str = "application/json",
) -> dict[str, str | None]:
    failed_at = failed_at or at(0)
    return {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.FailedQ": endpoint,
        "NServiceBus.ProcessingEndpoint": endpoint,
        "NServiceBus.ProcessingMachine": "MACHINENAME",
        "NServiceBus.OriginatingEndpoint": "WebShop",
        "NServiceBus.OriginatingMachine": "WEBHOST",
        "NServiceBus.TimeOfFailure": nsb_time(failed_at),
        "NServiceBus.TimeSent": nsb_time(at(-1)),
        "NServiceBus.ContentType": content_type,
        "NServiceBus.ConversationId": "be6afcc4-3295-4b6c-8d2f-b43b016c458b",
        "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages, "
        "Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
        "NServiceBus.ExceptionInfo.ExceptionType": exception_type,
        "NServiceBus.ExceptionInfo.Message": exception_message,
        "NServiceBus.ExceptionInfo.Source": "Shop.Sales",
        "NServiceBus.ExceptionInfo.StackTrace": stack_trace
        or f"{exception_type}: {exception_message}\n"
        "   at Shop.Sales.PlaceOrderHandler.Handle(PlaceOrder message, IMessageHandlerContext "
        "context)\n   at NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext "
        "context)",
        "NServiceBus.ExceptionInfo.HelpLink": None,
        "$.diagnostics.hostid": HOST_ID,
        "$.diagnostics.hostdisplayname": "MACHINENAME",
        "$.diagnostics.originating.hostid": "7f787fc8e0611a3fab8a93c8767f6639",
    }
