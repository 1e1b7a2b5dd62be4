"""Soak: minutes of mixed valid and invalid traffic at a steady load, with the server's memory
sampled (RSS of tritonserver and its Python stubs; GPU memory where there is a GPU).

Passes when no valid request failed or was wrong, every invalid one got its clear refusal,
and memory over the second half of the run grew by no more than MEMORY_GROWTH_BOUND. The
first half is warm-up: on the CPU the stubs' RSS climbs in steps for minutes (caches that fill
as the dynamic batcher forms batches of new sizes), then flattens. The measured runs are in
docs/ROBUSTNESS.md and results/robustness_soak.md.

    FUSEDRESNET_SOAK_SECONDS=300 FUSEDRESNET_RESULTS_DIR=results \
        python -m pytest tests/test_soak.py      # the long run whose figures are in results/

With FUSEDRESNET_SOAK_LOAD=CONCURRENCY[/IMAGES] the project's load generator (loadtest/grpc_flood.py,
4 processes) also keeps that many requests in flight to resnet18_custom for the whole soak, so
that memory is watched under a real load (the GPU host runs it at half the peak); none of its
requests may fail.
"""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest

from fusedresnet.backend.spec import INPUT_FP32, MODEL_CUSTOM, MODELS, served_model
from fusedresnet.client.preprocess import normalize
from fusedresnet.loadtest.measurements import gpu_memory_used_mib

from bad_requests import BAD_REQUESTS, CHW, assert_clear_refusal, send_bad
from robustness_helpers import (
    assert_correct,
    client,
    infer_image,
    raw_grpc_infer,
    record,
    results_dir,
    server_rss_bytes,
)

SOAK_SECONDS = float(os.environ.get("FUSEDRESNET_SOAK_SECONDS", "45"))
SOAK_LOAD = os.environ.get("FUSEDRESNET_SOAK_LOAD")   # CONCURRENCY[/IMAGES]: background load, see above
WARM_UP_FRACTION = 0.5            # memory is compared from the end of the warm-up to the end of the run
SAMPLE_EVERY_S = 2.0
MIB = 1 << 20
# Allowed growth of total server RSS over the second half: allocator noise plus a few in-flight
# batches (a 128-image FP32 batch is 77 MB), but far below a leak of one input per request.
MEMORY_GROWTH_BOUND = {"rss_mib": 128, "rss_fraction": 0.10, "gpu_mib": 256}
CLIENTS = ("grpc", "grpc", "http")
INVALID_SHARE = 0.25
PACE_S = 0.02                     # pause between a client's requests: a steady load, not an overload


@pytest.fixture(scope="module")
def pool(varied_images, reference_logits):
    images = varied_images[:16]
    return images, reference_logits(images), np.stack([normalize(image) for image in images])


