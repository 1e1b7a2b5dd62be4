"""Several tritonserver processes behind one port: the launcher's --processes-per-gpu.

Against the real launcher with two processes on the same gRPC and HTTP ports (SO_REUSEPORT, on this
GPU-less machine "per GPU" means on the host), each network with one instance per process:

- both processes listen on the shared ports, and requests over fresh connections reach both: each
  process's own metrics count a share, and the shares add up to what was sent;
- a process killed (SIGKILL) or aborted (SIGABRT, as Triton 2.51's gRPC crash ends) under load costs
  the project's clients no call: gRPC calls in flight on it fail UNAVAILABLE and the channel's retry
  policy resends them on a new connection, which reaches the live process; HTTP calls are resent the
  same way by ResNetClient. The process comes back alone, on the same ports, and takes its share again;
- the abandonment storm (connections closed with calls in flight, again and again) beside valid
  clients: no valid call lost, and the shared port never stops answering.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from fusedresnet.backend.launcher.stub_processes import python_stubs
from fusedresnet.backend.network import ephemeral_port_range, free_port_run, free_ports, http_ready, port_is_free
from fusedresnet.backend.serve import (
    CRASH_LOOP_S,
    EXIT_SERVER_DIED,
    MAX_RESTARTS,
    READY_AGAIN_LINE,
    ServerGroup,
    metrics_list_models,
)
from fusedresnet.backend.spec import MODEL_CUDNN, MODEL_CUSTOM, MODELS, model_config
from fusedresnet.backend.triton_server.installation import ServerError
from fusedresnet.campaigns import client_abuse
from fusedresnet.campaigns.serving_sequence import repository_with_instances
from fusedresnet.client.resnet_client import ResNetClient
from fusedresnet.loadtest import triton_metrics
from fusedresnet.loadtest.perf_analyzer import zero_model_repository

from robustness_helpers import (
    CLIENT_TIMEOUT_S,
    ClientThreads,
    Launcher,
    assert_correct,
    infer_image,
    listening_addresses,
    metrics_url_of,
    read_until,
    record,
    results_dir,
    wait_until,
)

PROCESSES = 2
RESTART_BOUND_S = 120.0      # a killed process ready again (two models on a busy 2-core machine: 10-30 s)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return results_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def launcher(prepared_repository, tmp_path_factory, admin_token):
    """Two processes on one port, one instance per network each (what is proved does not depend on the count)."""
    folder = tmp_path_factory.mktemp("front-door")
    repository = repository_with_instances(prepared_repository, 1, folder / "model_repository", entries=MODELS)
    with Launcher(folder, admin_token, extra_args=["--model-repository", str(repository)],
                  processes=PROCESSES) as running:
        yield running


@pytest.fixture(scope="module")
def images(varied_images):
    return varied_images[:8]


@pytest.fixture(scope="module")
def reference(images, reference_logits):
    return reference_logits(images)


def port_answers(launcher) -> bool:
    """The shared HTTP port answers a readiness probe, tried twice as a client with one retry does: a connection
    the kernel had queued on a process at the moment it died is reset, and the next one reaches a live one."""
    return http_ready(launcher.http_url) or http_ready(launcher.http_url)


def successes_by_process(launcher, model: str) -> list[float]:
    """Triton's success count of `model` in each process, read through the process's own metrics port."""
    return [triton_metrics.scrape(metrics_url_of(port), timeout_s=10).total(triton_metrics.SUCCESS, model)
            for port in launcher.metrics_ports]


def fresh_connection_client(launcher) -> grpcclient.InferenceServerClient:
    """A gRPC client on a connection of its own (no subchannel shared with the other clients of this process)."""
    return grpcclient.InferenceServerClient(launcher.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])


def test_two_processes_listen_on_one_port_and_each_answers_a_share(launcher, images, reference, results):
    pids = launcher.server_pids()
    assert sorted(pids) == launcher.metrics_ports, launcher.output()
    listening = {port: set() for port in (launcher.grpc_port, launcher.http_port)}
    for pid in pids.values():
        for connection in psutil.Process(pid).net_connections(kind="tcp"):
            if connection.status == "LISTEN" and connection.laddr.port in listening:
                listening[connection.laddr.port].add(pid)
    assert all(owners == set(pids.values()) for owners in listening.values()), (listening, pids)
    assert listening_addresses([launcher.grpc_port, launcher.http_port]) == \
        {launcher.grpc_port: {"127.0.0.1"}, launcher.http_port: {"127.0.0.1"}}

    before = successes_by_process(launcher, MODEL_CUSTOM)
    sent = 40
    for i in range(sent):        # each request on a new connection: the kernel picks a process for each
        protocol = "grpc" if i % 2 == 0 else "http"
        if protocol == "grpc":
            with fresh_connection_client(launcher) as triton:
                logits = infer_image(triton, "grpc", MODEL_CUSTOM, images[i % 8:i % 8 + 1])
        else:
            with ResNetClient(MODEL_CUSTOM, "http", launcher.http_url) as triton:
                logits = triton.infer(images[i % 8:i % 8 + 1]).logits
        assert_correct(logits, reference[i % 8:i % 8 + 1])
    shares = read_until(lambda: [a - b for a, b in zip(successes_by_process(launcher, MODEL_CUSTOM), before)],
                        lambda delta: sum(delta) >= sent, 10)
    assert sum(shares) == sent, shares
    assert all(share >= 1 for share in shares), f"a process answered nothing: {shares}"
    record(results, "front_door", {"share_of_40_fresh_connections": shares})


class ProjectClients(ClientThreads):
    """Threads sending valid requests as the project's client does (ResNetClient: gRPC with its channel's
    retry policy, HTTP with its resend), each on its own connection (ClientThreads)."""

    def __init__(self, launcher, images: np.ndarray, protocols=("grpc",) * 4 + ("http",) * 2):
        self.launcher, self.images = launcher, images
        super().__init__(protocols)

    def _run(self, worker: int, protocol: str):
        url = self.launcher.grpc_url if protocol == "grpc" else self.launcher.http_url
        sent = 0
        # each client its own connection (grpc_channel): the threads' connections land on both processes
        with ResNetClient(MODELS[worker % 2], protocol, url, timeout_s=CLIENT_TIMEOUT_S) as triton:
            while not self.stopping.is_set():
                first = (worker * 3 + sent) % (len(self.images) - 1)
                started = time.monotonic()
                try:
                    outcome = triton.infer(self.images[first:first + 2]).logits
                except Exception as error:   # a failed call is what this test counts
                    outcome = error
                self.record(started, first, outcome)
                sent += 1


@pytest.mark.parametrize("signal_number, index", [(signal.SIGKILL, 0), (signal.SIGABRT, 1)], ids=["SIGKILL", "SIGABRT"])
def test_a_process_killed_under_load_costs_no_client_call_and_comes_back_on_its_ports(
        launcher, images, reference, results, signal_number, index):
    port = launcher.metrics_ports[index]
    victim = launcher.server_pids()[port]
    restarts_before = launcher.output().count(READY_AGAIN_LINE)
    with ProjectClients(launcher, images) as clients:
        assert wait_until(lambda: len(clients.records) >= 12, 60), launcher.output()
        killed_at = time.monotonic()
        os.kill(victim, signal_number)
        serving = []
        # the shared port answers all along; the victim comes back with a new pid on its own metrics port
        while time.monotonic() - killed_at < RESTART_BOUND_S:
            serving.append(port_answers(launcher))
            if launcher.output().count(READY_AGAIN_LINE) > restarts_before:
                break
            time.sleep(0.5)
        back_after_s = time.monotonic() - killed_at
        time.sleep(2.0)                         # traffic on both processes again
    new_pid = launcher.server_pids().get(port)
    assert new_pid not in (None, victim), launcher.output()
    assert metrics_list_models(metrics_url_of(port), list(MODELS)), launcher.output()
    failures = clients.failures()
    assert not failures, f"{len(failures)} of {len(clients.records)} calls failed: " + \
        "; ".join(f"{type(e).__name__} {getattr(e, 'status', lambda: '')()} {e}" for *_, e in failures[:3])
    during = [r for r in clients.records if killed_at < r[0] < killed_at + back_after_s]
    assert during, "no call was answered while the process was down"
    for _, _, first, logits in clients.records:
        assert_correct(logits, reference[first:first + 2])
    assert all(serving), f"the shared port did not answer in {serving.count(False)} of {len(serving)} probes"
    # the restarted process takes its share again: fresh connections reach it
    before = successes_by_process(launcher, MODEL_CUSTOM)
    for _ in range(16):
        with fresh_connection_client(launcher) as triton:
            infer_image(triton, "grpc", MODEL_CUSTOM, images[:1])
    shares = read_until(lambda: [a - b for a, b in zip(successes_by_process(launcher, MODEL_CUSTOM), before)],
                        lambda delta: sum(delta) >= 16, 10)
    assert shares[index] >= 1, shares
    record(results, "front_door", {f"kill_{signal.Signals(signal_number).name}": {
        "calls": len(clients.records), "failed": len(failures), "answered_while_down": len(during),
        "back_after_s": round(back_after_s, 1), "share_after": shares}})


def test_abandonment_storm_beside_valid_clients_loses_no_valid_call(launcher, images, results):
    """Connections closed with calls in flight, round after round, alternating the two networks (the pattern
    that crashes Triton 2.51), while valid clients send: none of theirs is lost or wrong, and the shared
    port answers throughout (a process that crashes is restarted alone; the other serves meanwhile)."""
    requests = {model: [client_abuse.infer_request(model, images[i:i + 1]) for i in range(len(images))]
                for model in (MODEL_CUSTOM, MODEL_CUDNN)}
    valid: dict = {}
    serving: list[bool] = []
    storming = threading.Event()

    def valid_clients():
        valid.update(client_abuse.valid_for(launcher.grpc_url, requests[MODEL_CUDNN], seconds=24, in_flight=8))

    def probe():
        while not storming.is_set():
            serving.append(port_answers(launcher))
            time.sleep(0.5)

    threads = [threading.Thread(target=valid_clients), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    rounds = []
    for round_index in range(6):
        model = (MODEL_CUSTOM, MODEL_CUDNN)[round_index % 2]
        rounds += client_abuse.abandon(launcher.grpc_url, requests[model], rounds=1, in_flight=64, hold_s=1.0,
                                       connections=16)
        time.sleep(2.0)
    threads[0].join(timeout=CLIENT_TIMEOUT_S + 60)
    storming.set()
    threads[1].join()
    assert valid and valid["lost"] == 0 and valid["mismatched"] == 0, valid
    assert valid["sent"] > 0
    assert all(serving), f"the shared port did not answer in {serving.count(False)} of {len(serving)} probes"
    assert wait_until(lambda: all(metrics_list_models(metrics_url_of(p), list(MODELS))
                                  for p in launcher.metrics_ports), RESTART_BOUND_S), launcher.output()
    record(results, "front_door", {"abandonment_storm": {
        "rounds": len(rounds), "abandoned_calls": sum(r.sent for r in rounds),
        "valid_sent": valid["sent"], "valid_lost": valid["lost"], "valid_retries": valid["retries"],
        "crashes": launcher.output().count("crashed:"), "shared_port_probes": len(serving)}})


def test_launcher_refuses_ports_another_server_holds(launcher, tmp_path, admin_token):
    """SO_REUSEPORT would let a second launcher join the first one's port group: it refuses instead."""
    second = Launcher(tmp_path, admin_token, processes=PROCESSES)
    second.settings = second.settings.replace(http_port=launcher.http_port, grpc_port=launcher.grpc_port)
    with pytest.raises(RuntimeError, match="already in use"):
        second.start(ready_timeout_s=60)
    assert Path(second.output_file).read_text().count("already in use") == 1


