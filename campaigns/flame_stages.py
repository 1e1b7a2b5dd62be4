"""Where a request's CPU goes, stage by stage, from Linux perf's stacks (issue 46's stage table and flame graphs).

scripts/gpu_host_front_end.sh flame records, with `perf record --call-graph dwarf` (the CPU clock, 97 Hz per busy
thread), one in-process server process as shipped and its custom stubs while h2load sends custom at 32, then at 1
image/request, before the stubs' levers and after, with PYTHONPERFSUPPORT=1 (Python 3.12 names its functions to
perf: `py::execute:/path/model.py`). `collapse` turns `perf script -F comm,pid,tid,ip,sym,dso` into collapsed
stacks per process kind, `<code>_<kind>_<images>.collapsed` (kind: server, the process --server-pid names; stub:
every other), one stack per line, root first, frames `symbol (library)` separated by `;`, then its sample count, and
draws each as a flame graph (.svg). With DWARF unwinding a stack that runs Python ends at its innermost Python
function (Python 3.12's perf frames carry no unwind tables): the stage is still its innermost component's, but a
flame graph's roots are then partial.

A stack belongs to the component of its innermost frame that names one (COMPONENTS, by library or symbol):
`memcpy`, `libcuda` or the interpreter count for whoever called them. Triton's libraries keep only their C API's
symbols, so the component is the library: the 2.73 frontend (gRPC, protobuf, the request's handlers), Triton's
core, the Python backend; within the frontend and the core, a stack through a response's functions
(RESPONSE_MARKERS) is the response. A stage's share of a process kind's samples times that kind's CPU per image
measured without the profiler (front_door's thread pools) gives its µs of CPU per image. py-spy cannot do this:
it samples only threads that hold a Python state (none of Triton's), and its pauses crashed the server
(results/serving_cost.md, its notes).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

SAMPLE_RATE_HZ = 97   # perf record -F and its window (s), which scripts/gpu_host_front_end.sh flame reads here
SAMPLE_SECONDS = 8
STUB_COMM = "triton_python_b"   # the stubs' threads' name (triton_python_backend_stub, cut to 15 characters)

# stage names, as the issue lists the path of a request
GRPC = "gRPC receive and parse (the 2.73 frontend's reads, protobuf, the request's inputs)"
CORE = "Triton's core: the request, its input buffers, the scheduler and batcher"
PYTHON_BACKEND = "the Python backend's shared-memory messages and copies (in the server)"
RESPONSE = "the response and its outputs (the frontend's allocator and reply, the core's response)"
SERVER_PYTHON = "the in-process server's Python (inprocess_server.py, the bindings)"
STUB_MESSAGES = "the stub's messages: its shared-memory IPC, pb_utils tensors, DLPack"
STUB_MODEL = "the stub's model: model.py, the engine, torch, CuPy, the copy to the GPU, the wait"
OTHER = "other: stacks with no frame of ours or Triton's (libc, the kernel, the interpreter alone)"

# (component, pattern on one frame), the first that matches a frame names it; frames that match none (libc,
# libstdc++, libcuda, the interpreter, raw addresses of unknown libraries) pass to their caller
COMPONENTS = {
    "server": (
        # the in-process frontend's library; the 2.51 binary (tritonserver) holds its gRPC and HTTP frontends
        (GRPC, re.compile(r"[(/]tritonfrontend_bindings|\(tritonserver\)|\(libgrpc|\(libprotobuf|\bgrpc_core::"
                          r"|\bgrpc::")),
        (CORE, re.compile(r"\(libtritonserver")),
        (PYTHON_BACKEND, re.compile(r"\(libtriton_python\.so")),
        (SERVER_PYTHON, re.compile(r"^py::|\(libpython|\(python3|\(triton_bindings")),
    ),
    "stub": (
        (STUB_MESSAGES, re.compile(r"triton::backend::python::|\(triton_python_backend_stub\)|boost::interprocess"
                                   r"|triton_python_backend_utils|c_python_backend_utils|\(libtriton_python")),
        # a frame in unnamed executable memory (perf-<pid>.map without a symbol) is JIT code: oneDNN's kernels
        (STUB_MODEL, re.compile(r"[(/]libtorch|[(/]libc10|\(cupy|\(torch/|\(libnvrtc"
                                r"|^py::(?!.*triton_python_backend_utils)|^\[unknown\] \(perf-\d+\.map\)")),
    ),
}
# a response's functions in the frontend and the core (their names with template arguments taken out): a stack
# through one of them that ends in the frontend or the core is the response
RESPONSE_MARKERS = re.compile(r"InferResponseComplete|ResponseAlloc|OutputBufferQuery|ResponseRelease"
                              r"|InferenceResponse\b|ResponseFactory|ServerAsyncResponseWriter::Finish|SendMessage"
                              r"|SetInferenceResponse|TRITONSERVER_InferenceResponse|TRITONBACKEND_Response")
TEMPLATE_ARGUMENTS = re.compile(r"<[^<>]*>")


def without_template_arguments(frame: str) -> str:
    """`a::B<c::D<e>>::f` -> `a::B::f`: a response's types appear as template arguments of request handlers."""
    while True:
        stripped = TEMPLATE_ARGUMENTS.sub("", frame)
        if stripped == frame:
            return frame
        frame = stripped


