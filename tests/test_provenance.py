"""The commit every results file records (backend/provenance.py)."""

import subprocess

from fusedresnet.backend.provenance import REPO_ROOT, git_commit


def test_the_commit_named_by_the_run_wins_over_the_copied_tree(monkeypatch):
    # On the GPU host the tree's .git reported the session's starting commit (2026-11-26), not the code run.
    monkeypatch.setenv("FUSEDRESNET_GIT_COMMIT", "ec4852c")
    assert git_commit() == "ec4852c"


def test_without_it_the_commit_is_git_head_marked_dirty_when_tracked_files_differ(monkeypatch):
    monkeypatch.delenv("FUSEDRESNET_GIT_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert git_commit() == head + ("+dirty" if dirty else "")
