"""Which front end the launcher serves through (backend/triton_server/front_end.py), and the in-process one's parts that
run here.

The in-process front end (Triton 2.73's frontends from the tritonfrontend wheel on the 2.51 core) needs glibc 2.38
and CPython 3.12: this machine and CI (Debian 12, glibc 2.36, Python 3.11) cannot load it, so here the launcher
must fall back to the binary and say why in one line, and `--front-end inprocess` must be refused with the reason.
What runs here of the in-process path: its shim compiles, every C++ entry point it imports is one that the
tritonfrontend 2.73.0 wheel's library exports (the wheel downloaded, its export table read with nm), and the server
program takes exactly the command line the launcher builds for it. Its serving is tested on the GPU host
(scripts/gpu_host_front_end.sh: these tests, the serving, security, client-abuse and front-door tests with
FUSEDRESNET_FRONT_END=inprocess).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fusedresnet.backend.serve import EXIT_SERVER_DIED, TritonServer
from fusedresnet.backend.spec import BUILD_DIR, MODEL_CUDNN, MODEL_CUSTOM
from fusedresnet.backend.triton_server import front_end, frontend_shim_build, inprocess_server
from fusedresnet.backend.triton_server.front_end import TRITONFRONTEND_VERSION, FrontEndChoice, choose_front_end
from fusedresnet.backend.triton_server.installation import ServerError, TritonInstallation, find_triton
from fusedresnet.campaigns.serving_sequence import repository_with_instances

ON_OLD_GLIBC = (front_end.glibc_version() or (0, 0)) < front_end.MIN_GLIBC


def launcher_run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusedresnet.backend.serve", *args], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.mark.skipif(not ON_OLD_GLIBC, reason="this machine's glibc can load the in-process front end")
def test_asking_for_the_in_process_front_end_where_it_cannot_load_is_refused_with_the_reason(monkeypatch):
    done = launcher_run("--front-end", "inprocess", "--http-port", "1", timeout_s=120)
    assert done.returncode == 1
    assert "--front-end inprocess: glibc" in done.stderr and "needs glibc 2.38 or later" in done.stderr, done.stderr
    # the same for every server the code starts, through the environment
    monkeypatch.setenv("FUSEDRESNET_FRONT_END", "inprocess")
    with pytest.raises(ServerError, match="--front-end inprocess: glibc"):
        TritonServer(http_port=1, grpc_port=2, metrics_port=3, admin_token="x").resolve_front_end(find_triton())


def test_client_shared_memory_refuses_several_processes_behind_one_port():
    done = launcher_run("--client-shared-memory", "--processes-per-gpu", "2", timeout_s=60)
    assert done.returncode == 1
    assert "--client-shared-memory serves one process per GPU" in done.stderr, done.stderr


def test_each_reason_the_in_process_front_end_cannot_serve_is_said(monkeypatch, tmp_path):
    """The checks in order, each one's reason in the choice's line; `binary` asked for is never probed."""
    assert choose_front_end("binary", {}).line() == \
        "fusedresnet: front end: the tritonserver binary: asked for (--front-end binary)"
    monkeypatch.setattr(front_end, "_WHY_NOT", {})
    monkeypatch.setattr(front_end, "glibc_version", lambda: (2, 39))
    monkeypatch.setattr(front_end, "installed_version", lambda: None)
    monkeypatch.setattr(front_end, "frontend_library", lambda: None)
    assert "the tritonfrontend wheel is not installed" in choose_front_end("auto", dict(os.environ)).why
    monkeypatch.setattr(front_end, "_WHY_NOT", {})
    monkeypatch.setattr(front_end, "installed_version", lambda: "2.74.0")
    monkeypatch.setattr(front_end, "frontend_library", lambda: tmp_path / "tritonfrontend_bindings.so")
    why = choose_front_end("auto", dict(os.environ)).why
    assert f"tritonfrontend 2.74.0 is installed; the shim declares the classes of {TRITONFRONTEND_VERSION}" in why
    # the right version, but a library that does not load here: the probe (a real child process) says why
    monkeypatch.setattr(front_end, "_WHY_NOT", {})
    monkeypatch.setattr(front_end, "installed_version", lambda: TRITONFRONTEND_VERSION)
    (tmp_path / "tritonfrontend_bindings.so").write_bytes(b"not a shared library")
    choice = choose_front_end("auto", dict(os.environ))
    assert choice == FrontEndChoice("binary", choice.why) and "its libraries do not load here: OSError" in choice.why
    with pytest.raises(ValueError, match="--front-end inprocess: its libraries do not load here"):
        choose_front_end("inprocess", dict(os.environ))


def test_the_in_process_server_takes_the_command_line_the_launcher_builds(tmp_path):
    """backend/triton_server/inprocess_server.py parses exactly what TritonServer.command gives it: the admin token's
    restrictions on both protocols, the shared ports, the Python backend's settings; a flag it does not know is
    refused."""
    server = TritonServer(http_port=8100, grpc_port=8101, metrics_port=8102, admin_token="tok", use_gpu=False,
                          shares_ports=True, front_end="inprocess",
                          front_end_choice=FrontEndChoice("inprocess", "test"), client_shared_memory=True)
    triton = TritonInstallation(tmp_path, [])
    command = server.command(triton, tmp_path / "backends")
    assert command[:3] == [sys.executable, "-m", "fusedresnet.backend.triton_server.inprocess_server"]
    args = inprocess_server.build_parser().parse_args(command[3:])
    assert (args.grpc_port, args.http_port, args.metrics_port) == (8101, 8100, 8102)
    assert args.reuse_grpc_port and args.reuse_http_port and args.allow_client_shm
    assert args.pinned_memory_pool_byte_size == 0 and args.disable_auto_complete_config
    categories, key, value = inprocess_server.one_restriction(args.grpc_restricted_protocol, "grpc")
    assert (categories, key, value) == ("model-repository,shared-memory,statistics,trace,logging", "admin-key", "tok")
    assert inprocess_server.one_restriction(args.http_restricted_api, "http") == (categories, key, value)
    assert [backend for backend, _, _ in args.backend_config] == ["python", "fusedresnet_ab"]
    # without --client-shared-memory, clients may not register regions
    server.client_shared_memory = False
    assert "--allow-client-shm=false" in server.command(triton, tmp_path / "backends")
    done = subprocess.run([sys.executable, "-m", "fusedresnet.backend.triton_server.inprocess_server", *command[3:],
                           "--grpc-use-ssl=true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unrecognized arguments: --grpc-use-ssl=true" in done.stderr
    assert "--front-end binary" in done.stderr


def wheel_library(folder: Path) -> Path:
    """The tritonfrontend wheel's frontend library: the installed one (the GPU host), else downloaded once into
    build/ (11 MB)."""
    if front_end.installed_version() == TRITONFRONTEND_VERSION and front_end.frontend_library() is not None:
        return front_end.frontend_library()
    library = folder / "tritonfrontend_bindings.so"
    if library.is_file():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_39_x86_64",
                    "-d", str(folder), f"tritonfrontend=={TRITONFRONTEND_VERSION}"], check=True, timeout=600)
    wheel = next(folder.glob("tritonfrontend-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.startswith("tritonfrontend/_c/tritonfrontend_bindings"))
        library.write_bytes(archive.read(name))
    return library


def symbols(library: Path, which: str) -> set[str]:
    out = subprocess.run(["nm", "-D", which, str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_the_shim_builds_and_imports_only_what_the_tritonfrontend_wheel_exports():
    shim = frontend_shim_build.build()
    imported = {s for s in symbols(shim, "--undefined-only") if s.startswith("_ZN6triton")}
    # every frontend class's entry point the shim calls: gRPC, HTTP, metrics, made, started, stopped; the trace manager
    assert len(imported) == 11, sorted(imported)
    exported = symbols(wheel_library(BUILD_DIR / f"tritonfrontend-{TRITONFRONTEND_VERSION}"), "--defined-only")
    assert imported <= exported, sorted(imported - exported)
    # its C interface, for backend/triton_server/inprocess_server.py
    assert {"fr_grpc_new", "fr_http_new", "fr_metrics_new", "fr_shared_memory_manager_new", "fr_grpc_graceful_stop",
            "fr_trace_manager_new"} <= symbols(shim, "--defined-only")


def test_a_server_process_that_crashes_in_process_is_seen_as_a_crash():
    """Python's fatal-error report (the in-process front end's crash) is a crash line, as Triton's own are."""
    from fusedresnet.backend.serve import CRASH_LINE
    assert CRASH_LINE.search(b"Fatal Python error: Segmentation fault")
    assert CRASH_LINE.search(b"Fatal Python error: Aborted")
    assert CRASH_LINE.search(b"Signal (11) received.")
    assert not CRASH_LINE.search(b"Signal (15) received.")
    assert EXIT_SERVER_DIED == 4


