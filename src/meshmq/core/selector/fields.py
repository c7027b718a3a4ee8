"""Property lookup for selectors: JMS header fields plus message properties."""

from __future__ import annotations

from collections.abc import Callable

from meshmq.core.message import Message, PropertyValue

# Each getter takes (message, delivery_count, redelivered): the last two are
# delivery state, which lives in the queue entry rather than the shared Message.
_Getter = Callable[[Message, int, bool], PropertyValue]


def _destination(msg: Message, _count: int, _redelivered: bool) -> PropertyValue:
    # ActiveMQ reports the original destination (so a DLQ'd or composite-routed
    # message still matches selectors written for where it was sent).
    dest = msg.original_destination or msg.destination
    return str(dest)


def _reply_to(msg: Message, _count: int, _redelivered: bool) -> PropertyValue:
    return None if msg.reply_to is None else str(msg.reply_to)


HEADER_FIELDS: dict[str, _Getter] = {
    "JMSMessageID": lambda m, c, r: m.message_id,
    "JMSPriority": lambda m, c, r: m.priority,
    "JMSTimestamp": lambda m, c, r: m.timestamp,
    "JMSCorrelationID": lambda m, c, r: m.correlation_id,
    "JMSType": lambda m, c, r: m.type,
    "JMSDeliveryMode": lambda m, c, r: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSExpiration": lambda m, c, r: m.expiration,
    "JMSDestination": _destination,
    "JMSReplyTo": _reply_to,
    "JMSRedelivered": lambda m, c, r: r,
    "JMSXGroupID": lambda m, c, r: m.group_id,
    "JMSXGroupSeq": lambda m, c, r: m.group_seq,
    "JMSXDeliveryCount": lambda m, c, r: c,
    "JMSXUserID": lambda m, c, r: m.user_id,
}


def message_lookup(msg: Message, *, delivery_count: int = 1,
                   redelivered: bool = False) -> Callable[[str], PropertyValue]:
    """The lookup a Selector evaluates ``msg`` with.

    Header field names win over same-named properties (JMS reserves the JMS
    prefix); every other name is a property, None (NULL) when absent.
    """
    props = msg.properties
    fields = HEADER_FIELDS

    def lookup(name: str) -> PropertyValue:
        getter = fields.get(name)
        if getter is None:
            return props.get(name)
        return getter(msg, delivery_count, redelivered)

    return lookup
