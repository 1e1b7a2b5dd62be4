"""The abuse soak (campaigns/abuse_soak.py) in short, on the CPU, against the launcher serving the zero-answer
model: tritonserver is aborted (SIGABRT) in the middle (no abuse cycles: abandoned, expired and cancelled calls
crash this Triton at random, docs/ROBUSTNESS.md, which would make the test's course a matter of chance; the
behaviours themselves are tests/test_client_abuse.py's); the launcher restarts it, and the valid clients, which
retry UNAVAILABLE as the project's clients do, lose no request. The report has its 5-s timeline and the
memory of each server process. The 10-minute run on the GPU host is scripts/gpu_host_robustness.sh.

What was answered around the restart is judged from each valid process's own answer times against the moment of
the SIGABRT and the moment the launcher's "ready again" line was seen, not from which of the sampler's intervals
held traffic (the valid processes start in seconds on a busy core: an abort at a fixed 6 s once came before their
first answer, and the timeline had no valid traffic before the restart). The soak aborts the server once every
valid process has been answered."""

from __future__ import annotations

import json
import os

from fusedresnet.backend.spec import ZERO_MODEL
from fusedresnet.campaigns import abuse_soak
from fusedresnet.loadtest.perf_analyzer import zero_model_repository

SECONDS, ABORT_AT, SAMPLE_EVERY_S = 32.0, 6.0, 2.0
# The launcher sees its restarted server ready up to a readiness probe late, and the failure (its crash line) just
# after the abort: a request in flight at the abort waits at least its recovery less this.
RECOVERY_SLACK_S = 2.0
# A server's memory is judged from this long after it first answered: a restarted server's RSS rose 150 MiB over
# its first 7 s of load on a busy CI machine, then stayed flat (2026-11-28); its loading and warm-up are not growth.
WARM_UP_S = 6.0