def test_the_frontend_extra_pins_the_release_the_shim_declares():
    import tomllib
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert project["project"]["optional-dependencies"]["frontend"] == [f"tritonfrontend=={TRITONFRONTEND_VERSION}"]


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load (nghttp2-client) is not installed")
def test_the_front_end_soak_drives_every_abuse_kind_and_both_kinds_of_valid_client(tmp_path, prepared_repository):
    """campaigns/front_end_soak.py for a few seconds against the launcher with `--front-end auto`, as a user starts
    it: the launcher says in one line which front end it took and why (here, on an old glibc, the binary); every
    abuse kind runs in every cycle without an error of its own; both the clients with retries and the plain ones
    send and are answered; the report has the fields of results/front_end.json."""
    from fusedresnet.campaigns import front_end_soak

    repository = repository_with_instances(prepared_repository, 1, tmp_path / "models",
                                           entries=(MODEL_CUSTOM, MODEL_CUDNN))
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "soak"
    front_end_soak.main(["--seconds", "10", "--front-ends", "auto", "--server-cores", str(cores[0]),
                         "--generator-cores", str(cores[-1]), "--valid-processes", "1", "--valid-in-flight", "2",
                         "--out", str(out), "--", "--model-repository", str(repository), "--exit-timeout", "5"])
    report = json.loads(out.with_suffix(".json").read_text())
    [binary] = report["front_ends"]   # auto: the binary here
    if ON_OLD_GLIBC:
        glibc = front_end.glibc_version()
        assert binary["front_end_line"] == (
            "fusedresnet: front end: the tritonserver binary: the in-process one cannot serve here: glibc "
            f"{glibc[0]}.{glibc[1]} here; the tritonfrontend wheel needs glibc 2.38 or later"), binary["front_end_line"]
    soak = binary["soak"]
    assert set(soak) >= {"duration_s", "valid_sent", "valid_failed_with_retries", "valid_failed_without_retries",
                         "capacity_zero_s", "crashes", "restarts", "abuse_cycles"}
    assert soak["abuse_cycles"] >= 1 and soak["valid_sent"] > 0
    cycle = binary["abuse_first_cycle"]
    for kind in front_end_soak.ABUSE_KINDS:
        assert kind in cycle and "error" not in cycle[kind], cycle
    work = Path(report["work_dir"]) / "auto"
    plain = json.loads((work / "valid_no_retries0.json").read_text())
    with_retries = json.loads((work / "valid_retries0.json").read_text())
    assert plain["answered"] > 0 and with_retries["statuses"].get("OK", 0) > 0


