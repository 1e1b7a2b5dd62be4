"""`prepare --weights torchvision`: the checkpoint comes over real HTTP (a local http.server standing in
for download.pytorch.org), is checked against its pinned SHA-256 and cached; a truncated, cut-off or
altered download is refused and nothing is written, and offline the error says how to bring it by hand."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
from pathlib import Path

import pytest
import torch

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.repository.prepare import main as prepare_main
from fusedresnet.backend.repository.prepare import prepare
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE, read_weights_source
from fusedresnet.backend.resnet import pretrained
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.backend.spec import MODEL_REPOSITORY

CHECKPOINT_NAME = "resnet18-0123abcd.pth"
GENERATED = ("*.pt", "labels.txt", STAMP_FILE, "__pycache__", ".*.tmp")


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory) -> bytes:
    """A real torchvision-format ResNet-18 checkpoint (seeded weights, not the seed prepare uses by default)."""
    path = tmp_path_factory.mktemp("checkpoint") / CHECKPOINT_NAME
    torch.save(build_resnet18(None, 4242).state_dict(), path)
    return path.read_bytes()


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves `body` at any path; with `cut_off`, promises the whole length and closes after half."""
    body = b""
    cut_off = False

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body[:len(self.body) // 2] if self.cut_off else self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def checkpoint_server(monkeypatch, tmp_path):
    """fn(body, sha256, cut_off=False): serve `body` over HTTP on 127.0.0.1 and point the download at it."""
    servers = []

    def serve(body: bytes, sha256: str, cut_off: bool = False):
        handler = type("CheckpointHandler", (Handler,), {"body": body, "cut_off": cut_off})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        monkeypatch.setenv(pretrained.URL_ENV, f"http://127.0.0.1:{server.server_port}/models/{CHECKPOINT_NAME}")
        monkeypatch.setenv(pretrained.SHA256_ENV, sha256)
        return server

    monkeypatch.setenv(pretrained.CACHE_DIR_ENV, str(tmp_path / "cache"))
    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def repository(tmp_path):
    target = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, target, ignore=shutil.ignore_patterns(*GENERATED))
    return target


def files_under(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} \
        if folder.exists() else {}


def test_pinned_checkpoint_is_torchvisions_file_and_its_name_carries_its_digest_prefix():
    checkpoint = pretrained.TORCHVISION_RESNET18
    assert checkpoint.url == "https://download.pytorch.org/models/resnet18-f37072fd.pth"   # the URL
    assert len(checkpoint.sha256) == 64 and checkpoint.sha256.startswith("f37072fd")


def test_downloaded_checkpoint_is_checked_cached_and_prepared(checkpoint_server, checkpoint_bytes, repository,
                                                             tmp_path):
    server = checkpoint_server(checkpoint_bytes, hashlib.sha256(checkpoint_bytes).hexdigest())
    stamp = prepare(repository, pretrained.WEIGHTS_TORCHVISION)
    cached = tmp_path / "cache" / CHECKPOINT_NAME
    assert cached.read_bytes() == checkpoint_bytes
    assert stamp["weights"] == str(cached) == read_weights_source(repository)
    assert sorted(p.name for p in cached.parent.iterdir()) == [CHECKPOINT_NAME]   # no partial file left
    # The cache serves the next request without the network.
    server.shutdown()
    server.server_close()
    assert pretrained.fetch() == cached


@pytest.mark.parametrize("damage", ["truncated", "altered", "cut_off"])
def test_damaged_download_is_refused_and_nothing_is_written(checkpoint_server, checkpoint_bytes, repository,
                                                           tmp_path, damage):
    body = checkpoint_bytes
    if damage == "truncated":
        body = body[:len(body) // 3]
    elif damage == "altered":
        middle = len(body) // 2
        body = body[:middle] + bytes([body[middle] ^ 0x01]) + body[middle + 1:]
    checkpoint_server(body, hashlib.sha256(checkpoint_bytes).hexdigest(), cut_off=damage == "cut_off")
    before = files_under(repository)
    with pytest.raises(pretrained.CheckpointError) as refused:
        prepare(repository, pretrained.WEIGHTS_TORCHVISION)
    expected = "refused" if damage != "cut_off" else "cannot download"
    assert expected in str(refused.value)
    assert files_under(repository) == before
    assert files_under(tmp_path / "cache") == {}


def test_offline_download_names_the_url_and_the_manual_alternative(monkeypatch, repository, tmp_path, capsys):
    (closed_port,) = free_ports(1)
    url = f"http://127.0.0.1:{closed_port}/models/{CHECKPOINT_NAME}"
    monkeypatch.setenv(pretrained.URL_ENV, url)
    monkeypatch.setenv(pretrained.CACHE_DIR_ENV, str(tmp_path / "cache"))
    before = files_under(repository)
    with pytest.raises(SystemExit) as failed:
        prepare_main(["--weights", "torchvision", "--repository", str(repository)])
    message = str(failed.value.code)
    assert message.startswith("prepare: cannot download " + url)
    assert f"make prepare WEIGHTS=path/to/{CHECKPOINT_NAME}" in message and f"curl -LO {url}" in message
    assert files_under(repository) == before and files_under(tmp_path / "cache") == {}