PACKAGES = ("cupy", "cupy_backends", "torch", "tritonfrontend")   # a library inside one is named from the package


def short_library(path: str) -> str:
    """A library by its name (libc.so.6), or from its Python package down where it lies in one
    (cupy_backends/cuda/api/driver.cpython-312-x86_64-linux-gnu.so: the package says whose it is)."""
    parts = Path(path).parts
    package = next((i for i, part in enumerate(parts) if part in PACKAGES), len(parts) - 1)
    return "/".join(parts[package:])


def perf_stacks(lines, server_pid: int | None = None) -> dict[str, Counter]:
    """`perf script -F comm,pid,tid,ip,sym,dso` text -> process kind (server, stub) -> collapsed stack (root first)
    -> samples. Each sample: a line `comm pid/tid`, then one frame per line, leaf first: `address symbol (library)`;
    an inlined frame, `(inlined)`, takes the library of the frame it sits in. The kind: `server` for the process
    `server_pid`, `stub` for any other (threads of a stub carry other names too); without `server_pid`, by the
    thread's name (STUB_COMM)."""
    stacks: dict[str, Counter] = {}
    comm, pid, frames = None, None, []

    def flush():
        if comm is not None and frames:
            if server_pid is not None:
                kind = "server" if pid == server_pid else "stub"
            else:
                kind = "stub" if comm.startswith(STUB_COMM) else "server"
            libraries = [library for _, library in frames]
            for i in range(len(frames) - 2, -1, -1):   # an inlined frame sits in its caller-side neighbour's library
                if libraries[i] == "inlined":
                    libraries[i] = libraries[i + 1]
            named = [f"{symbol} ({short_library(library)})" for (symbol, _), library in zip(frames, libraries)]
            stacks.setdefault(kind, Counter())[";".join(reversed(named))] += 1

    for line in lines:
        if not line.strip():
            continue
        if not line[0].isspace():
            flush()
            comm, _, ids = line.strip().rpartition(" ")
            pid, frames = int(ids.split("/")[0]) if ids.split("/")[0].isdigit() else None, []
            continue
        parts = line.strip().split(" ", 1)
        symbol, _, library = (parts[1] if len(parts) > 1 else "[unknown]").rpartition(" (")
        frames.append((symbol.replace(";", ","), library.rstrip(")")))
    flush()
    return stacks


def read_collapsed(path: Path) -> Counter:
    """A collapsed-stacks file (or its gzip, `.collapsed.gz`, as results/ keeps them): stack (root first,
    `;`-separated) -> samples."""
    stacks: Counter = Counter()
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


def stage_of(stack: str, process: str) -> str:
    """The stage of one collapsed stack of a `process` ("server" or "stub")."""
    for frame in reversed(stack.split(";")):
        for stage, pattern in COMPONENTS[process]:
            if pattern.search(frame):
                if stage in (GRPC, CORE) and any(RESPONSE_MARKERS.search(without_template_arguments(f))
                                                  for f in stack.split(";")):
                    return RESPONSE
                return stage
    return OTHER


def stage_samples(stacks: Counter, process: str) -> Counter:
    spent: Counter = Counter()
    for stack, samples in stacks.items():
        spent[stage_of(stack, process)] += samples
    return spent


def file_key(path: Path) -> tuple[str, str, int]:
    """`<code>_<kind>_<images>.collapsed[.gz]` -> (code, kind, images)."""
    code, kind, images = path.name.split(".")[0].split("_")
    return code, kind, int(images)


def flame_runs(directory: Path) -> dict[tuple[str, int], dict[str, Counter]]:
    """(code, images per request) -> process kind -> stage -> samples (every stub of a kind summed)."""
    runs: dict[tuple[str, int], dict[str, Counter]] = {}
    for path in sorted([*directory.glob("*.collapsed"), *directory.glob("*.collapsed.gz")]):
        code, kind, images = file_key(path)
        runs.setdefault((code, images), {})[kind] = stage_samples(read_collapsed(path), kind)
    return runs


