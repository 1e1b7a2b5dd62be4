"""The stamp `prepare` writes into the model repository, and how to read it (pure Python).

`prepare` writes it last, so its presence means the model files are complete (`make`,
the launcher and the tests rely on that). It records where the weights came from:
a weights file's absolute path, or "seeded:<seed>" for the default seeded weights.
The client side (the demo) reads it without torch, hence this module of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

STAMP_FILE = ".prepared.json"
SEEDED_PREFIX = "seeded:"


def seeded_source(seed: int) -> str:
    """The weights source of the default seeded weights."""
    return f"{SEEDED_PREFIX}{seed}"


def seed_of(source: str) -> int | None:
    """The seed of a "seeded:<seed>" weights source; None for a weights file."""
    if not source.startswith(SEEDED_PREFIX):
        return None
    return int(source[len(SEEDED_PREFIX):])


def make_stamp(source: str, torch_version: str) -> dict:
    return {"weights": source, "torch": torch_version}


def write_stamp(path: Path, stamp: dict) -> None:
    Path(path).write_text(json.dumps(stamp, indent=1) + "\n")


def read_weights_source(repository: Path) -> str | None:
    """The weights source the repository was prepared from; None if it is not prepared."""
    stamp = Path(repository) / STAMP_FILE
    return json.loads(stamp.read_text())["weights"] if stamp.is_file() else None
