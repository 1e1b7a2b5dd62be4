"""The commit every results file records (backend/provenance.py)."""

import subprocess

import pytest

from fusedresnet.backend.provenance import git_commit


def test_the_commit_named_by_the_run_wins_over_the_copied_tree(monkeypatch, tmp_path):
    # On the GPU host the tree's .git reported the session's starting commit (2026-11-26), not the code run.
    monkeypatch.setenv("FUSEDRESNET_GIT_COMMIT", "ec4852c")
    assert git_commit() == "ec4852c"
    assert git_commit(tmp_path) == "ec4852c"


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A one-commit git repository; (its folder, the commit's abbreviated hash as `git log` writes it)."""
    monkeypatch.delenv("FUSEDRESNET_GIT_COMMIT", raising=False)
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "kernel.cu").write_text("// first\n")
    git("add", "kernel.cu")
    git("commit", "-q", "-m", "first")
    return tmp_path, git("log", "-1", "--format=%h")


def test_a_clean_checkout_is_its_head_commit_and_untracked_files_do_not_make_it_dirty(repository):
    tree, head = repository
    assert git_commit(tree) == head
    (tree / "results.json").write_text("{}\n")
    assert git_commit(tree) == head


def test_a_changed_tracked_file_marks_the_commit_dirty(repository):
    tree, head = repository
    (tree / "kernel.cu").write_text("// changed, not committed\n")
    assert git_commit(tree) == f"{head}+dirty"


def test_outside_a_git_checkout_there_is_no_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEDRESNET_GIT_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_commit(tmp_path) is None
