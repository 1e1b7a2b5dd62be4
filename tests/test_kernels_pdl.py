"""Programmatic dependent launch (kernels/launch.py, common.cuh `pdl_begin`), checked on the CPU.

A kernel launched with the programmatic-stream-serialization attribute may
start while the kernel before it still runs; it is correct only because it
waits (griddepcontrol.wait) before touching global memory. So: every kernel
begins with pdl_begin() (or pdl_wait(), and triggers its dependents later,
pdl_trigger()), and the choice of launch (`launch_choices.pdl_choice`)
follows the device, the caller's request and what is installed, never silently
against an explicit request. The compiled PTX (one wait per kernel on
cc >= 9.0, none before) is checked by test_kernels_compile.py; the GPU check
(`bash kernels/gpu_check.sh check`) runs every kernel with the launch on.
"""

from __future__ import annotations

import re
import sys
import types

import pytest

from fusedresnet.backend.engines.config import PDL_ENV, pdl_override
from fusedresnet.kernels.build import KERNEL_DIR, SOURCES
from fusedresnet.kernels.dev import DEV_SOURCES
from fusedresnet.kernels.launch_choices import pdl_choice


def _kernel_bodies(text: str):
    """(name, first statement, the text up to the next kernel) of every __global__ function in a .cu file."""
    bounds = r"__launch_bounds__\((?:[^()]|\([^()]*\))*\)"   # one level of nested parentheses
    for match in re.finditer(rf"__global__\s+void\s+(?:{bounds}\s*)?(\w+)\s*\((.*?)\)\s*\{{", text, re.S):
        rest = text[match.end():]
        statements = [line.strip() for line in rest.split("\n") if line.strip() and
                      not line.strip().startswith("//")]
        yield match.group(1), statements[0], rest.split("__global__")[0]


def test_every_kernel_waits_for_the_previous_one_before_anything_else():
    kernels, bodies = {}, {}
    for path in [KERNEL_DIR / name for name in SOURCES] + list(DEV_SOURCES):   # served and kernels/dev
        for kernel, first, body in _kernel_bodies(path.read_text()):
            kernels[kernel], bodies[kernel] = first, body
    # every kernel family of the library is here (a regex that found nothing would pass anything)
    assert {"conv_implicit_gemm", "splitk_epilogue", "conv3x3_patch", "conv3x3_patch_wgmma", "conv_wgmma",
            "conv_wgmma_ws", "conv_wgmma_tma", "stem_conv7x7s2", "stem_pool_conv7x7s2", "stem_pool_wgmma",
            "maxpool_3x3s2", "avgpool_fc"} <= set(kernels)
    # pdl_begin(), pdl_begin_prefetch_l2 / _filter (the weights prefetched before the wait), or pdl_wait()
    first_call = r"pdl_begin(_prefetch_\w+)?\(|pdl_wait\(\)"
    late = {k: first for k, first in kernels.items() if not re.match(first_call, first)}
    assert not late, f"kernels that do not begin with pdl_begin or pdl_wait: {late}"
    # a kernel that does not trigger its dependents at its start (pdl_wait, a prefetch with trigger_now false)
    # triggers them later: the sm_90a kernels the H100 runs, after their main loop
    calls = {k: re.sub(r"\s+", " ", body.split(";", 1)[0]).strip() for k, body in bodies.items()}   # whole call
    later = {k for k, call in calls.items() if call.startswith("pdl_wait(") or call.endswith(", false)")}
    assert later == {"conv_wgmma", "conv_wgmma_tma", "conv3x3_patch_wgmma", "stem_pool_wgmma"}, later
    assert all("pdl_trigger();" in bodies[k] for k in later)
    # the three that wait later as well (wait_now false): index arithmetic, mbarrier set-up and copies of their
    # weights first, then pdl_wait() before anything that touches another kernel's output (lambdas are only
    # defined there)
    waiting_later = {k for k, call in calls.items() if call.endswith("false, false)")}
    assert waiting_later == {"conv_wgmma", "conv_wgmma_tma", "conv3x3_patch_wgmma"}, waiting_later
    for kernel in waiting_later:
        before, wait, _ = bodies[kernel].partition("pdl_wait();")
        assert wait, f"{kernel}: no pdl_wait() after a prefetch that does not wait"
        before = re.sub(r"auto \w+ = \[&\]\(.*?\n    \};", "", before, flags=re.S)   # lambda definitions
        code = re.sub(r"//.*", "", before)
        touched = set(re.findall(r"(?<![.\w])(x|y|residual|shortcut_x|partial)\b", code))   # not blockIdx.x
        assert not touched, f"{kernel} uses {touched} before its pdl_wait()"
        assert not re.search(r"\bload_\w+\(", code), f"{kernel} loads a tile before its pdl_wait()"
    for header in KERNEL_DIR.glob("*.cuh"):   # kernels live in the .cu files only
        assert "__global__" not in header.read_text(), header.name


