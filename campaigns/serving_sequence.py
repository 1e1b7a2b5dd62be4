"""The serving path told as a sequence of single changes (docs/SERVING.md).

    python -m fusedresnet.campaigns.serving_sequence --shipped-tree build/shipped --out build/serving_sequence.json
    python -m fusedresnet.campaigns.serving_sequence --instances 1,2,4,8 --models resnet18_custom --out ...

Each configuration starts its own server through the launcher (`python -m
fusedresnet.backend.serve`) on a copy of the model repository with the instance
count set, drives it with the project's light load generator
(`loadtest/grpc_flood.py`: 1 image per request with many in flight, 32 images per
request, and one request in flight for latency) and keeps the step records, which
carry Triton's own figures (queue, compute input/infer/output, batch size, and the
phases inside the models' execute()) and the load generator's CPU use.

The sequence (each row adds one change to the row above):

    as shipped     the code before the serving-path work (`--shipped-tree`: an
                   extracted earlier commit), 1 instance per model
    + threads      the same with OMP_NUM_THREADS=1 in the server's environment
    + instances    the same with `--count` instances per model
    + copies       the current code (staging buffers, threads set by the models), same count
    + system shm   inputs and outputs in system shared memory
    + CUDA shm     inputs and outputs in CUDA shared memory

`--instances` instead measures the current code at several instance counts,
`--queue-delays` at several dynamic-batching queue delays.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fusedresnet.backend.launcher import DEFAULT_READY_TIMEOUT_S, LaunchedServer, ServerSettings
from fusedresnet.backend.repository.copies import both, copy_repository, with_instances
from fusedresnet.backend.serve import READY_LINE
from fusedresnet.backend.spec import (
    AB_ROUTER_MODEL,
    MODEL_ENTRIES,
    MODEL_REPOSITORY,
    MODELS,
    model_config,
)
from fusedresnet.loadtest import grpc_flood
from fusedresnet.loadtest.sweep import describe_device

PACKAGE_DIRS = ("backend", "kernels", "client", "loadtest")


@dataclass
class Configuration:
    label: str
    instances: int
    shipped: bool = False            # run the earlier code of --shipped-tree
    env: dict = field(default_factory=dict)
    shared_memory: str = "none"
    queue_delay_us: int | None = None    # None: as the config says


@dataclass
class Load:
    images_per_request: int
    concurrency: int
    processes: int


def sequence(count: int) -> list[Configuration]:
    return [
        Configuration("as shipped", 1, shipped=True),
        Configuration("+ threads", 1, shipped=True, env={"OMP_NUM_THREADS": "1"}),
        Configuration(f"+ instances ({count})", count, shipped=True, env={"OMP_NUM_THREADS": "1"}),
        Configuration("+ copies", count),
        Configuration("+ system shm", count, shared_memory="system"),
        Configuration("+ CUDA shm", count, shared_memory="cuda"),
    ]


def repository_with_instances(source: Path, instances: int, destination: Path, queue_delay_us: int | None = None,
                              entries: tuple[str, ...] = MODEL_ENTRIES):
    """`source`'s model entries (`entries` of them) in `destination` with `instances` per network entry and the
    A/B router (and the networks' dynamic batchers' queue delay, when given); the prepared files (weights, labels,
    stamp) linked from the prepared repository of this tree (backend/repository/copies.py)."""
    def queue_delay(name, config):
        if queue_delay_us is not None and name in MODELS:   # the A/B router waits for nothing of its own
            config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us

    return copy_repository(source, destination, entries=entries, prepared=MODEL_REPOSITORY,
                           edit=both(with_instances(instances, (*MODELS, AB_ROUTER_MODEL)), queue_delay))


def shipped_environment(tree: Path, scratch: Path) -> dict:
    """PYTHONPATH that makes `fusedresnet` the earlier code of `tree` (its own layout: a fusedresnet/
    folder beside the package folders), ahead of the installed current code."""
    namespace = scratch / "shipped-path" / "fusedresnet"
    namespace.mkdir(parents=True)
    shutil.copy(tree / "fusedresnet" / "__init__.py", namespace / "__init__.py")
    for name in PACKAGE_DIRS:
        (namespace / name).symlink_to((tree / name).resolve())
    return {"PYTHONPATH": os.pathsep.join([str(namespace.parent), os.environ.get("PYTHONPATH", "")]).rstrip(":")}


def start_server(repository: Path, token_file: Path, log_file: Path, env: dict | None = None, cwd: Path | None = None,
                 gpus: str | None = None, cores=None, ready_line: str | None = READY_LINE) -> LaunchedServer:
    """The launcher for one configuration (--no-restart: a crash is a failed measurement), ready; its output
    beside `log_file` (.out). `ready_line`: None for earlier code (--shipped-tree) that may print none."""
    settings = ServerSettings(model_repository=repository, gpus=gpus, log_file=log_file, admin_token_file=token_file,
                              restart=False)
    return LaunchedServer(settings, log_file.with_suffix(".out"), env=env, cwd=cwd, cores=cores,
                          ready_line=ready_line).start(DEFAULT_READY_TIMEOUT_S)


def measure(configuration: Configuration, loads: list[Load], models: list[str], tree: Path, shipped: Path | None,
            scratch: Path, token_file: Path, seconds: float, log_dir: Path) -> list[dict]:
    code_tree = shipped if configuration.shipped else tree
    source = code_tree / "model_repository"
    repository = repository_with_instances(source, configuration.instances,
                                           scratch / f"repo-{secrets.token_hex(4)}", configuration.queue_delay_us)
    env = dict(configuration.env)
    if configuration.shipped:
        env.update(shipped_environment(shipped, scratch / secrets.token_hex(4)))
    slug = "".join(c if c.isalnum() else "_" for c in configuration.label).strip("_")
    server = start_server(repository, token_file, log_dir / f"server_{slug}.log", env, code_tree,
                          ready_line=None if configuration.shipped else READY_LINE)
    records = []
    try:
        for model in models:
            for load in loads:
                print(f"== {configuration.label}: {model}, {load.images_per_request} image(s)/request, "
                      f"{load.concurrency} in flight", flush=True)
                try:
                    record = grpc_flood.run_step(
                        model, server.url, server.metrics_url, load.concurrency, load.images_per_request,
                        processes=load.processes, measure_s=seconds, shared_memory=configuration.shared_memory,
                        admin_token=token_file.read_text().strip())
                except Exception as error:   # one failing step is reported, the others still run
                    record = {"model": model, "images_per_request": load.images_per_request,
                              "concurrency": load.concurrency, "error": str(error)}
                delay = model_config(model, repository).dynamic_batching.max_queue_delay_microseconds
                record.update({"configuration": configuration.label, "instances": configuration.instances,
                               "max_queue_delay_us": delay,
                               "code": "shipped" if configuration.shipped else "current",
                               "server_env": configuration.env})
                print(json.dumps({k: record.get(k) for k in (
                    "img_per_s", "p50_ms", "p99_ms", "max_ms", "avg_batch", "queue_us", "compute_infer_us",
                    "execute_engine_us", "gpu_utilization", "client_cpu_percent", "error")}), flush=True)
                records.append(record)
    finally:
        server.stop()
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shipped-tree", type=Path, help="the earlier code (an extracted commit) for the first rows")
    parser.add_argument("--count", type=int, default=4, help="instances per model from '+ instances' on")
    parser.add_argument("--instances", help="comma-separated counts: measure the current code at each instead")
    parser.add_argument("--queue-delays", help="comma-separated max_queue_delay_microseconds: measure the current "
                                               "code (instances as configured) at each instead")
    parser.add_argument("--only", help="comma-separated labels of the sequence to run (default: all)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement window of each step")
    parser.add_argument("--processes", type=int, default=4, help="load-generator processes for the loaded steps")
    parser.add_argument("--out", type=Path, required=True, help="JSON file of the step records")
    parser.add_argument("--log-dir", type=Path, help="servers' logs (default: beside --out, named after it)")
    args = parser.parse_args(argv)

    tree = MODEL_REPOSITORY.parent
    loads = [Load(1, 1, 1), Load(1, 256, args.processes), Load(32, 64, args.processes)]
    configured = model_config(MODELS[0]).instance_group[0].count
    if args.instances:
        configurations = [Configuration(f"current, {n} instance(s)", int(n)) for n in args.instances.split(",")]
    elif args.queue_delays:
        configurations = [Configuration(f"current, queue delay {d} us", configured, queue_delay_us=int(d))
                          for d in args.queue_delays.split(",")]
    else:
        configurations = sequence(args.count)
        if not args.shipped_tree:
            configurations = [c for c in configurations if not c.shipped]
        if args.only:
            wanted = set(args.only.split(","))
            configurations = [c for c in configurations if c.label.split(" (")[0] in wanted]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = args.log_dir or args.out.with_suffix("")
    log_dir.mkdir(parents=True, exist_ok=True)
    records = []
    with tempfile.TemporaryDirectory(prefix="serving-sequence-") as scratch:
        token_file = Path(scratch) / "admin-token"
        token_file.write_text(secrets.token_hex(24))
        token_file.chmod(0o600)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        for configuration in configurations:
            records += measure(configuration, loads, args.models.split(","), tree, args.shipped_tree,
                               Path(scratch), token_file, args.seconds, log_dir)
            args.out.write_text(json.dumps({"device": describe_device(), "started_at": started,
                                            "command": " ".join(sys.argv),
                                            "steps": records}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
