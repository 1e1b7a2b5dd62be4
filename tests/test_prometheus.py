"""A real Prometheus scrapes a real server, and every query the deployment relies on returns data.

Debian's `prometheus` runs deploy/prometheus/prometheus.yml (the compose file's) with its target
replaced by the test server's metrics port, and with the `namespace` and `pod` labels that the
Prometheus operator's ServiceMonitor adds in Kubernetes (the adapter rule selects on them). The
server runs with the Triton flags of the Kubernetes Deployment (latency summaries on). Under a
steady load, every PromQL expression of the Grafana dashboard (its `$model` variable as "All",
`$__rate_interval` as Grafana sets it for the scrape interval) and the prometheus-adapter rule
behind the HPA (series query and metrics query, rendered as the adapter renders them) is asked
through Prometheus's HTTP API; one that returns nothing, or no finite value, fails the test with
its name. Triton's metrics endpoint needs no admin token (only its HTTP and gRPC APIs are
restricted), so Prometheus scrapes it as it is. The load goes through the A/B router (shadow mode), so the
router's panels have data, and the alert rules of deploy/prometheus/alerts.yml evaluate without error.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from triton_versions import flags_for_pip_triton

from fusedresnet.backend.network import free_ports, port_is_free
from fusedresnet.backend.serve import ServerSettings, launch
from fusedresnet.backend.spec import AB_ROUTER_MODEL, MODEL_CUDNN, MODEL_CUSTOM
from fusedresnet.campaigns.serving_sequence import repository_with_instances
from fusedresnet.client.resnet_client import ResNetClient

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
NAMESPACE, POD = "fusedresnet", "fusedresnet-ci-0"
ANSWER_DEADLINE_S = 120.0


def deployment_triton_args() -> list[str]:
    """The tritonserver flags (after `--`) of the Kubernetes Deployment's server container that this machine's
    Triton (the pip path's 2.51) knows: the image's newer Triton has more (triton_versions)."""
    deployment = yaml.safe_load((DEPLOY / "kubernetes" / "server-deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return flags_for_pip_triton(args[args.index("--") + 1:])


def seconds(duration: str) -> float:
    units = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    unit = next(u for u in ("ms", "s", "m", "h") if duration.endswith(u))
    return float(duration[:-len(unit)]) * units[unit]


def dashboard_queries(scrape_interval_s: float) -> dict[str, str]:
    """'panel title / refId' -> PromQL, with Grafana's variables as Grafana fills them in."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "fusedresnet.json").read_text())
    rate_interval = f"{int(4 * scrape_interval_s)}s"   # $__rate_interval: at least four scrape intervals
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate_interval).replace('"$model"', '".*"')
            assert "$" not in expr, f"a dashboard variable this test does not fill in: {expr}"
            queries[f"dashboard: {panel['title']} / {target['refId']}"] = expr
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            metric = variable["query"]["query"].removeprefix("label_values(").split(",")[0].strip()
            queries[f"dashboard variable ${variable['name']}"] = f"count by ({variable['name']}) ({metric})"
    return queries


def adapter_queries() -> dict[str, str]:
    """The prometheus-adapter rules' series and metrics queries, rendered for this pod."""
    values = yaml.safe_load((DEPLOY / "kubernetes" / "prometheus-adapter-values.yaml").read_text())
    queries = {}
    for rule in values["rules"]["custom"]:
        name = rule["name"]["as"]
        queries[f"adapter {name}: seriesQuery"] = rule["seriesQuery"]
        matchers = f'namespace="{NAMESPACE}",pod=~"{POD}"'
        queries[f"adapter {name}: metricsQuery"] = (rule["metricsQuery"].replace("<<.LabelMatchers>>", matchers)
                                                    .replace("<<.GroupBy>>", "pod"))
    return queries


@pytest.fixture(scope="module")
def monitored_server(prepared_repository, admin_token, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("prometheus-server")
    # The A/B router in shadow mode (as shipped) and both its arms: the load goes through it, so its panels
    # and alert rules have data too.
    repository = repository_with_instances(prepared_repository, 1, scratch / "models",
                                           entries=(MODEL_CUSTOM, MODEL_CUDNN, AB_ROUTER_MODEL))
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = ServerSettings(repository, "127.0.0.1", http_port, grpc_port, metrics_port, processes_per_gpu=1,
                              admin_token=admin_token, log_file=scratch / "server.log", mps="off",
                              triton_args=deployment_triton_args())
    with launch(settings) as group:
        yield group.first     # the tests read its GPU use


@pytest.fixture(scope="module")
def prometheus(monitored_server, tmp_path_factory):
    if shutil.which("prometheus") is None and os.environ.get("CI") != "true":
        pytest.skip("prometheus is not installed (.ci/apt-packages/prometheus)")
    scratch = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    target = monitored_server.metrics_url.removeprefix("http://").removesuffix("/metrics")
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [target], "labels": {"namespace": NAMESPACE, "pod": POD}}]
    (scratch / "prometheus.yml").write_text(yaml.safe_dump(config))
    for rule_file in config.get("rule_files", []):   # beside the config, as in the compose file's container
        shutil.copyfile(DEPLOY / "prometheus" / rule_file, scratch / rule_file)
    (port,) = free_ports(1)
    log = scratch / "prometheus.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(["prometheus", f"--config.file={scratch / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={scratch / 'data'}",
                                    f"--web.listen-address=127.0.0.1:{port}"],
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while port_is_free(port):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", seconds(config["global"]["scrape_interval"])
    finally:
        process.terminate()
        process.wait(timeout=30)


def api(base: str, path: str, **params) -> dict:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def answer_problem(base: str, name: str, query: str) -> str | None:
    """Why `query` gives no usable answer now (None: it returns data, every value finite)."""
    if name.endswith("seriesQuery"):
        found = api(base, "series", **{"match[]": query})
        return None if found else "no series"
    result = api(base, "query", query=query)["result"]
    if not result:
        return "no data"
    values = [float(r["value"][1]) for r in result]
    return None if all(math.isfinite(v) for v in values) else f"values {values}"


def test_every_dashboard_and_autoscaler_query_returns_data(monitored_server, prometheus, varied_images):
    base, scrape_interval_s = prometheus
    queries = {**dashboard_queries(scrape_interval_s), **adapter_queries()}
    if not monitored_server.use_gpu:   # Triton exports nv_gpu_* only where it has a GPU
        queries = {name: q for name, q in queries.items() if "nv_gpu_" not in q}
    stop = threading.Event()

    def load():
        with ResNetClient(AB_ROUTER_MODEL, "grpc", monitored_server.grpc_url) as client:
            while not stop.is_set():
                client.infer(varied_images[:2])

    loaders = [threading.Thread(target=load) for _ in range(2)]
    for thread in loaders:
        thread.start()
    problems = dict.fromkeys(queries, "not asked yet")
    try:
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while problems and time.monotonic() < deadline:
            time.sleep(scrape_interval_s)
            problems = {name: p for name, p in ((n, answer_problem(base, n, queries[n])) for n in problems) if p}
    finally:
        stop.set()
        for thread in loaders:
            thread.join(timeout=120)
    targets = api(base, "targets")["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    rules = [rule for group in api(base, "rules")["groups"] for rule in group["rules"]]
    assert rules and all(rule["health"] == "ok" for rule in rules), rules   # every alert rule evaluates
    assert not problems, "queries without data after a steady load:\n" + "\n".join(
        f"  {name}: {problem}\n    {queries[name]}" for name, problem in problems.items())
