"""Faults: a model's Python stub killed under load, tritonserver itself aborted, and the server
stopped under load.

Each test runs its OWN server (the launcher, as users run it, or a TritonServer) on
free ports: it kills processes or stops the server, which the shared session server
must never see. Clients keep sending during the fault with client timeouts set, so a
hang shows up as a timeout, and every request is accounted for.

This Triton build (2.51) does not restart a dead Python stub: the model keeps
reporting ready and every request to it fails with "Stub process ... is not healthy".
A client that abandons calls in flight can abort it (tests/test_client_abuse.py). The
launcher (`python -m fusedresnet.backend.serve`) watches the stubs and the server itself and
restarts the server; these tests prove the service comes back with correct answers.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from fusedresnet.backend.network import free_ports
from fusedresnet.backend.serve import (
    EXIT_SERVER_DIED,
    EXIT_STUB_DIED,
    READY_AGAIN_LINE,
    WEDGED_AFTER_S,
    ServerSettings,
    launch,
)
from fusedresnet.backend.spec import INPUT_UINT8, MODELS, OUTPUT_LOGITS
from fusedresnet.campaigns.serving_sequence import repository_with_instances

from robustness_helpers import (
    CLIENT_TIMEOUT_S,
    ClientThreads,
    Launcher,
    assert_correct,
    client,
    infer_image,
    record,
    results_dir,
    shm_regions_of_stubs,
    wait_until,
)

RECOVERY_BOUND_S = 180.0      # kill -> first correct answer: a server restart, with room for a slow GPU host
REQUEST_BOUND_S = 60.0        # no request during a fault may take longer than this (client timeout is 120 s)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return results_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def repository(prepared_repository, tmp_path_factory) -> Path:
    """The networks' entries with one instance each. What these tests
    prove (the launcher's watch and restart, Triton's stop) does not depend on the instance count, and
    each of their nine server starts then loads 2 Python stubs instead of the shipped 12 (on the
    2-core CI machine about 10 s instead of 35 s a start)."""
    folder = tmp_path_factory.mktemp("faults") / "model_repository"
    return repository_with_instances(prepared_repository, 1, folder, entries=MODELS)


class TrafficLoop(ClientThreads):
    """Client threads that keep sending small valid batches to one model until stopped (ClientThreads)."""

    def __init__(self, server, model: str, images: np.ndarray, protocols=("grpc", "grpc", "http"),
                 batch: int = 2, max_seconds: float = 600.0):
        self.server, self.model, self.images, self.batch = server, model, images, batch
        self.max_seconds = max_seconds
        super().__init__(protocols)

    def _run(self, worker: int, protocol: str):
        started_loop = time.monotonic()
        sent = 0
        triton = None
        while not self.stopping.is_set() and time.monotonic() - started_loop < self.max_seconds:
            first = (worker * 7 + sent * self.batch) % (len(self.images) - self.batch)
            started = time.monotonic()
            try:
                if triton is None:
                    triton = client(self.server, protocol)
                outcome = infer_image(triton, protocol, self.model, self.images[first:first + self.batch])
            except Exception as error:  # connection refused while the server restarts is an answer too
                outcome = error
                if triton is not None:
                    try:
                        triton.close()
                    except Exception:
                        pass
                    triton = None
            self.record(started, first, outcome)
            sent += 1
            if isinstance(outcome, Exception):
                time.sleep(0.2)
        if triton is not None:
            triton.close()


def first_correct_answer_after(loop: TrafficLoop, moment: float, reference: np.ndarray):
    for started, ended, first, outcome in sorted(loop.snapshot(), key=lambda r: r[1]):
        if started > moment and isinstance(outcome, np.ndarray):
            assert_correct(outcome, reference[first:first + loop.batch])
            return ended
    return None


def test_killed_stub_fails_in_flight_requests_and_the_launcher_restores_correct_answers(
        tmp_path, results, repository, admin_token, varied_images, reference_logits):
    images = varied_images[:16]
    reference = reference_logits(images)
    figures = {}
    with Launcher(tmp_path, admin_token, extra_args=["--model-repository", str(repository)]) as launcher:
        for model in MODELS:
            # Every instance of the model: with several, a request in flight on an instance that
            # lives on would be answered, and the one killed may have had nothing in flight.
            stubs = {name: pid for name, pid in launcher.stub_pids().items() if name.startswith(f"{model}_")}
            assert stubs, launcher.stub_pids()
            server_pid = launcher.server_pid()
            shm_regions = shm_regions_of_stubs(server_pid)
            assert shm_regions
            with TrafficLoop(launcher, model, images) as loop:
                assert wait_until(lambda: any(isinstance(r[3], np.ndarray) for r in loop.snapshot()), 60)
                killed_at = time.monotonic()
                for pid in stubs.values():
                    os.kill(pid, signal.SIGKILL)
                # Recovery: the first correct answer to a request sent after the launcher restarted Triton.
                assert wait_until(lambda: launcher.server_pid() not in (None, server_pid), RECOVERY_BOUND_S, 0.1), \
                    f"the launcher did not restart Triton within {RECOVERY_BOUND_S} s\n" + launcher.output()
                restarted_at = time.monotonic()
                assert wait_until(lambda: first_correct_answer_after(loop, restarted_at, reference) is not None,
                                  RECOVERY_BOUND_S, 0.5), \
                    f"{model} gave no correct answer within {RECOVERY_BOUND_S} s of its stub's death\n" \
                    + launcher.output()
                recovered_at = first_correct_answer_after(loop, restarted_at, reference)
                time.sleep(2.0)  # traffic after recovery must all succeed
            records = loop.snapshot()
            in_flight = [r for r in records if r[0] < killed_at < r[1]]
            failed_in_flight = [r for r in in_flight if isinstance(r[3], Exception)]
            after = [r for r in records if r[0] > recovered_at]
            # every request ended, none near its client timeout: failures are answers, not hangs
            assert max(ended - started for started, ended, _, _ in records) < REQUEST_BOUND_S
            assert failed_in_flight, f"no request was in flight when the stub died: {in_flight}"
            messages = " | ".join(str(r[3]) for r in failed_in_flight)
            assert "not healthy" in messages or "Stub" in messages or "unavailable" in messages.lower(), messages
            assert after and all(isinstance(r[3], np.ndarray) for r in after), [r[3] for r in after
                                                                                if isinstance(r[3], Exception)]
            for _, _, first, logits in after:
                assert_correct(logits, reference[first:first + loop.batch])
            assert launcher.server_pid() != server_pid, "the server was not restarted"
            leaked = [r for r in shm_regions if os.path.exists(f"/dev/shm/{r}")]
            assert not leaked, f"the killed server's shared-memory regions were left behind: {leaked}"
            assert re.search(rf"Python stub of [^\n]*{model}_\d+_\d+[^\n]* died; restarting Triton", launcher.output())
            figures[model] = {
                "recovery_s": round(recovered_at - killed_at, 2),
                "requests": len(records), "in_flight_at_kill": len(in_flight),
                "in_flight_failed": len(failed_in_flight),
                "failed_total": sum(isinstance(r[3], Exception) for r in records),
                "succeeded_after_recovery": len(after),
                "longest_request_s": round(max(e - s for s, e, _, _ in records), 2),
                "in_flight_error": str(failed_in_flight[0][3])[:160],
            }
        # both models answer correctly on the restarted server
        for model in MODELS:
            with client(launcher, "grpc") as triton:
                assert_correct(infer_image(triton, "grpc", model, images[:4]), reference[:4])
    record(results, "faults", {"stub_kill": figures, "recovery_bound_s": RECOVERY_BOUND_S})


def test_launcher_with_no_restart_exits_with_status_3_when_a_stub_dies(tmp_path, repository, admin_token):
    launcher = Launcher(tmp_path, admin_token, extra_args=["--no-restart", "--model-repository", str(repository)])
    with launcher:
        server_pid = launcher.server_pid()
        os.kill(launcher.stub_pids()[f"{MODELS[0]}_0_0"], signal.SIGKILL)
        killed_at = time.monotonic()
        launcher.process.wait(timeout=90)
        exited_after_s = time.monotonic() - killed_at
    assert launcher.process.returncode == EXIT_STUB_DIED, launcher.output()
    assert not os.path.exists(f"/proc/{server_pid}") or "Z" in open(f"/proc/{server_pid}/stat").read().split()[2]
    assert exited_after_s < launcher.exit_timeout_s + 30


def test_aborted_tritonserver_is_restarted_by_the_launcher_on_the_same_ports_with_its_cause_logged(
        tmp_path, results, repository, admin_token, varied_images, reference_logits):
    """SIGABRT to tritonserver, as the gRPC abandonment crash does it (sync.cc:105, then signal 6), while
    a client sends: Triton either exits or hangs in its abort handler; the launcher restarts it within
    RECOVERY_BOUND_S (+ WEDGED_AFTER_S for a hang) and logs why, with the server log's last lines."""
    images = varied_images[:8]
    reference = reference_logits(images)
    with Launcher(tmp_path, admin_token, extra_args=["--model-repository", str(repository)]) as launcher:
        server_pid = launcher.server_pid()
        with TrafficLoop(launcher, MODELS[0], images, protocols=("grpc", "http")) as loop:
            assert wait_until(lambda: any(isinstance(r[3], np.ndarray) for r in loop.snapshot()), 60)
            aborted_at = time.monotonic()
            os.kill(server_pid, signal.SIGABRT)
            assert wait_until(lambda: launcher.server_pid() not in (None, server_pid),
                              RECOVERY_BOUND_S + WEDGED_AFTER_S, 0.1), \
                "the launcher did not restart an aborted Triton\n" + launcher.output()
            restarted_at = time.monotonic()
            assert wait_until(lambda: first_correct_answer_after(loop, restarted_at, reference) is not None,
                              RECOVERY_BOUND_S, 0.5), "no correct answer after the restart\n" + launcher.output()
            recovered_at = first_correct_answer_after(loop, restarted_at, reference)
            # the launcher says so once its own readiness poll sees the new server, which on a busy
            # machine can come after the clients' first answer
            assert wait_until(lambda: f"{READY_AGAIN_LINE} (restart 1)" in launcher.output(), 60, 0.2), \
                launcher.output()
            time.sleep(1.0)
        ports = (launcher.http_port, launcher.grpc_port, launcher.metrics_port)
        assert launcher.ready() and launcher.process.poll() is None
        output = launcher.output()
    records = loop.snapshot()
    after = [r for r in records if r[0] > recovered_at]
    assert after and all(isinstance(r[3], np.ndarray) for r in after)
    assert max(ended - started for started, ended, _, _ in records) < REQUEST_BOUND_S
    # the cause: the signal (Triton exited) or the hang (it did not), then the server log's last lines
    assert re.search(r"tritonserver \(pid \d+\) crashed: '(Signal \(6\) received\.|Fatal Python error: Aborted)'|"
                     r"tritonserver exited unasked \(killed by SIGABRT \(signal 6\)\)|"
                     r"has not answered on (gRPC|HTTP) for \d+ s", output), output
    assert "restarting Triton" in output and "--- last lines of" in output, output
    # Triton's abort handler prints its signal, then a backtrace of varying length: the launcher's
    # LOG_LINES_ON_FAILURE may show only the trace, and the log keeps the whole of it
    assert re.search(r"Signal \(6\)|Fatal Python error: Aborted", launcher.log_file.read_text(errors="replace"))
    assert ports == (launcher.http_port, launcher.grpc_port, launcher.metrics_port)
    record(results, "faults", {"server_abort": {
        "recovery_s": round(recovered_at - aborted_at, 2), "requests": len(records),
        "failed_total": sum(isinstance(r[3], Exception) for r in records), "succeeded_after_recovery": len(after),
        "cause_logged": re.search(r"fusedresnet: (tritonserver [^;]*);", output).group(1)}})