def test_the_levers_choose_the_setting_fastest_at_every_request_size_together():
    """campaigns/front_end_soak.best_setting, which scripts/gpu_host_front_end.sh uses to pick the in-process
    setting that the throughput run then measures: the highest geometric mean of custom's img/s at 1 and 32
    images/request over plain gRPC, shared-memory steps and other models left out."""
    from fusedresnet.campaigns.front_end_soak import best_setting

    def report(launcher_args, rows):
        return {"launcher_args": launcher_args, "layouts": [
            {"processes_per_gpu": p, "model": model, "shared_memory": shm, "images_per_request": images,
             "img_per_s": value} for p, model, shm, images, value in rows]}
    defaults = report("--front-end inprocess", [(1, MODEL_CUSTOM, False, 1, 100), (1, MODEL_CUSTOM, False, 32, 400),
                                                (2, MODEL_CUSTOM, False, 1, 300), (2, MODEL_CUSTOM, False, 32, 300),
                                                (2, MODEL_CUSTOM, True, 32, 9000), (2, MODEL_CUDNN, False, 32, 9000)])
    threads = report("--front-end inprocess -- --grpc-infer-thread-count=4",
                     [(1, MODEL_CUSTOM, False, 1, 150), (1, MODEL_CUSTOM, False, 32, 500)])
    # geometric means: 200, 300 (2 processes), ~273.9 (4 threads): 2 processes with the defaults
    assert best_setting([defaults, threads]) == (2, "--front-end inprocess", {1: 300, 32: 300})
    with pytest.raises(ValueError):
        best_setting([report("--front-end inprocess", [(1, MODEL_CUDNN, False, 1, 5)])])


def soak_report() -> dict:
    """A front_end_soak report of both front ends with every soak figure 0, for the results' tests."""
    from fusedresnet.campaigns.front_end_soak import SOAK_FIELDS

    entry = {"soak": dict.fromkeys(SOAK_FIELDS, 0)}
    return {"device": "d", "date": "t", "git_commit": "c", "server_cores": "0-11", "generator_cores": "12-15",
            "command": "front_end_soak --seconds 600", "pattern": "p",
            "front_ends": [{"name": "binary", **entry}, {"name": "inprocess", **entry}]}