def test_a_short_soak_with_an_aborted_server_loses_no_valid_request_and_explains_itself(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "soak"
    status = abuse_soak.main([
        "--seconds", str(SECONDS), "--model", ZERO_MODEL, "--valid-processes", "2", "--valid-in-flight", "4",
        "--images-per-request", "8", "--abuse", "", "--pause", "60", "--warm-up-s", str(WARM_UP_S),
        "--sample-every-s", str(SAMPLE_EVERY_S), "--abort-server-at", str(ABORT_AT), "--load-cores", str(cores[-1]),
        "--out", str(out),
        "--", "--model-repository", str(zero_model_repository(tmp_path / "models"))])
    assert sorted(os.sched_getaffinity(0)) == cores, "the soak left this process pinned to its load cores"
    report = json.loads(out.with_suffix(".json").read_text())
    valid = report["valid"]
    # the abort happened while the valid clients were sending, and the launcher brought a new server
    aborted = report["aborted"]
    assert aborted and aborted["t"] >= ABORT_AT, report["failed_because"]
    assert aborted["ready_again_at"] is not None and aborted["ready_again_at"] > aborted["at"], aborted
    assert report["restarts"] >= 1 and len(report["servers_seen"]) == report["restarts"] + 1
    assert len(report["restart_windows_s"]) == report["restarts"]
    # every valid process was answered by the aborted server (before the SIGABRT) and by the restarted one (after
    # the launcher's ready-again line), from the times of its own answers
    around = [(p["answered_before_abort"], p["answered_after_ready_again"]) for p in valid["per_process"]]
    assert len(around) == 2 and all(before > 0 and after > 0 for before, after in around), (around, aborted)
    # requests refused while the server was down were retried and answered: none lost, none wrong
    assert valid["lost"] == 0 and valid["mismatched_answers"] == 0, valid
    assert valid["retries"] > 0 and sum(p["answered_after_retry"] for p in valid["per_process"]) > 0, valid
    assert valid["answered"] == valid["sent"] == sum(p["answered_first_time"] + p["answered_after_retry"]
                                                    for p in valid["per_process"])
    # some request waited through the outage: from before the failure the launcher saw until its restart was ready
    assert valid["longest_to_answer_s"] >= aborted["recovery_s"] - RECOVERY_SLACK_S, (valid, aborted)
    # the timeline: samples of both servers, and Triton's own figures
    timeline = report["timeline"]
    assert {s["pid"] for s in timeline} >= set(report["servers_seen"][:2])
    assert any(s.get("triton_success", 0) > 0 and s.get("queue_ms") is not None for s in timeline)
    assert all(s["cpu_server"] is not None and s["cpu_valid"] is not None for s in timeline)
    # memory per server: each pid's span starts after it answered; a restarted server's loading is not growth
    memory = {m["pid"]: m for m in report["memory_by_server"]}
    assert set(memory) == set(report["servers_seen"])
    judged = [m for m in memory.values() if m["span_s"]]
    assert judged and all(m["span_s"][0] >= m["first_answered_at"] + WARM_UP_S for m in judged)
    assert report["server_cores"] and report["load_cores"] == str(cores[-1])
    markdown = out.with_suffix(".md").read_text()
    assert "| t | valid_img_per_s |" in markdown and "answered after retry" in markdown
    assert f"SIGABRT to tritonserver {aborted['pid']}" in markdown
    assert status == (0 if report["ok"] else 1)
    assert report["ok"], report["failed_because"]


def test_a_soak_of_two_processes_behind_one_port_keeps_capacity_through_a_crash(tmp_path):
    """The front-door soak (results/front_door.json `abandonment`) in short: two processes share the port, one is
    aborted; valid single-image and batched clients lose nothing, the port never stops answering, and the report
    counts the crash, the restart and its recovery from the launcher's own lines."""
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "soak2"
    status = abuse_soak.main([
        "--seconds", "24", "--model", ZERO_MODEL, "--valid-processes", "2", "--valid-in-flight", "4",
        "--images-per-request", "1,8", "--abuse", "", "--pause", "60", "--warm-up-s", str(WARM_UP_S),
        "--sample-every-s", "1", "--abort-server-at", str(ABORT_AT), "--load-cores", str(cores[-1]),
        "--out", str(out),
        "--", "--processes-per-gpu", "2", "--model-repository", str(zero_model_repository(tmp_path / "models"))])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["processes"] == 2 and report["valid_kinds"] == [f"{ZERO_MODEL} x1", f"{ZERO_MODEL} x8"]
    assert report["aborted"] and report["crashes"] >= 1 and report["restarts"] >= 1
    assert len(report["servers_seen"]) == 2 + report["restarts"]
    assert len(report["recoveries_s"]) == report["restarts"] and all(s > 0 for s in report["recoveries_s"])
    assert report["capacity_zero_s"] == 0, [s for s in report["timeline"] if not s["ready"]]
    valid = report["valid"]
    assert valid["lost"] == 0 and valid["mismatched_answers"] == 0 and valid["answered"] == valid["sent"] > 0, valid
    # both kinds of valid client answered: 1 and 8 images per request
    assert [p["sent"] > 0 for p in valid["per_process"]] == [True, True]
    summary = report["front_door"]
    assert {key: summary[key] for key in ("valid_sent", "valid_failed", "capacity_zero_s", "crashes", "restarts")} \
        == {"valid_sent": valid["sent"], "valid_failed": 0, "capacity_zero_s": 0, "crashes": report["crashes"],
            "restarts": report["restarts"]}
    assert summary["max_recovery_s"] == max(report["recoveries_s"]) and summary["duration_s"] == 24
    # each process's memory from its own metrics: the one that was not aborted served and was judged
    memory = {m["pid"]: m for m in report["memory_by_server"]}
    assert set(memory) == set(report["servers_seen"])
    assert any(m["span_s"] and m["pid"] != report["aborted"]["pid"] for m in memory.values())
    assert status == (0 if report["ok"] else 1) and report["ok"], report["failed_because"]


def test_memory_is_judged_on_the_servers_own_memory_after_its_warm_up():
    """A server judged on its own memory (anonymous pages and its shared-memory regions, counted once): a steady
    rise of 25 MiB a sample is growth, a 150 MiB rise of RSS alone (library pages, regions counted twice) is not,
    and the samples before its warm-up ended are not judged. Judged on RSS, as before, both verdicts flip."""
    def samples(own, rss):
        return [{"t": 100.0 + 2 * i, "own_mib_by_pid": {"7": o}, "rss_mib_by_pid": {"7": r},
                 "success_by_pid": {"7": None if i == 0 else 10 * i}, "gpu_mib": None}
                for i, (o, r) in enumerate(zip(own, rss))]
    loading = [50.0, 600.0]                       # the first two samples: loading, then its first answers
    leaking = abuse_soak.memory_by_server(samples(loading + [700 + 25 * i for i in range(9)], [1200.0] * 11), 4.0)[0]
    assert leaking["own_growth_mib"] == 175 and not leaking["flat"]   # 725 at t 106 to 900 at t 120
    assert leaking["span_s"] == [106.0, 120.0]     # from 4 s after the first answer (t 102)
    rss_rising = [300.0, 900.0] + [1200 + 150 * i / 8 for i in range(9)]
    paging_in = abuse_soak.memory_by_server(samples(loading + [700.0] * 9, rss_rising), 4.0)[0]
    assert paging_in["rss_growth_mib"] > 128 and paging_in["own_growth_mib"] == 0 and paging_in["flat"]


def test_answers_around_a_restart_are_judged_from_their_own_times():
    """A valid process's answers per tenth of a second, judged against the abort and the ready-again moments: only
    tenths wholly before the abort count as the old server's, only those wholly after the line as the new one's;
    a process answered only during the outage's edges counts for neither."""
    abort_at, ready_at = 1000.05, 1012.0
    answered = {"answered_by_tenth_s": {"9999": 3, "10000": 4, "10001": 5, "10119": 6, "10120": 7, "10121": 1}}
    assert abuse_soak.answered_around(answered, abort_at, ready_at) == (3, 8)
    edges = {"answered_by_tenth_s": {"10000": 4, "10119": 6}}     # the abort's tenth, the tenth before the line
    assert abuse_soak.answered_around(edges, abort_at, ready_at) == (0, 0)
