import pytest

from meshmq.config.sizes import format_size, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("64 mb", 64 * 1024**2),
    ("64mb", 64 * 1024**2),
    ("1 GB", 1024**3),
    ("100 kb", 100 * 1024),
    ("512 b", 512),
    ("512", 512),
    ("1.5 gb", 3 * 1024**3 // 2),
    ("2 MiB", 2 * 1024**2),
    ("3k", 3 * 1024),
    ("1 tb", 1024**4),
    (" 7 bytes ", 7),
    (0, 0),
    (1048576, 1048576),
])
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("value", "reason"), [
    ("", "not a size"),
    ("mb", "not a size"),
    ("-1 mb", "not a size"),
    ("64 parsecs", "unknown size unit"),
    ("1,5 gb", "not a size"),
    (-1, ">= 0"),
    (True, "expected a size"),
])
def test_parse_size_rejects(value: str | int, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_size(value)


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 100 * 1024**2, 3 * 1024**3, 1536])
def test_format_round_trips(size: int) -> None:
    assert parse_size(format_size(size)) == size


def test_format_prefers_largest_exact_unit() -> None:
    assert format_size(100 * 1024**2) == "100 mb"
    assert format_size(1536) == "1536 b"
    assert format_size(2048) == "2 kb"
