"""backend/repository/copies.py: the one way the project copies a model repository (the launcher's --instances gpu,
the perf_analyzer run, the campaigns and tests). Checked on the prepared repository and on a copy of its code
without its model files (what the serving sequence's --shipped-tree gives): entries kept, configs changed in the
copy only, everything else linked, prepared files taken from the prepared repository."""

from __future__ import annotations

import shutil

import pytest

from fusedresnet.backend.repository.copies import (
    both,
    copy_repository,
    with_instances,
    with_instances_divided,
    with_parameters,
)
from fusedresnet.backend.repository.prepared_stamp import STAMP_FILE
from fusedresnet.backend.spec import AB_ROUTER_MODEL, MODEL_CUDNN, MODEL_CUSTOM, SERVED_ENTRIES, model_config

NORMALIZED = f"{MODEL_CUSTOM}_normalized"


def counts(repository) -> dict[str, int]:
    return {name: model_config(name, repository).instance_group[0].count for name in SERVED_ENTRIES
            if (repository / name).is_dir()}


def test_all_entries_linked_and_the_counts_divided_rounding_up(prepared_repository, tmp_path):
    shipped = counts(prepared_repository)
    copy = copy_repository(prepared_repository, tmp_path / "copy", edit=with_instances_divided(3))
    assert counts(copy) == {name: -(-count // 3) for name, count in shipped.items()}
    assert counts(prepared_repository) == shipped                 # the source is untouched
    assert (copy / STAMP_FILE).is_symlink()
    weights = sorted(p.relative_to(prepared_repository) for p in prepared_repository.glob("*/1/*.pt"))
    assert weights and all((copy / w).is_symlink() and (copy / w).resolve() == (prepared_repository / w).resolve()
                           for w in weights)
    assert (copy / MODEL_CUSTOM / "1" / "model.py").is_symlink()
    assert not (copy / MODEL_CUSTOM / "config.pbtxt").is_symlink()   # written anew
    again = copy_repository(prepared_repository, tmp_path / "copy", edit=with_instances_divided(2))   # made afresh
    assert counts(again) == {name: -(-count // 2) for name, count in shipped.items()}


def test_entries_kept_and_only_the_named_models_edited(prepared_repository, tmp_path):
    edit = both(with_instances(7, (MODEL_CUSTOM, AB_ROUTER_MODEL)),
                lambda name, config: setattr(config.dynamic_batching, "max_queue_delay_microseconds", 55))
    copy = copy_repository(prepared_repository, tmp_path / "copy", entries=(MODEL_CUSTOM, NORMALIZED, "not_there"),
                           edit=edit)
    assert sorted(p.name for p in copy.iterdir() if p.is_dir()) == [MODEL_CUSTOM, NORMALIZED]
    assert counts(copy) == {MODEL_CUSTOM: 7, NORMALIZED: counts(prepared_repository)[NORMALIZED]}
    assert model_config(NORMALIZED, copy).dynamic_batching.max_queue_delay_microseconds == 55
    unedited = copy_repository(prepared_repository, tmp_path / "plain", entries=(MODEL_CUDNN,))
    assert (unedited / MODEL_CUDNN / "config.pbtxt").is_symlink()


def test_parameters_set_on_the_named_model_only(prepared_repository, tmp_path):
    """What the ab_live campaign does: the router's mode changed (and a parameter added), the others' untouched."""
    copy = copy_repository(prepared_repository, tmp_path / "copy", entries=(AB_ROUTER_MODEL, MODEL_CUDNN),
                           edit=with_parameters(AB_ROUTER_MODEL, mode="split", extra="1"))
    parameters = {k: v.string_value for k, v in model_config(AB_ROUTER_MODEL, copy).parameters.items()}
    shipped = {k: v.string_value for k, v in model_config(AB_ROUTER_MODEL, prepared_repository).parameters.items()}
    assert shipped["mode"] == "shadow" and parameters == {**shipped, "mode": "split", "extra": "1"}
    assert model_config(MODEL_CUDNN, copy) == model_config(MODEL_CUDNN, prepared_repository)


def test_a_normalized_entry_without_its_network_is_refused(prepared_repository, tmp_path):
    with pytest.raises(ValueError, match=f"{NORMALIZED} needs {MODEL_CUSTOM}"):
        copy_repository(prepared_repository, tmp_path / "copy", entries=(NORMALIZED,))


def test_prepared_files_come_from_the_prepared_repository_for_a_tree_without_them(prepared_repository, tmp_path):
    code_only = tmp_path / "earlier_tree" / "model_repository"
    shutil.copytree(prepared_repository, code_only,
                    ignore=shutil.ignore_patterns("*.pt", "labels.txt", STAMP_FILE, "__pycache__"))
    (code_only / MODEL_CUSTOM / "1" / "model.py").write_text("# the earlier tree's model.py\n")
    copy = copy_repository(code_only, tmp_path / "copy", entries=(MODEL_CUSTOM,), prepared=prepared_repository,
                           edit=with_instances(1))
    assert (copy / MODEL_CUSTOM / "1" / "model.py").read_text() == "# the earlier tree's model.py\n"
    for relative in [p.relative_to(prepared_repository) for p in (prepared_repository / MODEL_CUSTOM).rglob("*.pt")]:
        assert (copy / relative).resolve() == (prepared_repository / relative).resolve()
    labels = MODEL_CUSTOM + "/labels.txt"
    assert (copy / labels).resolve() == (prepared_repository / labels).resolve()
    assert (copy / STAMP_FILE).resolve() == (prepared_repository / STAMP_FILE).resolve()