def test_launcher_with_no_restart_exits_with_status_4_when_tritonserver_is_aborted(tmp_path, repository,
                                                                                     admin_token):
    launcher = Launcher(tmp_path, admin_token, extra_args=["--no-restart", "--model-repository", str(repository)])
    with launcher:
        server_pid = launcher.server_pid()
        os.kill(server_pid, signal.SIGABRT)
        launcher.process.wait(timeout=WEDGED_AFTER_S + 60)
    assert launcher.process.returncode == EXIT_SERVER_DIED, launcher.output()
    assert "stopping Triton (--no-restart)" in launcher.output()
    assert not os.path.exists(f"/proc/{server_pid}") or "Z" in open(f"/proc/{server_pid}/stat").read().split()[2]


@pytest.mark.parametrize("exit_timeout_s, count", [(30, 96), (2, 192)], ids=["drains", "cut-short"])
def test_server_stopped_under_load_answers_every_request_and_exits_within_the_exit_timeout(
        tmp_path, results, repository, admin_token, varied_images, reference_logits, exit_timeout_s, count):
    """Stop (SIGINT, as Ctrl-C on the launcher) while `count` single-image requests are queued or running.
    drains: the exit timeout is longer than the work, Triton finishes every request and exits by itself.
    cut-short: on the CPU the work outlasts the exit timeout; Triton gives up at the timeout (this build
    can crash and hang on that path) and the launcher's stop() kills it: every client still gets an answer."""
    images = varied_images[:8]
    reference = reference_logits(images)
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = ServerSettings(repository, admin_token=admin_token, http_port=http_port, grpc_port=grpc_port,
                              metrics_port=metrics_port, processes_per_gpu=1, log_file=tmp_path / "server.log",
                              exit_timeout_s=exit_timeout_s, mps="off")
    answers: dict[int, tuple[float, object]] = {}  # index -> (when answered, logits or error)
    lock = threading.Lock()

    def on_answer(index):
        def callback(result, error):
            outcome = error if error is not None else result.as_numpy(OUTPUT_LOGITS)
            with lock:
                answers[index] = (time.monotonic(), outcome)
        return callback

    with launch(settings) as group:
        server = group.first     # its process, its stubs' shared-memory regions, its own stop
        triton = grpcclient.InferenceServerClient(server.grpc_url)
        tensors = []
        for i in range(len(images)):
            tensor = grpcclient.InferInput(INPUT_UINT8, [1, *images.shape[1:]], "UINT8")
            tensor.set_data_from_numpy(images[i:i + 1])
            tensors.append(tensor)
        for index in range(count):
            triton.async_infer(MODELS[index % 2], [tensors[index % len(images)]], on_answer(index),
                               client_timeout=CLIENT_TIMEOUT_S)
        assert wait_until(lambda: len(answers) >= 1, 60, 0.05)
        shm_regions = list(server.shm_regions)
        assert shm_regions
        stop_at = time.monotonic()
        server.stop()  # SIGINT; SIGKILL if Triton still runs exit_timeout_s + 15 s later
        stop_s = time.monotonic() - stop_at
        answered = wait_until(lambda: len(answers) == count, 30, 0.1)
        triton.close()
    assert answered, f"{count - len(answers)} of {count} requests never got an answer"
    successes = {i: o for i, (_, o) in answers.items() if isinstance(o, np.ndarray)}
    failures = {i: o for i, (_, o) in answers.items() if not isinstance(o, np.ndarray)}
    for index, logits in successes.items():
        assert_correct(logits, reference[index % len(images)][None])
    assert all(str(error) for error in failures.values())
    assert stop_s <= exit_timeout_s + 15 + 5, f"stop took {stop_s:.1f} s"
    assert not [r for r in shm_regions if os.path.exists(f"/dev/shm/{r}")], "shared memory left in /dev/shm"
    if exit_timeout_s == 30:
        assert server.process.returncode == 0 and stop_s <= exit_timeout_s, (server.process.returncode, stop_s)
    record(results, "faults", {f"stop_under_load_{'drains' if exit_timeout_s == 30 else 'cut_short'}": {
        "requests": count, "answered": len(answers), "succeeded": len(successes), "failed": len(failures),
        "answered_before_stop": sum(1 for t, _ in answers.values() if t < stop_at),
        "exit_timeout_s": exit_timeout_s, "stop_s": round(stop_s, 2),
        "server_exit_code": server.process.returncode,
        "failure_examples": sorted({str(o)[:120] for o in failures.values()})[:3]}})
