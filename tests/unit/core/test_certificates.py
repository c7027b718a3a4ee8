"""Certificate subjects in Java's legacy DN form, as ActiveMQ's users files hold them."""

from __future__ import annotations

import ssl

from meshmq.core.certificates import subject_dn


def test_real_certificate_subject(pki: object) -> None:
    cert_path, _ = pki.client("bob")  # type: ignore[attr-defined]
    cert = ssl._ssl._test_decode_cert(str(cert_path))  # type: ignore[attr-defined]
    assert subject_dn(cert) == "CN=bob, OU=clients, O=meshmq"


def test_keywords_order_multi_valued_and_quoting() -> None:
    cert = {"subject": (
        (("countryName", "US"),), (("stateOrProvinceName", "CA"),),
        (("localityName", "LA"),), (("organizationName", "Acme, Inc."),),
        (("organizationalUnitName", "dev"), ("userId", "42")),
        (("commonName", " padded"),), (("emailAddress", "a@b.c"),),
        (("2.5.4.99", "x"),))}
    assert subject_dn(cert) == ('2.5.4.99=x, EMAILADDRESS=a@b.c, CN=" padded", '
                                'OU=dev + UID=42, O="Acme, Inc.", L=LA, ST=CA, C=US')
    assert subject_dn({}) == ""
