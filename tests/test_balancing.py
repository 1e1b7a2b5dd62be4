"""gRPC requests spread over two real servers, per request, and none lost when one of them dies.

Two real Triton servers (one instance of the custom model each, so that two fit the CI machine's
cores) listen on 127.0.0.1 and 127.0.0.2, on the same ports, with `--grpc-max-connection-age`
as the Kubernetes Deployment sets it (shortened, so that connections are closed and re-opened
during the test). They are reached in the two ways the deployment offers:
- client-side: one client channel for "127.0.0.1:P,127.0.0.2:P" (gRPC's round_robin policy and
  the retry policy of client/resnet_client.py, grpc_channel);
- through Debian's nginx running deploy/nginx/nginx.conf (docker-compose.yml's balancer) with its
  upstream servers and listen port replaced.
Each server's share of the requests is read from its own counters (Triton's metrics). Then one
server is killed (SIGKILL, in the middle of the load): a retry policy can save every request of
that moment, since the other server is up, so none may fail. The kill comes once every load thread
has been answered and the victim has taken requests of this load (its own counter); the load goes
on until every thread has been answered a number of times after the kill (by the survivor alone),
and for at least a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fusedresnet.backend.network import free_ports, port_is_free
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import MODEL_CUSTOM, NUM_CLASSES
from fusedresnet.backend.triton_server.installation import find_triton, private_backend_tree
from fusedresnet.campaigns.serving_sequence import repository_with_instances
from fusedresnet.client.resnet_client import ResNetClient, check_endpoints, grpc_target
from fusedresnet.loadtest import triton_metrics

from robustness_helpers import read_until

ROOT = Path(__file__).resolve().parent.parent
NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"
HOSTS = ("127.0.0.1", "127.0.0.2")
CONNECTION_AGE_MS, CONNECTION_AGE_GRACE_MS = 2000, 10000
REQUESTS = 40
SHARE_RANGE = (0.4, 0.6)     # the issue: each of two servers takes 40-60% of the requests
BEFORE_KILL_ANSWERS = 5      # each load thread's answers before the kill: every way's connections are up
AFTER_KILL_ANSWERS = 5       # and after it, when only the survivor answers (4 s gave each 3-4 on the 2-core host)
LOAD_AFTER_KILL_S = 4.0      # and for at least this long after it, whatever the machine's speed (nothing is
                             # asserted on what it holds: a fast host sends more requests through the failure)
LOAD_DEADLINE_S = 120.0      # for either count (a busy host is slow, not wrong)


def needs(program: str):
    if shutil.which(program) is None and os.environ.get("CI") != "true":
        pytest.skip(f"{program} is not installed (.ci/apt-packages/balancing)")


@pytest.fixture(scope="module")
def one_instance_repository(prepared_repository, tmp_path_factory):
    repository = repository_with_instances(prepared_repository, 1, tmp_path_factory.mktemp("balancing") / "models",
                                           entries=(MODEL_CUSTOM,))
    return repository


def same_free_ports(count: int) -> list[int]:
    """Ports free on both loopback addresses, so the servers differ by address alone."""
    for _ in range(20):
        ports = free_ports(count)
        if all(port_is_free(port, HOSTS[1]) for port in ports):
            return ports
    raise RuntimeError(f"no {count} ports free on both {HOSTS}")


@pytest.fixture(scope="module")
def servers(one_instance_repository, admin_token, tmp_path_factory):
    logs = tmp_path_factory.mktemp("balancing-logs")
    http_port, grpc_port, metrics_port = same_free_ports(3)
    settings = [ServerSettings(one_instance_repository, host, http_port, grpc_port, metrics_port, processes_per_gpu=1,
                               admin_token=admin_token, log_file=logs / f"server-{host}.log", mps="off",
                               triton_args=[f"--grpc-max-connection-age={CONNECTION_AGE_MS}",
                                            f"--grpc-max-connection-age-grace={CONNECTION_AGE_GRACE_MS}"])
                for host in HOSTS]
    started, errors = [None] * len(settings), []   # in the order of HOSTS

    def start(index: int):
        try:
            started[index] = launch(settings[index])
        except Exception as error:  # reported below, after both have had their chance
            errors.append(error)

    private_backend_tree(find_triton())   # the backend copy both servers use, made once, before they start together
    threads = [threading.Thread(target=start, args=(index,)) for index in range(len(settings))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        if errors:
            raise errors[0]
        yield started
    finally:
        for server in started:
            if server is not None:
                server.stop()


def nginx_config(upstreams: list[str], listen: str, scratch: Path) -> str:
    """deploy/nginx/nginx.conf with the test's servers, listen address and writable paths."""
    text = NGINX_CONF.read_text()
    servers = re.findall(r"^\s*server \S+:\d+[^;\n]*;\n", text, re.M)
    assert len(servers) >= 2, "the balancer's upstream lists one server per GPU"
    options = servers[0].split(None, 2)[2].strip()          # e.g. "max_fails=1 fail_timeout=5s;"
    indent = servers[0][:len(servers[0]) - len(servers[0].lstrip())]
    text = text.replace("".join(servers), "".join(f"{indent}server {u} {options}\n" for u in upstreams))
    text, listens = re.subn(r"listen \d+ http2;", f"listen {listen} http2;", text)
    assert listens == 1
    text = text.replace("pid /tmp/nginx.pid;", f"pid {scratch}/nginx.pid;")
    temp_paths = "".join(f"    {kind}_temp_path {scratch}/{kind};\n"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return text.replace("http {\n", "http {\n" + temp_paths, 1)


@pytest.fixture(scope="module")
def nginx(servers, tmp_path_factory):
    needs("nginx")
    scratch = tmp_path_factory.mktemp("nginx")
    (port,) = free_ports(1)
    config = scratch / "nginx.conf"
    config.write_text(nginx_config([s.grpc_url for s in servers], f"127.0.0.1:{port}", scratch))
    log = scratch / "error.log"
    checked = subprocess.run(["nginx", "-t", "-p", str(scratch), "-c", str(config), "-e", str(log)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(["nginx", "-p", str(scratch), "-c", str(config), "-e", str(log),
                                "-g", "daemon off;"], start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while port_is_free(port):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=15)


def client_side_url(servers) -> str:
    return ",".join(s.grpc_url for s in servers)


def counts(servers) -> list[float]:
    """Requests each server has answered for the custom model (its own counters)."""
    return [triton_metrics.requests_seen(triton_metrics.scrape(s.metrics_url), MODEL_CUSTOM) for s in servers]


def send(url: str, images, requests: int, stop: threading.Event | None = None,
         progress: list[int] | None = None) -> tuple[int, list[str]]:
    """`requests` one-image requests (or until `stop`), one at a time over one channel: (answered, errors).
    `progress` (a one-item list) counts the answers as they come."""
    answered, errors = 0, []
    with ResNetClient(MODEL_CUSTOM, "grpc", url, timeout_s=60) as client:
        for i in range(requests):
            if stop is not None and stop.is_set():
                break
            try:
                logits = client.infer(images[i % len(images)][None]).logits
                assert logits.shape == (1, NUM_CLASSES)
                answered += 1
                if progress is not None:
                    progress[0] = answered
            except Exception as error:  # every failure is counted, with its message
                errors.append(str(error)[:300])
    return answered, errors


def counts_settled(servers, expected_total: float, timeout_s: float = 10.0) -> list[float]:
    """counts(servers) once their sum reaches `expected_total`, or after `timeout_s` (read_until)."""
    return read_until(lambda: counts(servers), lambda now: sum(now) >= expected_total, timeout_s)


def assert_spread(servers, before: list[float], requests: int):
    after = counts_settled(servers, sum(before) + requests)
    taken = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(taken) == requests, taken
    shares = [t / requests for t in taken]
    assert all(SHARE_RANGE[0] <= share <= SHARE_RANGE[1] for share in shares), \
        f"shares {shares} of {requests} requests; each server must take 40-60%"


def test_endpoint_lists_become_grpc_targets():
    assert grpc_target("127.0.0.1:8001") == "127.0.0.1:8001"
    assert grpc_target("127.0.0.1:8001,127.0.0.2:8001") == "ipv4:127.0.0.1:8001,127.0.0.2:8001"
    assert grpc_target(" localhost:8001 , 127.0.0.2:9001") == "ipv4:127.0.0.1:8001,127.0.0.2:9001"
    assert grpc_target("[::1]:8001,[::1]:8002") == "ipv6:[::1]:8001,[::1]:8002"
    assert grpc_target("dns:///fusedresnet-headless:8001") == "dns:///fusedresnet-headless:8001"
    for bad in ("127.0.0.1:8001,[::1]:8001", "127.0.0.1,127.0.0.2:8001"):
        with pytest.raises(ValueError):
            grpc_target(bad)
    with pytest.raises(ValueError, match="only gRPC"):
        check_endpoints("http", "127.0.0.1:8000,127.0.0.2:8000")
    with pytest.raises(ValueError, match="shared memory"):
        check_endpoints("grpc", "dns:///fusedresnet-headless:8001", "system")


def test_one_client_channel_spreads_requests_over_both_servers(servers, varied_images):
    before = counts(servers)
    answered, errors = send(client_side_url(servers), varied_images, REQUESTS)
    assert (answered, errors) == (REQUESTS, [])
    assert_spread(servers, before, REQUESTS)


def test_nginx_grpc_pass_spreads_requests_over_both_servers(servers, nginx, varied_images):
    before = counts(servers)
    answered, errors = send(nginx, varied_images, REQUESTS)
    assert (answered, errors) == (REQUESTS, [])
    assert_spread(servers, before, REQUESTS)


def test_killing_one_server_fails_no_request(servers, nginx, varied_images):
    """Last in this module: it kills the second server."""
    survivor, victim = servers
    stop = threading.Event()
    results: dict[str, tuple[int, list[str]]] = {}
    names = [f"{way} {i}" for way in ("client-side", "nginx") for i in range(2)]
    progress = {name: [0] for name in names}

    def load(name, url):
        results[name] = send(url, varied_images, 10_000, stop, progress[name])

    def answered_now() -> dict[str, int]:
        return {name: answers[0] for name, answers in progress.items()}

    victim_at_start = counts([victim])[0]
    threads = [threading.Thread(target=load, args=(name, client_side_url(servers) if "client" in name else nginx))
               for name in names]
    for thread in threads:
        thread.start()
    try:
        # The kill comes in the middle of the load: every thread answered, the victim taking its share
        before_kill, victim_before = read_until(
            lambda: (answered_now(), counts([victim])[0]),
            lambda now: min(now[0].values()) >= BEFORE_KILL_ANSWERS and now[1] > victim_at_start, LOAD_DEADLINE_S)
        assert victim_before > victim_at_start, "the second server took no requests of the load before it was killed"
        assert min(before_kill.values()) >= BEFORE_KILL_ANSWERS, f"the load had not started everywhere: {before_kill}"
        os.killpg(victim.first.process.pid, signal.SIGKILL)
        victim.first.process.wait()
        killed_at = time.monotonic()
        survivor_at_kill, at_kill = counts([survivor])[0], answered_now()
        # then every thread is answered again and again, by the survivor alone
        after_kill = read_until(lambda: {name: n - at_kill[name] for name, n in answered_now().items()},
                                lambda after: min(after.values()) >= AFTER_KILL_ANSWERS
                                and time.monotonic() - killed_at >= LOAD_AFTER_KILL_S, LOAD_DEADLINE_S, 0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    failed = {name: errors for name, (_, errors) in results.items() if errors}
    assert not failed, f"requests failed although the other server was up: {failed}"
    assert min(after_kill.values()) >= AFTER_KILL_ANSWERS, f"answers after the kill: {after_kill}"
    assert all(answered > 0 for answered, _ in results.values()), results
    # The answers after the kill were the survivor's (Triton counts a request just after its answer leaves; one
    # per thread may have been counted before survivor_at_kill was read, and answered after at_kill)
    least = survivor_at_kill + sum(after_kill.values()) - len(threads)
    survivor_now = read_until(lambda: counts([survivor])[0], lambda n: n >= least, 10.0)
    assert survivor_now > survivor_at_kill, "no request reached the surviving server after the kill"
    assert survivor_now >= least, f"the survivor counted {survivor_now - survivor_at_kill} requests after the " \
                                  f"kill, its clients were answered {after_kill}"
