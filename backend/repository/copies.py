"""A model repository made from another: some of its entries, their configs changed, everything else linked.

Every copy the project makes goes through `copy_repository`: the launcher's `--instances gpu`
(backend/launcher/cli.py), the perf_analyzer run (loadtest/perf_analyzer.py), the campaigns and the tests
(campaigns/serving_sequence.py).

    copy_repository(MODEL_REPOSITORY, folder, entries=("resnet18_custom",), edit=with_instances(8))

- an entry is a folder with a config.pbtxt; `entries` keeps those named (default: all). A `*_normalized` entry
  needs its network's entry beside it (it loads that entry's model.py and weights), so keeping one without the
  other is refused;
- each kept entry is a new folder of symbolic links to the source's files; its config.pbtxt is written anew
  (Triton's ModelConfig as text) when `edit(name, config)` is given, which changes the message in place;
- the other files at the top (the prepared stamp) are linked;
- `prepared`: a prepared repository whose prepared files (weights, labels, the stamp) are linked instead of the
  source's: the source is then another tree's model_repository, its code without its model files (the serving
  sequence's `--shipped-tree`).
"""

from __future__ import annotations

import fnmatch
import math
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from ..spec import model_config, network_of
from .prepared_stamp import STAMP_FILE

PREPARED_PATTERNS = ("*.pt", "labels.txt", STAMP_FILE)   # what `prepare` writes into a repository

ConfigEdit = Callable[[str, object], None]   # (entry name, its ModelConfig message), changed in place


def with_instances(count: int, models: Iterable[str] | None = None) -> ConfigEdit:
    """Every instance group of `models` (default: every entry) at `count` instances."""
    chosen = None if models is None else set(models)

    def edit(name, config):
        if chosen is None or name in chosen:
            for group in config.instance_group:
                group.count = count
    return edit


def with_instances_divided(processes: int) -> ConfigEdit:
    """Each instance group's count divided among `processes` (rounded up): the configured count is a GPU's."""
    def edit(_name, config):
        for group in config.instance_group:
            group.count = max(1, math.ceil(group.count / processes))
    return edit


def with_parameters(model: str, **values: str) -> ConfigEdit:
    """`model`'s config parameters (string values) set to `values`."""
    def edit(name, config):
        if name == model:
            for key, value in values.items():
                config.parameters[key].string_value = value
    return edit


def both(*edits: ConfigEdit) -> ConfigEdit:
    """The edits one after another."""
    def edit(name, config):
        for each in edits:
            each(name, config)
    return edit


def _is_prepared(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in PREPARED_PATTERNS)


def _link_tree(source: Path, target: Path, prepared: Path | None):
    """`target` made a folder of links to `source`'s files (sub-folders alike); the prepared files from
    `prepared` (the same relative place) instead, when given and there."""
    target.mkdir()
    for item in source.iterdir():
        if item.name == "__pycache__" or (prepared is not None and _is_prepared(item.name)):
            continue
        if item.is_dir() and not item.is_symlink():
            _link_tree(item, target / item.name, prepared / item.name if prepared else None)
        else:
            (target / item.name).symlink_to(item.resolve())
    if prepared is not None and prepared.is_dir():
        for item in prepared.iterdir():
            if _is_prepared(item.name) and not (target / item.name).exists():
                (target / item.name).symlink_to(item.resolve())


def copy_repository(source: Path, folder: Path, *, entries: Iterable[str] | None = None,
                    edit: ConfigEdit | None = None, prepared: Path | None = None) -> Path:
    """`source`'s entries (all, or those of `entries` it has) in `folder`, made afresh; see the module's text."""
    from google.protobuf import text_format
    source, folder = Path(source), Path(folder)
    all_entries = sorted(item.name for item in source.iterdir() if (item / "config.pbtxt").is_file())
    wanted = None if entries is None else set(entries)
    kept = [name for name in all_entries if wanted is None or name in wanted]
    for name in kept:
        network = network_of(name)
        if network != name and network not in kept:
            raise ValueError(f"{name} needs {network} in the repository: it loads that entry's model.py")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for item in source.iterdir():
        if (item / "config.pbtxt").is_file():
            continue
        if item.is_file() and not (prepared is not None and _is_prepared(item.name)):
            (folder / item.name).symlink_to(item.resolve())
    if prepared is not None and (Path(prepared) / STAMP_FILE).is_file():
        (folder / STAMP_FILE).symlink_to((Path(prepared) / STAMP_FILE).resolve())
    for name in kept:
        _link_tree(source / name, folder / name, Path(prepared) / name if prepared is not None else None)
        if edit is not None:
            config = model_config(name, source)
            edit(name, config)
            (folder / name / "config.pbtxt").unlink()
            (folder / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    return folder
