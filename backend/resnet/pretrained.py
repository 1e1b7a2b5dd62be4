"""torchvision's ImageNet-trained ResNet-18 checkpoint: downloaded once, checked, cached.

    python -m fusedresnet.backend.repository.prepare --weights torchvision     (make prepare WEIGHTS=torchvision)

The file is torchvision's `ResNet18_Weights.IMAGENET1K_V1` (69.758% top-1 on ImageNet). Its
SHA-256 is pinned here: a download whose digest differs (truncated, tampered, another file)
is refused and nothing is kept. The cache is `$FUSEDRESNET_CACHE_DIR`, else
`$XDG_CACHE_HOME/fusedresnet`, else `~/.cache/fusedresnet`; a cached file is checked again
before each use. Offline, the error names the URL and how to bring the file by hand.

`$FUSEDRESNET_TORCHVISION_URL` and `$FUSEDRESNET_TORCHVISION_SHA256` replace the URL and the
digest (a mirror, or the tests' local HTTP server).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

WEIGHTS_TORCHVISION = "torchvision"   # the --weights value that asks for this checkpoint
URL_ENV = "FUSEDRESNET_TORCHVISION_URL"
SHA256_ENV = "FUSEDRESNET_TORCHVISION_SHA256"
CACHE_DIR_ENV = "FUSEDRESNET_CACHE_DIR"
DOWNLOAD_TIMEOUT_S = 60
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Checkpoint:
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


# torchvision's file name carries the first 8 hex digits of its SHA-256; the whole digest (46,830,571
# bytes) as published with that file and recorded alike by independent projects that pin it.
TORCHVISION_RESNET18 = Checkpoint(
    url="https://download.pytorch.org/models/resnet18-f37072fd.pth",
    sha256="f37072fd47e89c5e827621c5baffa7500819f7896bbacec160b1a16c560e07ec")


class CheckpointError(RuntimeError):
    """The checkpoint could not be downloaded or is not the pinned file; the message says what to do."""


def torchvision_checkpoint() -> Checkpoint:
    """The pinned checkpoint, or the one the environment names instead."""
    return Checkpoint(os.environ.get(URL_ENV, TORCHVISION_RESNET18.url),
                      os.environ.get(SHA256_ENV, TORCHVISION_RESNET18.sha256).lower())


def cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fusedresnet"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def manual_alternative(checkpoint: Checkpoint) -> str:
    return (f"download {checkpoint.url} on a machine that can reach it (e.g. `curl -LO {checkpoint.url}`), "
            f"check `sha256sum {checkpoint.filename}` gives {checkpoint.sha256}, copy it here and run "
            f"`make prepare WEIGHTS=path/to/{checkpoint.filename}`")


def fetch(checkpoint: Checkpoint | None = None, directory: Path | None = None) -> Path:
    """The checkpoint's path in the cache, downloaded first if it is not there (or no longer matches)."""
    checkpoint = checkpoint or torchvision_checkpoint()
    directory = Path(directory) if directory is not None else cache_dir()
    target = directory / checkpoint.filename
    if target.is_file() and sha256_of(target) == checkpoint.sha256:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{checkpoint.filename}.{os.getpid()}.part"
    digest = hashlib.sha256()
    try:
        try:
            with urllib.request.urlopen(checkpoint.url, timeout=DOWNLOAD_TIMEOUT_S) as response, \
                    open(partial, "wb") as out:
                promised = response.headers.get("Content-Length")
                received = 0
                while chunk := response.read(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
            if promised is not None and received != int(promised):
                raise OSError(f"the transfer was cut short after {received} of {promised} bytes")
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:   # offline, refused, cut short
            raise CheckpointError(f"cannot download {checkpoint.url}: {getattr(error, 'reason', error)}. "
                                  f"Instead: {manual_alternative(checkpoint)}") from error
        if digest.hexdigest() != checkpoint.sha256:
            raise CheckpointError(f"{checkpoint.url} has SHA-256 {digest.hexdigest()}, not the pinned "
                                  f"{checkpoint.sha256}: refused (a truncated or altered download). "
                                  f"Try again, or: {manual_alternative(checkpoint)}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