def test_no_restart_stops_every_process_and_exits_4_when_one_crashes(prepared_repository, tmp_path, admin_token):
    """--no-restart with several processes: the first failure of any stops them all (exit status 4 for a
    crashed tritonserver), leaving the restart to an orchestrator."""
    repository = repository_with_instances(prepared_repository, 1, tmp_path / "model_repository", entries=MODELS)
    launcher = Launcher(tmp_path, admin_token, processes=PROCESSES,
                        extra_args=["--no-restart", "--model-repository", str(repository)])
    with launcher:
        pids = launcher.server_pids()
        assert len(pids) == PROCESSES, launcher.output()
        os.kill(pids[launcher.metrics_ports[1]], signal.SIGABRT)
        launcher.process.wait(timeout=120)
    assert launcher.process.returncode == EXIT_SERVER_DIED, launcher.output()
    output = launcher.output()
    # the binary's abort line, or the in-process front end's (Python's fatal-error report)
    assert re.search(r"crashed: '(Signal \(6\) received\.|Fatal Python error: Aborted)'", output), output
    assert "stopping Triton (--no-restart)" in output, output
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_launcher_outlasts_crashes_that_come_apart_and_gives_up_only_in_a_crash_loop(tmp_path, admin_token):
    """Crashes that come at random (Triton 2.51 under abandoned calls) must not use up a restart budget: a process
    that served CRASH_LOOP_S before it failed starts the count afresh. Only MAX_RESTARTS + 1 failures in a row, each
    right after the process became ready, are a crash loop, and the launcher then exits 4. Before 2026-11-28 the
    launcher gave up at the 4th failure within 10 minutes, whatever came between them."""
    repository = zero_model_repository(tmp_path / "models")
    launcher = Launcher(tmp_path, admin_token, extra_args=["--model-repository", str(repository)])

    def kill_the_server(restarts_before: int):
        """SIGKILL the tritonserver as soon as the launcher has it ready after `restarts_before` restarts."""
        assert wait_until(lambda: launcher.output().count(READY_AGAIN_LINE) == restarts_before, RESTART_BOUND_S), \
            launcher.output()
        os.kill(launcher.server_pid(), signal.SIGKILL)

    with launcher:
        kill_the_server(0)
        kill_the_server(1)          # two quick failures in a row
        assert wait_until(lambda: launcher.output().count(READY_AGAIN_LINE) == 2, RESTART_BOUND_S)
        time.sleep(CRASH_LOOP_S + 1)
        kill_the_server(2)          # it served: the count starts afresh
        for restarts in range(3, 3 + MAX_RESTARTS):
            kill_the_server(restarts)   # MAX_RESTARTS quick failures in a row: restarted still
        assert wait_until(lambda: launcher.output().count(READY_AGAIN_LINE) == 3 + MAX_RESTARTS, RESTART_BOUND_S)
        assert launcher.process.poll() is None, launcher.output()   # 6 failures within 10 minutes, still serving
        os.kill(launcher.server_pid(), signal.SIGKILL)             # one more quick failure: a crash loop
        launcher.process.wait(timeout=RESTART_BOUND_S)
    output = launcher.output()
    assert launcher.process.returncode == EXIT_SERVER_DIED, output
    assert f"a crash loop: {MAX_RESTARTS + 1} failures in a row" in output, output


