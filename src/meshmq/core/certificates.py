"""Certificate subjects as Java prints them.

ActiveMQ's certificate login modules look the peer up by
``X509Certificate.getSubjectDN().getName()``: the legacy X.500 form, most specific
RDN first, ``", "`` between RDNs, `` + `` inside a multi-valued one, keywords as
Java's ``AVAKeyword`` table names them (``ST``, ``EMAILADDRESS``), a value quoted
when it holds a special character. ``subject_dn`` builds that string from the dict
``ssl.SSLSocket.getpeercert()`` returns, so users files written for ActiveMQ match.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_KEYWORDS = {
    "commonName": "CN", "countryName": "C", "localityName": "L",
    "stateOrProvinceName": "ST", "organizationName": "O", "organizationalUnitName": "OU",
    "title": "T", "streetAddress": "STREET", "domainComponent": "DC",
    "dnQualifier": "DNQ", "surname": "SURNAME", "givenName": "GIVENNAME",
    "initials": "INITIALS", "generationQualifier": "GENERATION",
    "emailAddress": "EMAILADDRESS", "userId": "UID", "serialNumber": "SERIALNUMBER",
}
_SPECIAL = frozenset(',+=\n<>#;"\\')


def _value(value: str) -> str:
    if value and (any(c in _SPECIAL for c in value) or value[0] == " " or value[-1] == " "):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def subject_dn(cert: Mapping[str, Any]) -> str:
    """``CN=bob, OU=clients, O=meshmq`` for a certificate issued to that subject."""
    rdns = cert.get("subject") or ()
    parts = []
    for rdn in reversed(rdns):
        parts.append(" + ".join(f"{_KEYWORDS.get(name, name)}={_value(str(value))}"
                                for name, value in rdn))
    return ", ".join(parts)
