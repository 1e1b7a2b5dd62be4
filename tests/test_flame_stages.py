"""campaigns/flame_stages.py: perf's stacks of the server and its stubs divided into the stages of a request."""

import json

import pytest

from fusedresnet.campaigns import flame_stages as fs

FRONTEND = "/site/tritonfrontend/_c/tritonfrontend_bindings.cpython-312-x86_64-linux-gnu.so"
# the frontend's request handler: a response writer among its template arguments
HANDLER = ("triton::server::grpc::InferHandler<inference::GRPCInferenceService, "
           "grpc::ServerAsyncResponseWriter<inference::ModelInferResponse> >::Process")
# `perf script -F comm,pid,tid,ip,sym,dso`: each sample a header, then its frames leaf first
PERF_SCRIPT = """\
python3 100/101
\t    1234 memcpy (/lib/x86_64-linux-gnu/libc.so.6)
\t    5678 [unknown] (/site/backends/python/libtriton_python.so)
\t    9abc triton::core::InferenceRequest::Run (/site/libs/libtritonserver-717102f0.so)
\t    def0 start_thread (/lib/x86_64-linux-gnu/libc.so.6)

python3 100/102
\t       1 grpc::internal::CallOpSet::FillOps (FRONTEND)
\t       2 HANDLER (FRONTEND)
\t       3 start_thread (/lib/x86_64-linux-gnu/libc.so.6)

python3 100/102
\t       1 grpc::internal::CallOpSet::FillOps (FRONTEND)
\t       2 HANDLER (FRONTEND)
\t       3 start_thread (/lib/x86_64-linux-gnu/libc.so.6)

python3 100/103
\t       1 google::protobuf::MessageLite::SerializeToArray (inlined)
\t       2 triton::server::grpc::InferResponseComplete<inference::ModelInferResponse> (FRONTEND)
\t       3 [unknown] (/site/libs/libtritonserver-717102f0.so)

python3 100/104
\t       1 __memmove_avx_unaligned_erms (/lib/x86_64-linux-gnu/libc.so.6)
\t       2 start_thread (/lib/x86_64-linux-gnu/libc.so.6)

triton_python_b 200/200
\t       1 cuLaunchKernel (/usr/lib/x86_64-linux-gnu/libcuda.so.1)
\t       2 [unknown] (/site/cupy_backends/cuda/api/driver.cpython-312-x86_64-linux-gnu.so)
\t       3 triton::backend::python::Stub::ProcessRequests (/site/backends/python/triton_python_backend_stub)

triton_python_b 200/200
\t       1 memcpy (/lib/x86_64-linux-gnu/libc.so.6)
\t       2 triton::backend::python::PbTensor::FromNumpy (/site/backends/python/triton_python_backend_stub)
\t       3 py::execute:/models/resnet18_custom/1/model.py (/tmp/perf-200.map)
""".replace("FRONTEND", FRONTEND).replace("HANDLER", HANDLER)


def test_perf_samples_become_stacks_of_each_process_kind_root_first():
    stacks = fs.perf_stacks(PERF_SCRIPT.splitlines())
    assert sum(stacks["server"].values()) == 5 and sum(stacks["stub"].values()) == 2
    assert stacks["server"]["start_thread (libc.so.6);triton::core::InferenceRequest::Run "
                            "(libtritonserver-717102f0.so);[unknown] (libtriton_python.so);memcpy (libc.so.6)"] == 1
    # the inlined protobuf frame lies in the frontend's library, the frame it was inlined into
    assert any(stack.endswith("SerializeToArray (tritonfrontend/_c/tritonfrontend_bindings.cpython-312-x86_64-linux-"
                              "gnu.so)") for stack in stacks["server"])


def test_a_stubs_threads_of_other_names_count_as_the_stubs_given_the_servers_pid():
    thread = "cuda-EvtHandlr 200/205\n\t       1 [unknown] (/usr/lib/x86_64-linux-gnu/libcuda.so.1)\n"
    lines = (PERF_SCRIPT + "\n" + thread).splitlines()
    by_pid = fs.perf_stacks(lines, server_pid=100)
    assert sum(by_pid["server"].values()) == 5 and sum(by_pid["stub"].values()) == 3
    by_name = fs.perf_stacks(lines)          # by the thread's name alone it would be the server's
    assert sum(by_name["server"].values()) == 6


def test_collapse_writes_each_kinds_stacks_and_flame_graph_and_fails_on_an_empty_recording(tmp_path):
    recording = tmp_path / "perf.txt"
    recording.write_text(PERF_SCRIPT)
    assert fs.main(["collapse", str(recording), "--code", "after", "--images", "32", "--out", str(tmp_path / "out"),
                    "--server-pid", "100"]) == 0
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "after_server_32.collapsed", "after_server_32.svg", "after_stub_32.collapsed", "after_stub_32.svg"]
    recording.write_text("")
    assert fs.main(["collapse", str(recording), "--code", "after", "--images", "1", "--out", str(tmp_path)]) == 1


