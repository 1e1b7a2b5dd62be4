"""The A/B router's config parameters, parsed once into a validated `RouterConfig` (docs/AB_LIVE.md).

The router itself is a C++ backend (backend/ab_router/ab_router_backend/ab_router.cc): it checks its parameters at
load by the same rules, and takes the parameters' names and defaults, and STICKY_BUCKETS, from here (through the
header backend/ab_router/build.py writes). `client.ab_mode` checks a change with `parse_router_config` before it
sends it (a configuration refused at load has crashed Triton 2.51, docs/AB_LIVE.md); tests/test_ab_router.py holds
both checks to the same bad parameters, and `sticky_share` to the router's split."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, fields

from ..spec import AB_MODES, MODEL_CUDNN, MODEL_CUSTOM

STICKY_BUCKETS = 10_000     # candidate_percent resolves to 0.01 %
# The texts a number parameter may be (the C++ router matches the same patterns, through its generated header):
# ASCII digits, no underscores, no hexadecimal, no inf or nan; what is around them, ASCII white space, is ignored.
ASCII_SPACE = " \t\n\r\f\v"
INTEGER = r"[+-]?[0-9]+"
NUMBER = r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?"
# Ranges (inclusive) and how a refusal says them
SHADOW_TIMEOUT_MS_RANGE = (0.001, 3_600_000.0)
SHADOW_TIMEOUT_ALLOWED = "milliseconds, 0.001 to 3600000 (an hour)"
SHADOW_MAX_IN_FLIGHT_MAX = 1024
SHADOW_MAX_IN_FLIGHT_ALLOWED = f"an integer, 1 to {SHADOW_MAX_IN_FLIGHT_MAX}"
DISAGREEMENT_RECORDS_MAX = 100_000
DISAGREEMENT_RECORDS_ALLOWED = f"an integer, 0 to {DISAGREEMENT_RECORDS_MAX}"


def sticky_share(key: str) -> float:
    """Where `key` falls in 0..100 (percent), the same in every process: the arm of a sticky split (a key below
    candidate_percent goes to the candidate)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % STICKY_BUCKETS * 100.0 / STICKY_BUCKETS


class ConfigError(ValueError):
    """A router parameter that cannot be served; the message names it and what is allowed."""


@dataclass(frozen=True)
class RouterConfig:
    mode: str = "shadow"
    primary: str = MODEL_CUDNN
    candidate: str = MODEL_CUSTOM
    candidate_percent: float = 10.0
    shadow_timeout_ms: float = 1000.0
    shadow_max_in_flight: int = 16
    disagreement_records: int = 100


def parse_router_config(model_config: dict) -> RouterConfig:
    """The router's parameters from its config (Triton's JSON form), validated; ConfigError names a bad one."""
    raw = {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}
    known = {f.name: f for f in fields(RouterConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown}; the router takes {sorted(known)}")
    values = {}
    for key, text in sorted(raw.items()):
        kind = known[key].type
        stripped = text.strip(ASCII_SPACE)
        if kind in ("int", "float") and not re.fullmatch(INTEGER if kind == "int" else NUMBER, stripped):
            raise ConfigError(f"parameter {key}: {text!r} is not a{'n integer' if kind == 'int' else ' number'}")
        value = int(stripped) if kind == "int" else float(stripped) if kind == "float" else stripped
        if kind == "float" and not math.isfinite(value):
            raise ConfigError(f"parameter {key}: {text!r} is not a finite number")
        values[key] = value
    config = RouterConfig(**values)
    checks = (("mode", config.mode in AB_MODES, f"one of {list(AB_MODES)}"),
              ("primary", bool(config.primary), "a model entry's name"),
              ("candidate", bool(config.candidate) and config.candidate != config.primary,
               "a model entry's name other than primary's"),
              ("candidate_percent", 0 <= config.candidate_percent <= 100, "a percentage, 0 to 100"),
              ("shadow_timeout_ms",
               SHADOW_TIMEOUT_MS_RANGE[0] <= config.shadow_timeout_ms <= SHADOW_TIMEOUT_MS_RANGE[1],
               SHADOW_TIMEOUT_ALLOWED),
              ("shadow_max_in_flight", 1 <= config.shadow_max_in_flight <= SHADOW_MAX_IN_FLIGHT_MAX,
               SHADOW_MAX_IN_FLIGHT_ALLOWED),
              ("disagreement_records", 0 <= config.disagreement_records <= DISAGREEMENT_RECORDS_MAX,
               DISAGREEMENT_RECORDS_ALLOWED))
    for key, ok, allowed in checks:
        if not ok:
            raise ConfigError(f"parameter {key}: {getattr(config, key)!r} is not allowed; expected {allowed}")
    return config