def test_instances_per_gpu_divides_each_models_instances_among_the_processes(prepared_repository, tmp_path,
                                                                            admin_token, images, reference):
    """--instances gpu: a model configured with 3 instances gets 2 in each of 2 processes (rounded up), where
    --instances process (the default) would start 3 in each; both processes still answer correctly."""
    repository = repository_with_instances(prepared_repository, 3, tmp_path / "model_repository", entries=MODELS)
    launcher = Launcher(tmp_path, admin_token, processes=PROCESSES,
                        extra_args=["--instances", "gpu", "--model-repository", str(repository)])
    with launcher:
        pids = launcher.server_pids()
        assert len(pids) == PROCESSES, launcher.output()
        for pid in pids.values():
            instances = sorted(python_stubs(pid))
            assert instances == sorted(f"{model}_0_{i}" for model in MODELS for i in range(2)), instances
        for _ in range(2 * PROCESSES):   # fresh connections: the kernel spreads them over the processes
            with fresh_connection_client(launcher) as client:
                for model in MODELS:
                    assert_correct(infer_image(client, "grpc", model, images[:2]), reference[:2])
    # the configured repository is left as it was: the division is the launcher's own copy
    assert all(group.count == 3 for model in MODELS for group in model_config(model, repository).instance_group)


def test_processes_per_gpu_plans_one_gpu_per_process_on_shared_ports_and_consecutive_metrics_ports():
    """The layout of --processes-per-gpu 2 over GPUs 0 and 1 (planned only: this machine has no GPU)."""
    group = ServerGroup.plan(2, "0,1", True, 9100, model_repository=Path("repo"), http_port=9000, grpc_port=9001)
    assert [(s.label, s.gpus, s.metrics_port, s.shares_ports) for s in group.servers] == [
        ("gpu0.p0", "0", 9100, True), ("gpu0.p1", "0", 9101, True),
        ("gpu1.p0", "1", 9102, True), ("gpu1.p1", "1", 9103, True)]
    assert {(s.http_port, s.grpc_port) for s in group.servers} == {(9000, 9001)}
    assert len({s.shm_region_prefix for s in group.servers}) == 4
    assert all("--reuse-grpc-port=true" in s.command(FakeTriton(), Path("backends")) for s in group.servers)
    single = ServerGroup.plan(1, None, False, 9100, http_port=9000, grpc_port=9001)
    assert [(s.label, s.shares_ports) for s in single.servers] == [("", False)]
    assert not any(arg.startswith("--reuse") for arg in single.servers[0].command(FakeTriton(), Path("b")))
    with pytest.raises(ServerError, match="at least 1"):
        ServerGroup.plan(0, None, False, 9100)


