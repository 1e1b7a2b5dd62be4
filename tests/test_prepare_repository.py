"""`prepare --repository DIR` on a folder that is not a model repository: refused before anything is built,
with a message naming each missing entry; a copy of the real entries prepares."""

from __future__ import annotations

import shutil

import pytest

from fusedresnet.backend.repository.prepare import main as prepare_main
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE
from fusedresnet.backend.spec import (
    FOLDED_PARAMS_FILE,
    MODEL_CUDNN,
    MODEL_CUSTOM,
    MODEL_ENTRIES,
    MODEL_REPOSITORY,
    TORCHSCRIPT_FILE,
)


def copy_entries(target, entries=MODEL_ENTRIES):
    """The model entries' own files (config.pbtxt, 1/model.py), not what prepare generates."""
    for name in entries:
        shutil.copytree(MODEL_REPOSITORY / name, target / name,
                        ignore=shutil.ignore_patterns("*.pt", "labels.txt", ".*.tmp", "__pycache__"))


@pytest.mark.parametrize("exists", [True, False], ids=["empty folder", "no folder"])
def test_prepare_into_a_folder_without_the_model_entries_names_them_and_writes_nothing(tmp_path, exists):
    repository = tmp_path / "repository"
    if exists:
        repository.mkdir()
    with pytest.raises(SystemExit) as stopped:
        prepare_main(["--repository", str(repository)])
    message = str(stopped.value.code)
    assert message.startswith(f"prepare: {repository} is not a model repository")
    for name in MODEL_ENTRIES:
        assert f"{name}/config.pbtxt" in message
    assert f"{MODEL_CUDNN}/1/" in message and f"{MODEL_CUSTOM}/1/" in message
    assert "Traceback" not in message and ".tmp" not in message
    assert (list(repository.iterdir()) == []) if exists else not repository.exists()


def test_prepare_names_only_what_is_missing_and_prepares_a_copy_of_the_entries(tmp_path, capsys):
    repository = tmp_path / "repository"
    copy_entries(repository)
    shutil.rmtree(repository / MODEL_CUSTOM / "1")
    with pytest.raises(SystemExit) as stopped:
        prepare_main(["--repository", str(repository)])
    assert str(stopped.value.code).endswith(f"it has no {MODEL_CUSTOM}/1/ (copy the model entries of "
                                            f"{MODEL_REPOSITORY} there first)")
    assert not (repository / STAMP_FILE).exists()
    shutil.copytree(MODEL_REPOSITORY / MODEL_CUSTOM / "1", repository / MODEL_CUSTOM / "1",
                    ignore=shutil.ignore_patterns("*.pt", "__pycache__"))
    prepare_main(["--repository", str(repository)])
    assert f"prepared {repository}" in capsys.readouterr().out
    assert (repository / STAMP_FILE).is_file()
    assert (repository / MODEL_CUDNN / "1" / TORCHSCRIPT_FILE).is_file()
    assert (repository / MODEL_CUSTOM / "1" / FOLDED_PARAMS_FILE).is_file()
