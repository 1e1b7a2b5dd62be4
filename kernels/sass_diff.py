"""Machine code of every kernel, per kernel, before and after a change (CPU only: nvcc + cuobjdump).

    python -m fusedresnet.kernels.sass_diff dump build/sass-before [--arch sm_80 --arch sm_90a | --arch all] [--dev]
    ... edit the kernels ...
    python -m fusedresnet.kernels.sass_diff dump build/sass-after
    python -m fusedresnet.kernels.sass_diff compare build/sass-before build/sass-after

`dump` compiles, for each architecture, exactly the translation unit the
engine compiles (`build.source_text(arch)`, every name expression the
launcher uses on it) with nvcc and the options NVRTC gets
(`build.nvrtc_options(arch)`: -std=c++17 -ftz=true -arch=...), to a cubin,
and writes one file per kernel: its `cuobjdump -res-usage` line (registers,
stack, shared memory, parameter bytes) and its `cuobjdump -sass` listing with
the address column removed. The instruction words (operands, relative branch
offsets, and the scheduling control words: stall counts, barriers, yields)
are kept, so two dumps compare equal only when the machine code is the same
instruction for instruction. File names are the demangled kernel names.

`--dev` adds, on sm_90a, the experiments of kernels/dev/ (their .cu files after
the served ones, their kernels beside the served): a kernel moved between the
served module and kernels/dev/ compares with itself.

`compare` prints, per architecture and kernel, "same" or the first differing
lines, lists kernels present on one side only, and exits 1 if anything
differs: a refactor that must not change the generated code is checked by
an exit status of 0.

Tools: nvcc on PATH (the CUDA toolkit); cuobjdump and nvdisasm from $CUOBJDUMP
/ PATH, or the `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels
(`pip install --target DIR ...`, then CUOBJDUMP=DIR/nvidia/cu13/bin/cuobjdump;
cuobjdump finds nvdisasm beside itself or on PATH).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .build import ARCHS, WGMMA_ARCH, name_expressions, nvrtc_options, source_text

DEFAULT_ARCHS = ("sm_80", "sm_90a")
_ADDRESS = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")


def _tool(name: str, env: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if path is None:
        raise SystemExit(f"sass_diff: {name} not found (set ${env} or put it on PATH; see the module doc)")
    return path


def dev_kernels(arch: str, dev: bool) -> dict:
    """{.cu file: kernel instantiations} of kernels/dev/ when `dev` and `arch` is sm_90a, else nothing."""
    from .dev import dev_name_expressions
    return dev_name_expressions() if dev and arch == WGMMA_ARCH else {}


def kernel_names(arch: str, dev: bool = False) -> list[str]:
    return name_expressions(arch) + [name for names in dev_kernels(arch, dev).values() for name in names]


def translation_unit(arch: str, dev: bool = False) -> str:
    """The engine's source for `arch` (and kernels/dev/'s, if `dev`) plus a line that instantiates every
    kernel the launcher uses."""
    return source_text(arch, tuple(dev_kernels(arch, dev))) + "\nvoid *fusedresnet_instances[] = {" + ", ".join(
        f"(void *)&{name}" for name in kernel_names(arch, dev)) + "};\n"


def compile_cubin(arch: str, out: Path, dev: bool = False) -> Path:
    nvcc = _tool("nvcc", "NVCC")
    out.mkdir(parents=True, exist_ok=True)
    source = out / "fusedresnet_kernels.cu"
    source.write_text(translation_unit(arch, dev))
    cubin = out / "kernels.cubin"
    cmd = [nvcc, *nvrtc_options(arch), "-cubin", "-o", str(cubin), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"sass_diff: {' '.join(cmd)} failed:\n{result.stderr}")
    return cubin


def _demangle(names: list[str]) -> dict[str, str]:
    filt = shutil.which("c++filt")
    if filt is None:
        return {n: n for n in names}
    result = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, result.stdout.splitlines()))


def _safe(name: str) -> str:
    """"conv_wgmma[128,128,2,4,_Schedule_0]" for "void conv_wgmma<128, 128, 2, 4, (Schedule)0>(...)" (template
    arguments tell kernels apart; an enum argument's parentheses are not the parameter list's)."""
    name = name.removeprefix("void ")
    depth, end = 0, len(name)
    for index, char in enumerate(name):
        depth += (char == "<") - (char == ">")
        if char == "(" and depth == 0:
            end = index
            break
    name = name[:end].replace(" ", "")
    return re.sub(r"[^A-Za-z0-9_,<>-]", "_", name).replace("<", "[").replace(">", "]")


def split_listing(sass: str, res_usage: str) -> dict[str, str]:
    """{mangled kernel name: normalised text} from cuobjdump's -sass and -res-usage output."""
    usage = dict(re.findall(r"Function (\S+):\s*\n\s*(REG:.*)", res_usage))
    kernels: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        header = re.match(r"\s*Function : (\S+)", line)
        if header:
            current = header.group(1)
            kernels[current] = [f"resources: {usage.get(current, '?')}"]
            continue
        if current is None or not line.strip() or line.lstrip().startswith(("..........", ".headerflags")):
            continue
        kernels[current].append(re.sub(r"\s+", " ", _ADDRESS.sub("", line)).strip())
    return {name: "\n".join(lines) + "\n" for name, lines in kernels.items()}