def test_the_results_name_the_infer_threads_that_ran_and_the_ratio_at_every_point():
    """front_end_soak results: the in-process front end's gRPC infer threads from the launcher arguments the reports
    ran with (the code's default where none was given), and in-process over binary at each plain-gRPC point."""
    from fusedresnet.backend.triton_server.inprocess_server import GRPC_INFER_THREADS
    from fusedresnet.campaigns.front_end_soak import front_end_results, results_markdown

    soak = soak_report()

    def report(launcher_args, rows):
        return {"command": "front_door", "launcher_args": launcher_args, "layouts": [
            {"processes_per_gpu": 2, "model": MODEL_CUSTOM, "images_per_request": images, "shared_memory": shm,
             "img_per_s": value, "p50_ms": 1.0, "p99_ms": 2.0} for images, shm, value in rows]}
    binary = report("--front-end binary", [(1, False, 200.0), (32, False, 400.0), (32, True, 900.0)])
    inprocess = report("--front-end inprocess", [(1, False, 210.0), (32, False, 380.0)])
    results = front_end_results(soak, [binary, inprocess], [])
    threads = {f["name"]: f["infer_threads"] for f in results["front_ends"]}
    assert threads == {"binary-2.51": None, "inprocess": GRPC_INFER_THREADS}
    assert "| grpc | resnet18_custom | 1 | 2 | 1.05 |" in results_markdown(results)
    assert "| grpc | resnet18_custom | 32 | 2 | 0.95 |" in results_markdown(results)
    eight = report("--front-end inprocess -- --grpc-infer-thread-count=8", [(1, False, 210.0)])
    assert front_end_results(soak, [binary, eight], [])["front_ends"][1]["infer_threads"] == 8
    with pytest.raises(ValueError, match="different gRPC infer threads"):
        front_end_results(soak, [eight, report("--front-end inprocess -- --grpc-infer-thread-count=2", [])], [])

def test_throughput_measured_in_rounds_is_compared_by_its_medians():
    """front_end_soak results over two rounds of each front end: each point's median img/s, every round's figure
    kept in the order measured, and in-process over binary from the medians (220 / 190 at 1 image/request)."""
    from fusedresnet.campaigns.front_end_soak import front_end_results, results_markdown

    soak = soak_report()

    def report(front_end, img_per_s, p99_ms):
        return {"command": "front_door", "launcher_args": f"--front-end {front_end}", "date": "t", "git_commit": "c",
                "layouts": [{"processes_per_gpu": 2, "model": MODEL_CUSTOM, "images_per_request": 1,
                             "shared_memory": False, "img_per_s": img_per_s, "p50_ms": 1.0, "p99_ms": p99_ms}]}
    rounds = [report("binary", 200.0, 3.0), report("inprocess", 210.0, 2.0),
              report("inprocess", 230.0, 4.0), report("binary", 180.0, 5.0)]
    results = front_end_results(soak, rounds, [])
    rows = {f["name"]: f["throughput"] for f in results["front_ends"]}
    assert [(r["img_per_s"], r["img_per_s_rounds"], r["p99_ms"]) for r in rows["binary-2.51"]] == \
        [(190.0, [200.0, 180.0], 4.0)]
    assert [(r["img_per_s"], r["img_per_s_rounds"]) for r in rows["inprocess"]] == [(220.0, [210.0, 230.0])]
    markdown = results_markdown(results)
    assert "| grpc | resnet18_custom | 1 | 2 | 1.16 |" in markdown
    assert "210, 230" in markdown
    before = dict(report("inprocess", 150.0, 2.0), server_env=["FUSEDRESNET_HOST_INPUT=staging"])
    with pytest.raises(ValueError, match="not as shipped"):    # a profile's 'before' is not the front end's figure
        front_end_results(soak, [*rounds, before], [])


def test_the_inprocess_server_polls_grpc_unless_its_environment_says_otherwise():
    """gRPC's completion-queue polling (measured faster than its EventEngine threads, results/front_end.md);
    a GRPC_EXPERIMENTS of the environment is kept as given."""
    environment: dict[str, str] = {}
    assert inprocess_server.grpc_experiments(environment) == environment["GRPC_EXPERIMENTS"]
    assert set(environment["GRPC_EXPERIMENTS"].split(",")) == {
        "-event_engine_listener", "-event_engine_for_all_other_endpoints", "-event_engine_callback_cq"}
    mine = {"GRPC_EXPERIMENTS": "event_engine_listener"}
    assert inprocess_server.grpc_experiments(mine) == "event_engine_listener"
    assert mine == {"GRPC_EXPERIMENTS": "event_engine_listener"}
