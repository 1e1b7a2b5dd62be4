"""Which fusedresnet package may import which: the kernel library stands alone, nothing imports the harness.

    fusedresnet.kernels   the CUDA kernels, their launchers, plans and tuning: imports no other fusedresnet package
    fusedresnet.harness   checks and times the kernels and the whole network: uses kernels, backend and client;
                          no package imports it
    fusedresnet.client    what a user's program needs to call the server: imports backend only, never loadtest or
                          campaigns (the load-testing tool and our measurement campaigns)
    fusedresnet.loadtest  the load-testing tool a user runs: never imports campaigns
    fusedresnet.campaigns the project's own measurement campaigns: no package imports them
    and no module imports itself back through others (no import cycle, lazy imports inside functions included)

and, inside the packages, the arrows of the server's rooms (issue 47):

    backend.triton_server      finds and prepares Triton: never the A/B router's build (the launcher builds the
                               router only where its repository serves it, lazily)
    backend.admin_token        the token's resolver, which the clients use too: neither the Triton installation nor
                               the launcher (its error comes from backend.server_error)
    fusedresnet.client         loads, when imported, neither the launcher nor what only it needs (the server extra:
                               psutil, torch, Triton's server), so a client-only install runs it (the demo starts
                               a server through a lazy import of the launcher)

Read from the source with `ast` (CPU, nothing imported), relative imports resolved against the package each
folder is mapped to in pyproject.toml (`from ..backend.x import y` inside fusedresnet.kernels is
fusedresnet.backend.x), imports inside functions included.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# pyproject.toml [tool.setuptools] package-dir: folder -> package.
PACKAGES = {"backend": "fusedresnet.backend", "kernels": "fusedresnet.kernels", "client": "fusedresnet.client",
            "loadtest": "fusedresnet.loadtest", "campaigns": "fusedresnet.campaigns", "harness": "fusedresnet.harness"}


def at_import(tree: ast.AST):
    """The nodes of `tree` that run when the module is imported: all of them but the bodies of functions (a class's
    body runs at import, a function's when it is called)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def imports(source: str, package: str, names: bool = False, lazy: bool = True) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, a module of `package`.

    `from .x import y` gives package.x; `from . import y` gives package.y (y may be a module or a name).
    With `names`, every `from m import y` gives m.y (the caller keeps the longest prefix that is a module: y may
    be a module of package m, as in `from fusedresnet.loadtest import step`). Without `lazy`, only the imports
    that run when the module is imported (none inside a function)."""
    found = []
    tree = ast.parse(source)
    for node in sorted(ast.walk(tree) if lazy else at_import(tree), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if names:
                    found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
                else:
                    found.append((node.lineno, node.module))
                continue
            parts = package.split(".")
            if node.level > len(parts):
                raise ValueError(f"line {node.lineno}: relative import beyond the top-level package")
            base = ".".join(parts[:len(parts) - node.level + 1])
            if node.module and names:
                found += [(node.lineno, f"{base}.{node.module}.{alias.name}") for alias in node.names]
            elif node.module:
                found.append((node.lineno, f"{base}.{node.module}"))
            else:
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def within(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def kernel_library_violations(relative: str, source: str) -> list[str]:
    """What a module of fusedresnet.kernels (or of its kernels/dev/ experiments) imports that it may not:
    another fusedresnet package, or a fusedresnet.kernels module that does not exist in kernels/ (one moved
    to the harness)."""
    found = []
    package = ".".join([PACKAGES["kernels"], *Path(relative).parent.parts[1:]])
    for line, module in imports(source, package):
        if within(module, ("fusedresnet",)) and not within(module, ("fusedresnet.kernels",)):
            found.append((line, module))   # any other fusedresnet package (or the namespace itself)
        elif within(module, ("fusedresnet.kernels",)) and module != "fusedresnet.kernels":
            path = ROOT / "kernels" / Path(*module.split(".")[2:])
            if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
                found.append((line, module))
    return [f"{relative}:{line}: imports {module}" for line, module in found]


def kernel_modules() -> list[Path]:
    modules = sorted((ROOT / "kernels").rglob("*.py"))
    assert len(modules) >= 5, modules
    return modules


def test_imports_are_resolved_against_the_package_of_the_file():
    source = ("from __future__ import annotations\n"
              "import cupy as cp\n"
              "from ..backend.engines.fused_cuda import FusedCudaEngine\n"
              "from .launch import library\n"
              "from . import configs\n"
              "def main():\n"
              "    from ..client.agreement import compare_logits\n"
              "    import fusedresnet.harness.check\n")
    assert [m for _, m in imports(source, "fusedresnet.kernels")] == [
        "__future__", "cupy", "fusedresnet.backend.engines.fused_cuda", "fusedresnet.kernels.launch",
        "fusedresnet.kernels.configs", "fusedresnet.client.agreement", "fusedresnet.harness.check"]
    assert [m for _, m in imports("from ..kernels.tune import time_graph\n", "fusedresnet.harness")] == [
        "fusedresnet.kernels.tune"]


def test_the_old_layout_is_caught():
    """bench.py as it was inside kernels/: the harness in the kernel library, importing the backend."""
    old_bench = ("from ..backend.engines.fused_cuda import FusedCudaEngine\n"
                 "from ..backend.spec import INPUT_UINT8\n"
                 "from .check import layer_shapes\n"
                 "from .launch import conv_out_size\n"
                 "from .tune import time_graph\n"
                 "from ..loadtest.step import Step\n"
                 "import fusedresnet\n")
    assert kernel_library_violations("kernels/bench.py", old_bench) == [
        "kernels/bench.py:1: imports fusedresnet.backend.engines.fused_cuda",
        "kernels/bench.py:2: imports fusedresnet.backend.spec",
        "kernels/bench.py:3: imports fusedresnet.kernels.check",
        "kernels/bench.py:6: imports fusedresnet.loadtest.step",
        "kernels/bench.py:7: imports fusedresnet"]


@pytest.mark.parametrize("path", kernel_modules(), ids=lambda p: p.relative_to(ROOT / "kernels").as_posix())
def test_kernel_library_imports_no_other_fusedresnet_package(path):
    relative = path.relative_to(ROOT).as_posix()
    assert kernel_library_violations(relative, path.read_text()) == []


def imports_of(folders, forbidden) -> list[str]:
    """'path:line: imports module' for every import of a module within `forbidden` by a module of `folders` (relative
    imports resolved against the package of the file: `from ...kernels` in backend/engines/ is fusedresnet.kernels)."""
    offenders = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            package = ".".join([PACKAGES[folder], *path.relative_to(ROOT / folder).parent.parts])
            for line, module in imports(path.read_text(), package):
                if within(module, forbidden):
                    offenders.append(f"{path.relative_to(ROOT).as_posix()}:{line}: imports {module}")
    return offenders


def test_no_package_imports_the_harness():
    assert imports_of([f for f in PACKAGES if f != "harness"], ("fusedresnet.harness",)) == []


def test_no_package_imports_the_campaigns():
    assert imports_of([f for f in PACKAGES if f != "campaigns"], ("fusedresnet.campaigns",)) == []


def test_the_client_imports_neither_the_load_tests_nor_the_campaigns():
    assert imports_of(["client"], ("fusedresnet.loadtest", "fusedresnet.campaigns", "fusedresnet.harness",
                                   "fusedresnet.kernels")) == []


def test_package_dir_maps_every_folder_here():
    text = (ROOT / "pyproject.toml").read_text()
    for folder, package in PACKAGES.items():
        assert f'"{package}" = "{folder}"' in text, package
        assert (ROOT / folder / "__init__.py").is_file(), folder
        for init in sorted((ROOT / folder).rglob("__init__.py")):   # its packages too (backend/launcher/, ...)
            inner = init.parent.relative_to(ROOT)
            name = ".".join([package, *inner.parts[1:]])
            listed = text.split("packages = ")[1].split("\n")[0]
            assert f'"{name}" = "{inner.as_posix()}"' in text and f'"{name}"' in listed, name


def project_modules() -> dict[str, tuple[Path, str]]:
    """{module: (its file, the package its relative imports resolve against)} of the packages in PACKAGES."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            module = ".".join([package, *parts])
            modules[module] = (path, module if path.name == "__init__.py" else module.rsplit(".", 1)[0])
    return modules


def module_imports(lazy: bool = True) -> dict[str, set[str]]:
    """{module: the fusedresnet modules it imports} of every module of the packages in PACKAGES (a name imported
    from a package, `from . import x`, counts as its module when there is one, else as the package). Without
    `lazy`, only the imports that run when the module is imported."""
    modules = project_modules()
    graph = {}
    for module, (path, package) in modules.items():
        graph[module] = set()
        for _, name in imports(path.read_text(), package, names=True, lazy=lazy):
            while name not in modules and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in modules and name != module:
                graph[module].add(name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: each strongly connected set of more than one module, sorted."""
    order, low, stack, cycles = {}, {}, [], []

    def visit(module):
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            members = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(members) > 1:
                cycles.append(sorted(members))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(cycles)


def test_import_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_a_module_imported_from_its_package_is_an_edge():
    assert [m for _, m in imports("from fusedresnet.loadtest import step, triton_metrics\nfrom . import x\n",
                                  "fusedresnet.loadtest", names=True)] == [
        "fusedresnet.loadtest.step", "fusedresnet.loadtest.triton_metrics", "fusedresnet.loadtest.x"]


def test_no_module_imports_itself_back_through_others():
    graph = module_imports()
    assert "fusedresnet.backend.engines.fused_cuda" in graph["fusedresnet.backend.engines.serving"]  # lazy ones count
    assert "fusedresnet.loadtest.step" in graph["fusedresnet.loadtest.sweep"]     # a name from a module
    assert "fusedresnet.loadtest.triton_metrics" in graph["fusedresnet.loadtest.step"]   # a module from a package
    assert import_cycles(graph) == []


# ---------------------------------------------------------------- the arrows of the server's rooms (issue 47)

@functools.cache
def import_time_graph() -> dict[str, set[str]]:
    """module_imports(lazy=False), read once for the tests below (which do not change it)."""
    return module_imports(lazy=False)


def loaded(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every module `module` imports through `graph`, directly or through others (itself not included)."""
    seen, stack = set(), [module]
    while stack:
        for other in graph.get(stack.pop(), ()):
            if other not in seen:
                seen.add(other)
                stack.append(other)
    return seen - {module}


def third_party_at_import(module: str) -> set[str]:
    """The top-level names of the packages outside fusedresnet that importing `module` imports (its own imports
    at import time and those of every fusedresnet module it loads then)."""
    modules = project_modules()
    found = set()
    for name in {module} | loaded(import_time_graph(), module):
        path, package = modules[name]
        found |= {imported.split(".")[0] for _, imported in imports(path.read_text(), package, lazy=False)
                  if not within(imported, ("fusedresnet", "__future__"))}
    return found


# The launcher's modules (backend/launcher/), lowest first: each imports only modules before it in this order.
LAUNCHER_ROOMS = ("settings", "stub_processes", "health", "repository", "supervisor", "process", "group", "launch",
                  "cli", "subprocess_server")
# The network and its weights (backend/resnet/), the engines that run it (backend/engines/) and the Triton adapter
# that serves them from a Python-backend stub (backend/triton_adapter/), the same way.
RESNET_ROOMS = ("pretrained", "architecture", "folding", "onnx_import", "weights")
ENGINES_ROOMS = ("cuda_context", "batch_buckets", "config", "fused_cuda", "serving", "fused_module")
TRITON_ADAPTER_ROOMS = ("pinned_shm", "python_model")
# The A/B router (backend/ab_router/): its parameters, then its build.
AB_ROUTER_ROOMS = ("config", "build")
# The model repository's preparation (backend/repository/): the stamp, the copies, the preparation.
REPOSITORY_ROOMS = ("prepared_stamp", "copies", "prepare")
# The Triton server and its front ends (backend/triton_server/): the installation, the in-process front end's shim,
# the choice of front end, the in-process server.
TRITON_SERVER_ROOMS = ("installation", "frontend_shim_build", "front_end", "inprocess_server")
# What only the server extra installs (pyproject.toml), and the project's modules that start or build the server.
SERVER_SIDE_PACKAGES = {"psutil", "torch", "pytriton", "triton_python_backend_utils", "cupy"}
SERVER_SIDE_MODULES = {f"fusedresnet.backend.{name}" for name in (
    "serve", "launcher", *(f"launcher.{module}" for module in LAUNCHER_ROOMS),
    "triton_server", *(f"triton_server.{module}" for module in TRITON_SERVER_ROOMS),
    "ab_router.build", "native_build", "cuda_mps")}


def test_only_what_runs_at_import_counts_without_lazy():
    """The old demo imported the launcher at its top; a demo that imports it in the function that starts a server
    loads it only there."""
    old_demo = ("import sys\n"
                "from fusedresnet.backend.serve import ServerError, TritonServer\n"
                "class Demo:\n"
                "    from fusedresnet.backend import spec\n"
                "def main():\n"
                "    pass\n")
    new_demo = ("import sys\n"
                "class Demo:\n"
                "    from fusedresnet.backend import spec\n"
                "def main():\n"
                "    try:\n"
                "        from fusedresnet.backend.serve import ServerError, TritonServer\n"
                "    except ModuleNotFoundError:\n"
                "        return 1\n"
                "    run = lambda: __import__('psutil')\n")
    assert [m for _, m in imports(old_demo, "fusedresnet.client", lazy=False)] == [
        "sys", "fusedresnet.backend.serve", "fusedresnet.backend"]
    assert [m for _, m in imports(new_demo, "fusedresnet.client", lazy=False)] == ["sys", "fusedresnet.backend"]
    assert "fusedresnet.backend.serve" in [m for _, m in imports(new_demo, "fusedresnet.client")]
    graph = {"client.demo": {"backend.serve"}, "backend.serve": {"backend.launcher.stub_processes"},
             "backend.launcher.stub_processes": set()}
    assert loaded(graph, "client.demo") == {"backend.serve", "backend.launcher.stub_processes"}


def test_the_triton_installation_does_not_build_the_router():
    """Finding and preparing Triton (every server start) neither imports nor builds the A/B router's backend: the
    launcher builds it, lazily, where its repository serves the router (launcher.repository_backends)."""
    graph = module_imports()
    assert "fusedresnet.backend.ab_router.build" not in loaded(graph, "fusedresnet.backend.triton_server.installation")
    assert "fusedresnet.backend.ab_router.build" in graph["fusedresnet.backend.launcher.repository"]   # lazily
    assert "fusedresnet.backend.ab_router.build" not in loaded(import_time_graph(), "fusedresnet.backend.serve")


def test_the_launchers_rooms_import_only_downward():
    """backend/launcher/: settings, health and repository know no process; finding a server's Python-backend stubs
    (stub_processes, which the campaigns and tests use too) needs nothing of ours; the supervision of a process knows
    neither the process class nor the group; launch (the settings and the one start) sits on the group, the command
    line on launch, the command in a subprocess (LaunchedServer) on top; backend/serve.py only re-exports."""
    graph = module_imports()
    assert upward_imports(graph, "fusedresnet.backend.launcher", LAUNCHER_ROOMS) == []
    assert graph["fusedresnet.backend.launcher.stub_processes"] == set()
    assert graph["fusedresnet.backend.serve"] <= {"fusedresnet.backend.launcher", "fusedresnet.backend.launcher.cli"}


def upward_imports(graph: dict[str, set[str]], package: str, rooms) -> list[str]:
    """`room imports other` for each module of `package` (its `rooms`, lowest first) that imports one at or after
    itself in that order, and for each module of `package` that is not a room or a room that is not a module."""
    modules = [f"{package}.{room}" for room in rooms]
    found = [f"{module} is not a module" for module in modules if module not in graph]
    found += [f"{module} is in no room" for module in sorted(graph)
              if within(module, (package,)) and module != package and module not in modules]
    for index, module in enumerate(modules):
        found += [f"{module} imports {other}" for other in sorted(graph.get(module, set()) & set(modules[index:]))]
    return found


def test_an_upward_import_between_rooms_is_found():
    graph = {"p": set(), "p.low": set(), "p.high": {"p.low"}}
    assert upward_imports(graph, "p", ("low", "high")) == []
    assert upward_imports({**graph, "p.low": {"p.high"}}, "p", ("low", "high")) == ["p.low imports p.high"]
    assert upward_imports({**graph, "p.extra": set()}, "p", ("low", "high")) == ["p.extra is in no room"]
    assert upward_imports(graph, "p", ("low", "middle", "high")) == ["p.middle is not a module"]


def test_the_networks_rooms_import_only_downward():
    """backend/resnet/: the trained checkpoint's download needs nothing; the network's definition only images and
    the wire contract; folding, the ONNX import and the weights' sources sit on it, each below the next. The
    network knows no engine (backend/engines/ runs it) and its package's __init__ imports nothing, so the
    client's demo reads the checkpoint's name without torch."""
    graph = module_imports()
    assert upward_imports(graph, "fusedresnet.backend.resnet", RESNET_ROOMS) == []
    for room in RESNET_ROOMS:
        module = f"fusedresnet.backend.resnet.{room}"
        outside = {other for other in graph[module] if not within(other, ("fusedresnet.backend.resnet",))}
        assert outside <= {"fusedresnet.backend.images", "fusedresnet.backend.spec"}, (module, sorted(outside))
    assert imports((ROOT / "backend" / "resnet" / "__init__.py").read_text(), "fusedresnet.backend.resnet") == []


def test_the_engines_rooms_import_only_downward():
    """backend/engines/: the early CUDA context needs nothing and the config no engine; the fused CUDA engine knows
    neither the PyTorch engines nor the factory that picks it (which imports it lazily, where it runs it); the
    engine as a torch module sits on top. The engines stand on the network (backend/resnet/), which never imports
    them, and on nothing of the server: no launcher, no Triton adapter. The package's __init__ imports nothing, so
    the Triton adapter makes its CUDA context before torch is imported and the tests read the config without it."""
    graph = module_imports()
    assert upward_imports(graph, "fusedresnet.backend.engines", ENGINES_ROOMS) == []
    assert "fusedresnet.backend.engines.fused_cuda" in graph["fusedresnet.backend.engines.serving"]
    allowed = ("fusedresnet.backend.engines", "fusedresnet.backend.resnet", "fusedresnet.backend.images",
               "fusedresnet.backend.spec", "fusedresnet.kernels")
    for room in ENGINES_ROOMS:
        module = f"fusedresnet.backend.engines.{room}"
        assert {other for other in graph[module] if not within(other, allowed)} == set(), module
    for module in graph:
        if within(module, ("fusedresnet.backend.resnet",)):
            assert not {other for other in graph[module] if within(other, ("fusedresnet.backend.engines",))}, module
    assert imports((ROOT / "backend" / "engines" / "__init__.py").read_text(), "fusedresnet.backend.engines") == []
    assert "torch" not in third_party_at_import("fusedresnet.backend.engines.cuda_context")
    assert "torch" not in third_party_at_import("fusedresnet.backend.engines.config")


def test_the_triton_adapters_rooms_import_only_downward():
    """backend/triton_adapter/: the Python backend's shared memory page-locked knows no model; the Python-backend
    model every model_repository/*/1/model.py delegates to sits on it. The adapter stands on the engines and the
    wire contract only, and no module of ours imports it (Triton's stub does, through the models' model.py): not
    the engines, nor the launcher, which finds the stubs it runs in from outside (launcher.stub_processes). Its
    package's __init__ imports nothing, and python_model makes the stub's CUDA context (engines.cuda_context)
    before it imports torch or anything that loads torch (the context is made while torch imports)."""
    graph = module_imports()
    package = "fusedresnet.backend.triton_adapter"
    assert upward_imports(graph, package, TRITON_ADAPTER_ROOMS) == []
    allowed = (package, "fusedresnet.backend.engines", "fusedresnet.backend.spec")
    for room in TRITON_ADAPTER_ROOMS:
        module = f"{package}.{room}"
        assert {other for other in graph[module] if not within(other, allowed)} == set(), module
    for module in graph:
        if not within(module, (package,)):
            assert not {other for other in graph[module] if within(other, (package,))}, module
    assert imports((ROOT / "backend" / "triton_adapter" / "__init__.py").read_text(), package) == []
    source = (ROOT / "backend" / "triton_adapter" / "python_model.py").read_text()
    start = next(node.lineno for node in ast.parse(source).body
                 if isinstance(node, ast.Expr) and ast.unparse(node) == "cuda_context.start()")
    modules = project_modules()
    before = set()
    for line, name in imports(source, package, names=True, lazy=False):
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if line < start:
            before.add(name)
        elif name == "torch":
            break
    else:
        raise AssertionError("python_model imports torch nowhere after cuda_context.start()")
    assert "fusedresnet.backend.engines.cuda_context" in before, sorted(before)
    assert "torch" not in before and not any("torch" in third_party_at_import(name) for name in before & set(modules))


def test_the_ab_routers_rooms_import_only_downward():
    """backend/ab_router/: the router's parameters (which the client checks a change with) need the wire contract
    alone and the standard library; its build sits on them, the wire contract and the native builds' shared pattern,
    and on nothing of the launcher or the Triton installation. Only the launcher (lazily, where its repository serves
    the router) and client.ab_mode (the parameters) import the router. Its package's __init__ imports
    nothing, so the client reads the parameters without the build."""
    graph = module_imports()
    package = "fusedresnet.backend.ab_router"
    assert upward_imports(graph, package, AB_ROUTER_ROOMS) == []
    assert graph[f"{package}.config"] == {"fusedresnet.backend.spec"}
    assert third_party_at_import(f"{package}.config") <= sys.stdlib_module_names
    assert graph[f"{package}.build"] <= {f"{package}.config", "fusedresnet.backend.spec",
                                         "fusedresnet.backend.native_build"}
    for module in graph:
        if not within(module, (package, "fusedresnet.client.ab_mode", "fusedresnet.backend.launcher.repository")):
            assert not {other for other in graph[module] if within(other, (package,))}, module
    assert imports((ROOT / "backend" / "ab_router" / "__init__.py").read_text(), package) == []


def test_the_repositorys_rooms_import_only_downward():
    """backend/repository/: the prepared stamp needs nothing of ours and no third-party package (the client's demo reads
    it); the copies know the stamp and the wire contract, never `prepare`; the preparation sits on top, on the network
    and its weights (backend/resnet/), and on no engine, launcher or Triton installation. The launcher imports the
    stamp and the copies, never `prepare` (torch, to write the model files). Its package's __init__ imports nothing."""
    graph = module_imports()
    package = "fusedresnet.backend.repository"
    assert upward_imports(graph, package, REPOSITORY_ROOMS) == []
    assert graph[f"{package}.prepared_stamp"] == set()
    assert third_party_at_import(f"{package}.prepared_stamp") <= sys.stdlib_module_names
    assert graph[f"{package}.copies"] <= {f"{package}.prepared_stamp", "fusedresnet.backend.spec"}
    allowed = (package, "fusedresnet.backend.resnet", "fusedresnet.backend.spec")
    assert {other for other in graph[f"{package}.prepare"] if not within(other, allowed)} == set()
    for module in graph:
        if within(module, ("fusedresnet.backend.launcher",)):
            assert f"{package}.prepare" not in graph[module], module
    assert imports((ROOT / "backend" / "repository" / "__init__.py").read_text(), package) == []


def test_the_triton_servers_rooms_import_only_downward():
    """backend/triton_server/: finding and preparing Triton needs only the launcher's error and the wire contract; the
    in-process front end's shim is built on the native builds' shared pattern; the choice of front end builds the shim
    (lazily) to probe it; the in-process server sits on both. Nothing here imports the launcher, which runs the server
    it finds, nor the A/B router, the repository's preparation or the engines. Its package's __init__ imports
    nothing."""
    graph = module_imports()
    package = "fusedresnet.backend.triton_server"
    assert upward_imports(graph, package, TRITON_SERVER_ROOMS) == []
    assert graph[f"{package}.installation"] == {"fusedresnet.backend.server_error", "fusedresnet.backend.spec"}
    assert graph[f"{package}.frontend_shim_build"] == {"fusedresnet.backend.native_build", "fusedresnet.backend.spec"}
    assert f"{package}.frontend_shim_build" in graph[f"{package}.front_end"]   # lazily
    allowed = (package, "fusedresnet.backend.server_error", "fusedresnet.backend.spec",
               "fusedresnet.backend.native_build")
    for room in TRITON_SERVER_ROOMS:
        module = f"{package}.{room}"
        assert {other for other in graph[module] if not within(other, allowed)} == set(), module
    assert imports((ROOT / "backend" / "triton_server" / "__init__.py").read_text(), package) == []


def test_the_admin_token_needs_neither_the_triton_installation_nor_the_launcher():
    reached = loaded(module_imports(), "fusedresnet.backend.admin_token")
    assert reached & SERVER_SIDE_MODULES == set(), sorted(reached)
    assert "fusedresnet.backend.server_error" in reached


def client_modules() -> list[str]:
    modules = sorted(m for m in project_modules() if within(m, ("fusedresnet.client",)))
    assert "fusedresnet.client.demo" in modules, modules
    return modules


@pytest.mark.parametrize("module", client_modules())
def test_a_client_module_loads_no_server_side_module_at_import(module):
    """A client-only install (the client extra) imports every client module: none loads the launcher, the Triton
    installation or a native build when imported (the demo imports the launcher where it starts a server)."""
    reached = loaded(import_time_graph(), module)
    assert reached & SERVER_SIDE_MODULES == set(), sorted(reached & SERVER_SIDE_MODULES)
    assert third_party_at_import(module) & SERVER_SIDE_PACKAGES == set()