def dump(out: Path, archs, dev: bool = False) -> int:
    cuobjdump = _tool("cuobjdump", "CUOBJDUMP")
    env = dict(os.environ, PATH=f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for arch in archs:
        with tempfile.TemporaryDirectory() as tmp:
            cubin = compile_cubin(arch, Path(tmp), dev)
            sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env,
                                  check=True).stdout
            usage = subprocess.run([cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True, env=env,
                                   check=True).stdout
        kernels = split_listing(sass, usage)
        if len(kernels) != len(kernel_names(arch, dev)):
            raise SystemExit(f"sass_diff: {arch}: {len(kernels)} kernels in the cubin, "
                             f"{len(kernel_names(arch, dev))} name expressions")
        directory = out / arch
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        files = {_safe(demangled): mangled for mangled, demangled in _demangle(sorted(kernels)).items()}
        if len(files) != len(kernels):
            raise SystemExit(f"sass_diff: {arch}: {len(kernels)} kernels but {len(files)} distinct file names")
        for name, mangled in files.items():
            (directory / f"{name}.sass").write_text(kernels[mangled])
        print(f"{arch}: {len(kernels)} kernels -> {directory}", flush=True)
    return 0


def compare(before: Path, after: Path, context: int = 3) -> int:
    differ = 0
    for arch_dir in sorted(p for p in before.iterdir() if p.is_dir()):
        other = after / arch_dir.name
        if not other.is_dir():
            print(f"{arch_dir.name}: not in {after}")
            differ += 1
            continue
        old = {p.name: p for p in arch_dir.glob("*.sass")}
        new = {p.name: p for p in other.glob("*.sass")}
        for name in sorted(old.keys() | new.keys()):
            if name not in new or name not in old:
                print(f"{arch_dir.name} {name}: only in {before if name in old else after}")
                differ += 1
                continue
            a, b = old[name].read_text().splitlines(), new[name].read_text().splitlines()
            if a == b:
                print(f"{arch_dir.name} {name}: same ({len(a) - 1} lines)")
                continue
            differ += 1
            diff = list(difflib.unified_diff(a, b, "before", "after", n=context, lineterm=""))
            print(f"{arch_dir.name} {name}: DIFFERS ({len(a) - 1} -> {len(b) - 1} lines)")
            print("\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else ""))
    print(f"{differ} difference(s)" if differ else "identical machine code for every kernel")
    return 1 if differ else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="compile and write one normalised SASS file per kernel")
    d.add_argument("out", type=Path)
    d.add_argument("--arch", action="append", help=f"one of {', '.join(ARCHS)} or all (default: sm_80, sm_90a)")
    d.add_argument("--dev", action="store_true", help="with the experiments of kernels/dev/ (sm_90a)")
    c = sub.add_parser("compare", help="compare two dumps; exit 1 if any kernel differs")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "dump":
        archs = args.arch or list(DEFAULT_ARCHS)
        if "all" in archs:
            archs = list(ARCHS)
        unknown = set(archs) - set(ARCHS)
        if unknown:
            parser.error(f"unknown architecture(s) {sorted(unknown)}: expected {', '.join(ARCHS)} or all")
        return dump(args.out, archs, args.dev)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