def test_soak_mixed_traffic_keeps_every_valid_answer_correct_and_memory_bounded(triton_server, pool,
                                                                                tmp_path_factory):
    images, reference, normalized = pool
    cheap_bad = [b for b in BAD_REQUESTS if sum(len(p or b"") for *_, p in b.inputs) < (1 << 20)]
    server_pid = triton_server.process.pid
    tally = {"valid_ok": 0, "valid_failed": [], "invalid_refused": 0, "invalid_wrong": []}
    lock = threading.Lock()
    stop = threading.Event()
    started = time.monotonic()

    def client_loop(worker: int, protocol: str):
        rng = random.Random(worker)
        with client(triton_server, protocol) as triton:
            while not stop.is_set() and time.monotonic() - started < SOAK_SECONDS + 30:
                model = MODELS[rng.randrange(2)]
                if rng.random() < INVALID_SHARE:
                    bad = rng.choice([b for b in cheap_bad if protocol in b.protocols])
                    status, message = send_bad(triton_server, protocol, model, bad)
                    try:
                        assert_clear_refusal(bad, protocol, status, message)
                        with lock:
                            tally["invalid_refused"] += 1
                    except AssertionError as wrong:
                        with lock:
                            tally["invalid_wrong"].append(str(wrong)[:200])
                else:
                    first, count = rng.randrange(len(images) - 4), rng.randint(1, 4)
                    try:
                        if rng.random() < 0.2:  # IMAGE_NORMALIZED over raw gRPC
                            status, answer = raw_grpc_infer(triton_server, served_model(model, INPUT_FP32),
                                                            [(INPUT_FP32, "FP32", [count, *CHW])],
                                                            [normalized[first:first + count].tobytes()])
                            assert status == "OK", answer
                            logits = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(count, -1)
                        else:
                            logits = infer_image(triton, protocol, model, images[first:first + count])
                        assert_correct(logits, reference[first:first + count])
                        with lock:
                            tally["valid_ok"] += 1
                    except Exception as error:  # recorded, and the test fails on any
                        with lock:
                            tally["valid_failed"].append(f"{protocol} {model}: {str(error)[:200]}")
                time.sleep(PACE_S)

    threads = [threading.Thread(target=client_loop, args=(i, p), daemon=True) for i, p in enumerate(CLIENTS)]
    background = {}
    if SOAK_LOAD:
        from fusedresnet.loadtest import grpc_flood
        concurrency, _, per_request = SOAK_LOAD.partition("/")

        def flood():
            background["step"] = grpc_flood.run_step(
                MODEL_CUSTOM, triton_server.grpc_url, triton_server.metrics_url, int(concurrency),
                int(per_request or 1), processes=4, warmup_s=1.0, measure_s=SOAK_SECONDS)
        threads.append(threading.Thread(target=flood, daemon=True))
    for thread in threads:
        thread.start()
    samples = []   # (seconds since start, total RSS bytes, per-process RSS, GPU MiB)
    while time.monotonic() - started < SOAK_SECONDS:
        rss = server_rss_bytes(server_pid)
        samples.append((time.monotonic() - started, sum(rss.values()), rss, gpu_memory_used_mib()))
        time.sleep(SAMPLE_EVERY_S)
    stop.set()
    for thread in threads:
        thread.join(timeout=150)
    assert not any(thread.is_alive() for thread in threads), "a soak client hung"
    elapsed = time.monotonic() - started
    rss = server_rss_bytes(server_pid)
    samples.append((elapsed, sum(rss.values()), rss, gpu_memory_used_mib()))

    warm = [s for s in samples if s[0] >= WARM_UP_FRACTION * SOAK_SECONDS]
    baseline, final = warm[0], samples[-1]
    growth_mib = (final[1] - baseline[1]) / MIB
    peak_growth_mib = (max(s[1] for s in warm) - baseline[1]) / MIB
    gpu_growth = None if baseline[3] is None or final[3] is None else final[3] - baseline[3]
    figures = {
        "seconds": round(elapsed, 1), "clients": list(CLIENTS), "invalid_share": INVALID_SHARE,
        "valid_ok": tally["valid_ok"], "valid_failed": len(tally["valid_failed"]),
        "invalid_refused": tally["invalid_refused"], "invalid_wrong": len(tally["invalid_wrong"]),
        "requests_per_s": round((tally["valid_ok"] + tally["invalid_refused"]) / elapsed, 1),
        "rss_mib_after_warm_up": round(baseline[1] / MIB, 1), "rss_mib_end": round(final[1] / MIB, 1),
        "rss_growth_mib": round(growth_mib, 1), "rss_peak_growth_mib": round(peak_growth_mib, 1),
        "warm_up_fraction": WARM_UP_FRACTION,
        "rss_growth_mib_after_first_quarter": round(
            (final[1] - [s for s in samples if s[0] >= SOAK_SECONDS / 4][0][1]) / MIB, 1),
        "rss_mib_per_process_end": {k: round(v / MIB, 1) for k, v in final[2].items()},
        # which process grows: each process's RSS after the warm-up and at the end
        "rss_growth_mib_per_process": {k: round((v - baseline[2].get(k, 0)) / MIB, 1) for k, v in final[2].items()},
        "gpu_mib_after_warm_up": baseline[3], "gpu_mib_end": final[3], "gpu_growth_mib": gpu_growth,
        "bound": MEMORY_GROWTH_BOUND,
        "background_load": None if not background.get("step") else {
            key: background["step"].get(key) for key in (
                "concurrency", "images_per_request", "img_per_s", "p50_ms", "p99_ms", "max_ms", "sent",
                "succeeded", "failures", "avg_batch", "gpu_utilization", "client_cpu_percent", "error_examples")},
        "rss_mib_samples": [[round(t, 1), round(b / MIB, 1)] for t, b, _, _ in samples],
        # per process, one sample in ten (the growth curve of each: levelling off or a steady leak)
        "rss_mib_per_process_samples": [[round(t, 1), {k: round(v / MIB, 1) for k, v in per.items()}]
                                        for t, _, per, _ in samples[::10] + samples[-1:]],
    }
    record(results_dir(tmp_path_factory), "soak", {f"soak_{int(SOAK_SECONDS)}s": figures})

    assert not tally["valid_failed"], tally["valid_failed"][:5]
    if SOAK_LOAD:
        assert background.get("step"), "the background load did not finish"
        assert background["step"]["failures"] == 0 and background["step"]["succeeded"] > 0, \
            background["step"]["error_examples"]
    assert not tally["invalid_wrong"], tally["invalid_wrong"][:5]
    assert tally["valid_ok"] >= 10 and tally["invalid_refused"] >= 3, figures
    allowed = max(MEMORY_GROWTH_BOUND["rss_mib"], MEMORY_GROWTH_BOUND["rss_fraction"] * baseline[1] / MIB)
    assert growth_mib <= allowed, f"server RSS grew {growth_mib:.0f} MiB after warm-up (bound {allowed:.0f})"
    if gpu_growth is not None:
        assert gpu_growth <= MEMORY_GROWTH_BOUND["gpu_mib"], figures
    with client(triton_server, "grpc") as triton:
        assert triton.is_server_live() and triton.is_server_ready()