def test_each_stack_goes_to_the_innermost_component_it_names_and_responses_apart():
    stacks = fs.perf_stacks(PERF_SCRIPT.splitlines())
    server = fs.stage_samples(stacks["server"], "server")
    # memcpy called by the Python backend is the backend's; the frontend's request handler is gRPC although a
    # response writer is among its template arguments; the frontend's response callback is the response; a
    # stack of libc alone is other
    assert server == {fs.PYTHON_BACKEND: 1, fs.GRPC: 2, fs.RESPONSE: 1, fs.OTHER: 1}
    stub = fs.stage_samples(stacks["stub"], "stub")
    # the CUDA driver called by CuPy is the model's; a pb_utils tensor made inside model.py is the messages'
    assert stub == {fs.STUB_MODEL: 1, fs.STUB_MESSAGES: 1}


def test_the_stage_table_scales_each_share_by_the_cpu_measured_without_the_profiler(tmp_path):
    stacks = fs.perf_stacks(PERF_SCRIPT.splitlines())
    for kind, counted in stacks.items():
        fs.write_collapsed(counted, tmp_path / f"after_{kind}_32.collapsed")
    (tmp_path / "after_h2load_32.json").write_text(json.dumps({"img_per_s": 1000.0}))
    rows = fs.stage_table(tmp_path, {("after", 32, "server"): 100.0, ("after", 32, "stub"): 50.0})
    by_name = {(row["process"], row["name"]): row for row in rows}
    grpc = by_name[("server", fs.GRPC)]
    assert grpc["samples_32"] == 2 and grpc["share_32"] == pytest.approx(0.4)
    assert grpc["cpu_us_per_image_32"] == pytest.approx(40.0)          # 2 of 5 server samples x 100 µs
    # the profiler's own estimate: 2 samples at 97 Hz over 8 s, half of 1,000 img/s served by the sampled process
    assert grpc["sampled_us_per_image_32"] == pytest.approx(1e6 * 2 / 97 / (1000 * 0.5 * 8), abs=0.05)
    assert by_name[("stub", fs.STUB_MODEL)]["cpu_us_per_image_32"] == pytest.approx(25.0)
    assert grpc["samples_1"] is None and grpc["cpu_us_per_image_1"] is None
    assert [row["code"] for row in rows] == ["after"] * len(rows)


def test_gzipped_collapsed_stacks_as_results_keeps_them_count_like_plain_ones(tmp_path):
    import gzip

    stacks = fs.perf_stacks(PERF_SCRIPT.splitlines())
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    for kind, counted in stacks.items():
        fs.write_collapsed(counted, plain / f"before_{kind}_1.collapsed")
        (packed / f"before_{kind}_1.collapsed.gz").write_bytes(
            gzip.compress((plain / f"before_{kind}_1.collapsed").read_bytes()))
    assert fs.file_key(packed / "before_server_1.collapsed.gz") == ("before", "server", 1)
    assert fs.flame_runs(packed) == fs.flame_runs(plain)
    assert sum(fs.flame_runs(packed)[("before", 1)]["server"].values()) == sum(stacks["server"].values()) > 0


def test_a_flame_graph_is_written_as_svg(tmp_path):
    stacks = fs.perf_stacks(PERF_SCRIPT.splitlines())
    fs.flame_svg(stacks["server"], "server", "test", tmp_path / "server.svg")
    text = (tmp_path / "server.svg").read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_serving_cost_adds_the_stages_of_perfs_stacks_scaled_by_the_thread_pools(tmp_path):
    """campaigns/serving_cost --flame: the server's thread pools measured 100 µs per image (10% of a core at 1,000
    img/s) and the stubs' 50, so the stages get their shares of those."""
    from fusedresnet.campaigns import serving_cost

    flame = tmp_path / "flame"
    flame.mkdir()
    for kind, counted in fs.perf_stacks(PERF_SCRIPT.splitlines()).items():
        fs.write_collapsed(counted, flame / f"after_{kind}_32.collapsed")
        fs.flame_svg(counted, kind, kind, flame / f"after_{kind}_32.svg")
    step = {"processes_per_gpu": 2, "model": "resnet18_custom", "images_per_request": 32, "shared_memory": False,
            "img_per_s": 1000.0, "server_cpu_percent": 15.0,
            "server_cpu_percent_by_thread": {"tritonserver/tritonserver": 10.0,
                                             "triton_python_backend_stub/triton_python_b": 5.0}}
    report = tmp_path / "profile.json"
    report.write_text(json.dumps({"device": "test", "date": "2026-12-02", "git_commit": "0" * 40,
                                  "server_cores": "0-11", "generator_cores": "12-15", "command": "front_door",
                                  "layouts": [step]}))
    out = tmp_path / "results" / "serving_cost.json"
    assert serving_cost.main(["--code", "after", "--report", f"inprocess={report}", "--flame", str(flame),
                              "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    by_name = {(row["process"], row["name"]): row for row in results["flame_stages"]}
    assert by_name[("server", fs.GRPC)]["cpu_us_per_image_32"] == pytest.approx(40.0)   # 2 of 5 x 100 µs
    assert by_name[("stub", fs.STUB_MESSAGES)]["cpu_us_per_image_32"] == pytest.approx(25.0)   # 1 of 2 x 50 µs
    assert results["flame_graphs"] == ["../flame/after_server_32.svg", "../flame/after_stub_32.svg"]
    assert "perf's stacks" in out.with_suffix(".md").read_text()
