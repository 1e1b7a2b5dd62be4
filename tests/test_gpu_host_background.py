"""scripts/gpu_host_background.sh, run for real on the CPU: a job that outlives the call that started it.

The GPU host caps each call at 10 minutes; the final H100 run (tune, check, bench with
torch.compile) takes about 15. The script starts the job in the background in a copy of the
tree and packs what it has written into $OUT/out.tgz at the end of every call.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_host_background.sh"


def _call(tree: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=60)


def _packed(out: Path) -> dict[str, str]:
    with tarfile.open(out / "out.tgz") as archive:
        return {m.name: archive.extractfile(m).read().decode() for m in archive.getmembers() if m.isfile()}


def test_a_job_started_in_one_call_is_waited_for_in_the_next_and_its_results_come_back_each_time(tmp_path):
    tree, out, work = tmp_path / "tree", tmp_path / "out", tmp_path / "background"
    tree.mkdir()
    (tree / "input.txt").write_text("from the tree\n")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "BG_DIR": str(work)}
    release = tmp_path / "release"
    job = (f'cat input.txt > "$OUT/first.txt"; echo step one; '
           f'while [ ! -e {release} ]; do sleep 0.1; done; echo step two; '
           f'echo done > "$OUT/second.txt"; exit 3')

    started = _call(tree, env, "start", "2", job)
    assert started.returncode == 124, started.stdout + started.stderr      # still running: say so
    assert "still running" in started.stdout and "step one" in started.stdout
    first = _packed(out)
    assert first["out/first.txt"] == "from the tree\n"                     # ran in a copy of the tree, OUT set
    assert "rc" not in first and "out/second.txt" not in first

    again = _call(tree, env, "start", "1", "true")                          # one job at a time
    assert again.returncode == 2 and "still runs" in again.stderr

    release.touch()
    waited = _call(tree, env, "wait", "30")
    assert waited.returncode == 3, waited.stdout + waited.stderr            # the job's own exit status
    assert "ended with exit status 3" in waited.stdout
    second = _packed(out)
    assert second["out/second.txt"] == "done\n" and second["rc"].strip() == "3"
    assert "step one\nstep two\n" in second["console.log"]


def test_waiting_on_a_host_where_nothing_was_started_is_an_error(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "BG_DIR": str(tmp_path / "none")}
    waited = _call(tmp_path, env, "wait", "1")
    assert waited.returncode == 2 and "no job was started" in waited.stderr
