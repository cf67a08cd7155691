"""``--stream-flush-ms``: the flag, its variable, and what reaches a response's log."""

from __future__ import annotations

import pytest

from trio_responses._config import Config
from trio_responses.cli import build_parser, config_from_args


def _config(argv: list[str], env: dict[str, str] | None = None) -> Config:
    return config_from_args(build_parser().parse_args(["serve", *argv]), env or {})


def test_flag_variable_and_default() -> None:
    assert _config([]).stream_flush_ms == 5.0
    assert _config(["--stream-flush-ms", "0"]).stream_flush_ms == 0.0
    env = {"TRIO_RESPONSES_STREAM_FLUSH_MS": "12.5"}
    assert _config([], env).stream_flush_ms == 12.5
    assert _config(["--stream-flush-ms", "2"], env).stream_flush_ms == 2.0


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="stream_flush_ms"):
        Config(stream_flush_ms=-1)