def test_pdl_begin_is_the_sm_90_instruction_pair_and_nothing_before_sm_90():
    text = (KERNEL_DIR / "common.cuh").read_text()
    for name, instruction in (("void pdl_trigger()", "griddepcontrol.launch_dependents"),
                              ("void pdl_wait()", "griddepcontrol.wait")):   # the two halves, alone
        body = text[text.index(name):]
        body = body[:body.index("\n}\n")]
        assert "__CUDA_ARCH__ >= 900" in body and instruction in body
        assert body.count("asm volatile(") == body.count('"memory"') == 1
    for name in ("void pdl_begin()", "void pdl_begin_prefetch_l2("):
        body = text[text.index(name):]
        body = body[:body.index("\n}\n")]
        assert "__CUDA_ARCH__ >= 900" in body
        trigger, wait = body.index("griddepcontrol.launch_dependents"), body.index("griddepcontrol.wait")
        assert trigger < wait   # every asm a memory clobber: no memory access moves above the wait
        assert body.count("asm volatile(") == body.count('"memory"') >= 1
        assert "ld.global" not in body and "cp.async.cg" not in body   # before the wait: prefetches only
        if "prefetch" in name:
            assert trigger < body.index("cp.async.bulk.prefetch.L2.global") < wait
    # the filter prefetches are the one above, for the block's slice of the filter only
    for name in ("void pdl_begin_prefetch_filter_slice(", "void pdl_begin_prefetch_filter("):
        body = text[text.index(name):]
        body = body[:body.index("\n}\n")]
        assert "pdl_begin_prefetch_" in body.split("{", 1)[1] and "asm" not in body


def _bindings(monkeypatch, installed: bool):
    if installed:
        cuda = types.ModuleType("cuda")
        bindings = types.ModuleType("cuda.bindings")
        bindings.driver = types.ModuleType("cuda.bindings.driver")
        cuda.bindings = bindings
        for name, module in (("cuda", cuda), ("cuda.bindings", bindings), ("cuda.bindings.driver", bindings.driver)):
            monkeypatch.setitem(sys.modules, name, module)
    else:
        monkeypatch.setitem(sys.modules, "cuda.bindings", None)   # import raises ImportError


def test_pdl_is_on_where_the_device_and_the_host_have_it(monkeypatch):
    monkeypatch.delenv(PDL_ENV, raising=False)
    _bindings(monkeypatch, installed=True)
    assert pdl_choice((9, 0))[0] and pdl_choice((10, 0))[0] and pdl_choice((12, 0))[0]
    for cc in ((8, 0), (8, 6), (8, 9)):
        used, why = pdl_choice(cc)
        assert not used and "8." in why
    _bindings(monkeypatch, installed=False)
    used, why = pdl_choice((9, 0))
    assert not used and "cuda.bindings" in why


def test_pdl_can_be_turned_off_and_an_explicit_request_is_never_dropped(monkeypatch):
    """pdl_choice takes the request as an argument; FUSEDRESNET_PDL is read at the edge (engines.config's
    pdl_override, what the server and the command-line tools pass down), never by the kernel library."""
    _bindings(monkeypatch, installed=True)
    monkeypatch.setenv(PDL_ENV, "0")
    assert pdl_choice((9, 0))[0]                            # the library reads no environment
    assert pdl_override() is False
    assert pdl_choice((9, 0), pdl_override()) == (False, "turned off by the caller")   # says who turned it off
    monkeypatch.setenv(PDL_ENV, "1")
    assert pdl_override() is True and pdl_choice((9, 0), pdl_override())[0]
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        pdl_choice((8, 9), True)
    _bindings(monkeypatch, installed=False)
    with pytest.raises(ImportError, match="cuda.bindings"):
        pdl_choice((9, 0), True)
    monkeypatch.setenv(PDL_ENV, "yes")
    with pytest.raises(ValueError, match="expected 0 or 1"):
        pdl_override()
    monkeypatch.delenv(PDL_ENV)
    assert pdl_override() is None