def served_img_per_s(directory: Path, code: str, images: int) -> float | None:
    path = directory / f"{code}_h2load_{images}.json"
    try:
        return float(json.loads(path.read_text())["img_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stage_table(directory: Path, measured_us: dict[tuple[str, int, str], float],
                sampled_fraction: float = 0.5) -> list[dict]:
    """One row per (code, process kind, stage): its samples and share at 1 and 32 images/request, and its CPU µs per
    image: the share times `measured_us[(code, images, kind)]` (the kind's CPU per image measured without the
    profiler) where given; and the profiler's own estimate, samples / rate per image the sampled processes served
    (`sampled_fraction` of h2load's: the shipped 2 server processes per GPU, 1 recorded, serve about half each)."""
    rows: dict[tuple[str, str, str], dict] = {}
    for (code, images), kinds in sorted(flame_runs(directory).items()):
        served = served_img_per_s(directory, code, images)
        for kind, spent in kinds.items():
            total = sum(spent.values())
            for stage, samples in spent.items():
                row = rows.setdefault((code, kind, stage), {"code": code, "process": kind, "name": stage})
                share = samples / total
                measured = measured_us.get((code, images, kind))
                row[f"samples_{images}"] = samples
                row[f"share_{images}"] = round(share, 4)
                row[f"cpu_us_per_image_{images}"] = None if measured is None else round(share * measured, 1)
                row[f"sampled_us_per_image_{images}"] = (
                    round(1e6 * samples / SAMPLE_RATE_HZ / (served * sampled_fraction * SAMPLE_SECONDS), 1)
                    if served else None)
    for row in rows.values():
        for images in (1, 32):
            for key in ("samples", "share", "cpu_us_per_image", "sampled_us_per_image"):
                row.setdefault(f"{key}_{images}", None)
    order = {"server": 0, "stub": 1}
    return sorted(rows.values(), key=lambda r: (r["code"] != "before", order.get(r["process"], 2),
                                                -(r["share_32"] or 0)))


def write_collapsed(stacks: Counter, path: Path) -> None:
    path.write_text("".join(f"{stack} {samples}\n" for stack, samples in stacks.most_common()))


def flame_svg(stacks: Counter, process: str, title: str, path: Path, min_share: float = 0.002) -> None:
    """A flame graph of collapsed `stacks` as SVG (matplotlib): the root at the bottom, each frame as wide as its
    samples, coloured by the stage its library or symbol names (grey: a frame that names none); frames narrower than
    `min_share` of the samples are left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = sum(stacks.values())
    tree: dict = {}
    for stack, samples in stacks.items():
        node = tree
        for frame in stack.split(";"):
            entry = node.setdefault(frame, [0, {}])
            entry[0] += samples
            node = entry[1]
    stages = [stage for stage, _ in COMPONENTS[process]] + [RESPONSE]
    colours = dict(zip(stages, plt.get_cmap("tab10").colors))
    figure, axes = plt.subplots(figsize=(16, 9))
    depth_max = 0

    def draw(node: dict, x: float, depth: int) -> None:
        nonlocal depth_max
        for frame, (samples, children) in sorted(node.items()):
            width = samples / total
            if width >= min_share:
                stage = next((stage for stage, pattern in COMPONENTS[process] if pattern.search(frame)), None)
                axes.add_patch(plt.Rectangle((x, depth), width, 0.95, color=colours.get(stage, "0.8"), lw=0))
                if width > 0.03:
                    axes.text(x + 0.002, depth + 0.45, frame[:int(width * 160)], fontsize=6, va="center",
                              clip_on=True)
                depth_max = max(depth_max, depth)
                draw(children, x, depth + 1)
            x += width

    draw(tree, 0.0, 0)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, depth_max + 1)
    axes.set_yticks([])
    axes.set_xlabel(f"share of {total:,} samples")
    axes.set_title(title, fontsize=9)
    axes.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colour) for colour in colours.values()],
                labels=list(colours), fontsize=6, loc="upper right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv=None) -> int:
    import argparse
    import gzip
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    collapse = commands.add_parser("collapse", help="perf script text (.gz or not) -> <prefix>_<kind>_<suffix>"
                                                    ".collapsed and .svg per process kind")
    collapse.add_argument("perf_script", type=Path)
    collapse.add_argument("--code", required=True, help="before | after")
    collapse.add_argument("--images", type=int, required=True, help="images per request of the recorded load")
    collapse.add_argument("--out", type=Path, required=True, help="folder of the collapsed stacks")
    collapse.add_argument("--server-pid", type=int, help="the server process's pid (its stubs: every other)")
    args = parser.parse_args(argv)
    opener = gzip.open if args.perf_script.suffix == ".gz" else open
    with opener(args.perf_script, "rt", errors="replace") as lines:
        stacks = perf_stacks(lines, args.server_pid)
    if not stacks:
        print(f"flame_stages: no stacks in {args.perf_script}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for kind, counted in stacks.items():
        name = f"{args.code}_{kind}_{args.images}"
        write_collapsed(counted, args.out / f"{name}.collapsed")
        flame_svg(counted, kind, f"{kind}, {args.code}, custom at {args.images} image(s)/request: "
                                 f"{sum(counted.values()):,} samples", args.out / f"{name}.svg")
        shares = stage_samples(counted, kind)
        total = sum(shares.values())
        print(f"{name}: " + "; ".join(f"{stage.split(':')[0].split(' (')[0]} {samples / total:.0%}"
                                      for stage, samples in shares.most_common()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
