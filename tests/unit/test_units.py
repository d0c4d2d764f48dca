import pytest

from relay.core.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1ms", 0.001),
        ("2s", 2),
        ("5m", 300),
        ("1h", 3600),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1.5s", 1.5),
        (" 10s ", 10),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "1x", "1s2", "-1s", "1 day"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("512", 512), ("64KiB", 65536), ("1MiB", 1048576), ("10MB", 10_000_000), ("2gib", 2 << 30)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5MiB", "lots", "1 TiB"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.001, "1ms"),
        (2, "2s"),
        (64, "1m04s"),
        (32768, "9h06m"),
        (65534, "18h12m"),
        (86400 + 3 * 3600, "1d03h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_size() -> None:
    assert format_size(1048576) == "1MiB"
    assert format_size(1000) == "1000B"