class FakeTriton:
    """Where a Triton installation's files are, for TritonServer.command (which only names them)."""
    binary = Path("tritonserver")
    home = Path("triton")


def test_processes_starting_together_make_the_private_backend_tree_once(tmp_path, monkeypatch):
    """A launcher's processes start at once, on a fresh machine with no backend tree yet (seen failing on the
    GPU host with FileExistsError): each gets the same complete tree."""
    from concurrent.futures import ThreadPoolExecutor

    from fusedresnet.backend.triton_server import installation

    monkeypatch.setattr(installation, "BUILD_DIR", tmp_path)
    triton = installation.find_triton()
    together = threading.Barrier(8)

    def start(_):
        together.wait()
        return installation.private_backend_tree(triton)

    with ThreadPoolExecutor(8) as pool:
        trees = list(pool.map(start, range(8)))
    assert len(set(trees)) == 1 and trees[0].parent == tmp_path
    stub = trees[0] / "python" / "triton_python_backend_stub"
    assert stub.is_file() and os.access(stub, os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == [trees[0].name]   # no scratch folder left behind


def test_a_port_that_a_stopped_server_left_in_time_wait_is_free_and_one_listened_on_is_not():
    """Seen on the H200 (2026-12-02): the launcher started right after another one stopped refused with 'port(s)
    8000 on 127.0.0.1 already in use', though nothing listened: the stopped server's closed connections were in
    TIME_WAIT, which a bind without SO_REUSEADDR counts. Triton binds with SO_REUSEADDR, so the check must too."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()                  # the server closes first: its side of the connection goes to TIME_WAIT
        assert client.recv(1) == b""
        client.close()
        assert not port_is_free(port), "a port someone listens on is taken"
    with socket.socket() as plain:       # the condition is real: a bind without SO_REUSEADDR still fails here
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert port_is_free(port), "only TIME_WAIT connections are left on the port: a server can listen on it"


def test_ports_handed_to_servers_are_outside_the_range_outgoing_connections_take():
    """Seen in CI (2026-12-02): a launcher's second process failed 'Socket 127.0.0.1:55442 already in use' for its
    metrics port, chosen free seconds before by bind(port 0), which picks from the kernel's ephemeral range, where
    any outgoing connection (a client, a probe) can take a port meanwhile. The ports the tests and campaigns hand
    to servers come from outside that range, and each was unused when chosen."""
    low, high = ephemeral_port_range()
    assert 1024 <= low < high <= 65535
    ports = free_ports(64) + [free_port_run(4) + k for _ in range(16) for k in range(4)]
    assert len(set(ports[:64])) == 64
    assert not [port for port in ports if low <= port <= high], (low, high)
    with socket.socket() as held:        # a port in use is never handed out
        held.bind(("127.0.0.1", ports[0]))
        assert ports[0] not in free_ports(2000)
