"""Build the A/B router's Triton backend (`fusedresnet_ab`, backend/ab_router/ab_router_backend/ab_router.cc).

The router runs inside tritonserver as a C++ backend, so that a request through it crosses no Python stub of its
own (docs/AB_LIVE.md). Its facts (tensor names, metric names and buckets, parameters and their defaults) are
defined once, in backend/spec.py and backend/ab_router/config.py: this module writes them into a header the source
includes. It compiles with the system C++ compiler and nothing else installed: against Triton's API headers of
release r24.10 (Triton 2.51, the server this project runs; in ab_router_backend/include), and the copies of
RapidJSON's headers and of BLAKE2's reference C code (BLAKE2b, the sticky split's hash, as hashlib computes it)
vendored unmodified in ab_router_backend/third_party (README.md there: versions and licenses), the C file compiled
into the library. The C++ runtime is linked statically, so the library runs on any host with the same or a newer
glibc.

The library is built once per source: `build/ab_router_backend/<digest of the sources and the command>/`
(backend/native_build.py, the pattern the front end's shim shares). A library built elsewhere is used as it is when
its digest matches: the offline bundle brings one for the GPU host, which has no compiler packages
(scripts/make_offline_bundle.sh; its setup names the folder in $FUSEDRESNET_AB_ROUTER_PREBUILT). `make setup` builds
it; the launcher builds it when missing (`build`), where its model repository serves the router
(launcher.repository.repository_backends).

    python -m fusedresnet.backend.ab_router.build        # build (or find) it, print its path
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from .. import spec
from ..native_build import compiler, find_or_build, source_digest
from . import config as ab_config
from .config import STICKY_BUCKETS, RouterConfig

SOURCE_DIR = Path(__file__).resolve().parent / "ab_router_backend"
THIRD_PARTY_DIR = SOURCE_DIR / "third_party"
BLAKE2_DIR = THIRD_PARTY_DIR / "blake2"
# Where the compiler looks, and the only places: every header the router includes beyond the C++ library is here.
INCLUDE_DIRS = (SOURCE_DIR / "include", THIRD_PARTY_DIR / "rapidjson" / "include", BLAKE2_DIR)
# What is compiled: the router, and BLAKE2b's reference code (C, compiled as C++: its header declares it extern "C").
COMPILED = (SOURCE_DIR / "ab_router.cc", BLAKE2_DIR / "blake2b-ref.c")
VENDORED = tuple(sorted(path for path in THIRD_PARTY_DIR.rglob("*") if path.suffix in (".h", ".c")))
SOURCES = (COMPILED[0], SOURCE_DIR / "include" / "triton" / "core" / "tritonbackend.h",
           SOURCE_DIR / "include" / "triton" / "core" / "tritonserver.h", *VENDORED)
LIBRARY_NAME = f"libtriton_{spec.AB_ROUTER_BACKEND}.so"
OUTPUT_DIR = spec.BUILD_DIR / "ab_router_backend"
# What a Debian or Ubuntu host installs to build it (.ci/apt-packages/ab-router, the Dockerfile): the compiler alone.
BUILD_PACKAGES = ("g++",)
COMPILE_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wall")
# Only Triton's entry points are exported: the statically linked C++ runtime stays private to the library.
VERSION_SCRIPT = "{ global: TRITONBACKEND_*; local: *; };\n"
LINK_FLAGS = ("-static-libstdc++", "-static-libgcc", "-pthread", "-ldl")


class RouterBuildError(RuntimeError):
    """The router's backend cannot be built here; the message says what to install."""


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _doubles(values) -> str:
    return "{" + ", ".join(repr(float(v)) for v in values) + "}"


def generated_header() -> str:
    """The header of the facts the backend takes from spec.py and config.py."""
    defaults = RouterConfig()
    constants = {
        "kInput": spec.INPUT_UINT8, "kLogits": spec.OUTPUT_LOGITS, "kEngine": spec.OUTPUT_ENGINE,
        "kStickyParameter": spec.AB_STICKY_PARAMETER,
        "kRequestsMetric": spec.AB_REQUESTS_METRIC, "kFailuresMetric": spec.AB_FAILURES_METRIC,
        "kTimeoutsMetric": spec.AB_TIMEOUTS_METRIC, "kSkippedMetric": spec.AB_SKIPPED_METRIC,
        "kComparedMetric": spec.AB_COMPARED_METRIC, "kDisagreeingMetric": spec.AB_DISAGREEING_METRIC,
        "kImagesMetric": spec.AB_IMAGES_METRIC, "kTop1AgreeMetric": spec.AB_TOP1_AGREE_METRIC,
        "kLatencyMetric": spec.AB_LATENCY_METRIC, "kTop5OverlapMetric": spec.AB_TOP5_OVERLAP_METRIC,
        "kRelL2Metric": spec.AB_REL_L2_METRIC,
        "kDefaultMode": defaults.mode, "kDefaultPrimary": defaults.primary, "kDefaultCandidate": defaults.candidate,
        "kIntegerPattern": ab_config.INTEGER, "kNumberPattern": ab_config.NUMBER,
        "kShadowTimeoutAllowed": ab_config.SHADOW_TIMEOUT_ALLOWED,
        "kShadowMaxInFlightAllowed": ab_config.SHADOW_MAX_IN_FLIGHT_ALLOWED,
        "kDisagreementRecordsAllowed": ab_config.DISAGREEMENT_RECORDS_ALLOWED,
    }
    # The header's text, this line included, is part of build_digest, by which the offline bundle's prebuilt library
    # is found: this line names the modules' former paths (now ab_router/build.py and ab_router/config.py), kept
    # byte for byte so that the move changed no digest.
    lines = ["// Generated by backend/ab_router_build.py from backend/spec.py and backend/ab_config.py: do not edit.",
             "#pragma once", "#include <cstdint>", "namespace spec {"]
    lines += [f"constexpr const char* {name} = {_c_string(value)};" for name, value in constants.items()]
    lines += [f"constexpr const char* kModes[] = {{{', '.join(map(_c_string, spec.AB_MODES))}}};",
              f"constexpr const char* kParameters[] = "
              f"{{{', '.join(_c_string(f.name) for f in sorted(fields(RouterConfig), key=lambda f: f.name))}}};",
              f"constexpr double kDefaultCandidatePercent = {float(defaults.candidate_percent)!r};",
              f"constexpr double kDefaultShadowTimeoutMs = {float(defaults.shadow_timeout_ms)!r};",
              f"constexpr int64_t kDefaultShadowMaxInFlight = {int(defaults.shadow_max_in_flight)};",
              f"constexpr int64_t kDefaultDisagreementRecords = {int(defaults.disagreement_records)};",
              f"constexpr double kShadowTimeoutMsMin = {float(ab_config.SHADOW_TIMEOUT_MS_RANGE[0])!r};",
              f"constexpr double kShadowTimeoutMsMax = {float(ab_config.SHADOW_TIMEOUT_MS_RANGE[1])!r};",
              f"constexpr int64_t kShadowMaxInFlightMax = {ab_config.SHADOW_MAX_IN_FLIGHT_MAX};",
              f"constexpr int64_t kDisagreementRecordsMax = {ab_config.DISAGREEMENT_RECORDS_MAX};",
              f"constexpr double kLatencyBucketsS[] = {_doubles(spec.AB_LATENCY_BUCKETS_S)};",
              f"constexpr double kTop5OverlapBuckets[] = {_doubles(spec.AB_TOP5_OVERLAP_BUCKETS)};",
              f"constexpr double kRelL2Buckets[] = {_doubles(spec.AB_REL_L2_BUCKETS)};",
              f"constexpr int64_t kTopK = {spec.AB_TOP_K};",
              f"constexpr double kLogEveryS = {float(spec.AB_LOG_EVERY_S)!r};",
              f"constexpr double kFlushS = {float(spec.METRICS_FLUSH_S)!r};",
              f"constexpr uint64_t kStickyBuckets = {STICKY_BUCKETS};",
              "}  // namespace spec", ""]
    return "\n".join(lines)


def build_digest() -> str:
    """What the library is built from: the sources (the vendored ones too), the generated header and the flags (not
    the paths)."""
    return source_digest(((source.relative_to(SOURCE_DIR).as_posix(), source) for source in SOURCES),
                         generated_header().encode(),
                         " ".join(COMPILE_FLAGS + LINK_FLAGS).encode() + VERSION_SCRIPT.encode())


def library_path(output_dir: Path = OUTPUT_DIR, digest: str | None = None) -> Path:
    return output_dir / (digest or build_digest()) / LIBRARY_NAME


PREBUILT_ENV = "FUSEDRESNET_AB_ROUTER_PREBUILT"   # a folder of <digest>/<library> built elsewhere


def compile_command(cxx: str, scratch: Path, library: Path) -> list[str]:
    """The one command that builds the library; `scratch` holds the generated header and the version script."""
    return [cxx, *COMPILE_FLAGS, f"-I{scratch}", *(f"-I{folder}" for folder in INCLUDE_DIRS),
            str(COMPILED[0]), "-x", "c++", str(COMPILED[1]), "-x", "none",
            "-o", str(library), f"-Wl,--version-script={scratch / 'exports.ld'}", *LINK_FLAGS]


def build(output_dir: Path = OUTPUT_DIR) -> Path:
    """The router's backend library for these sources: the one built before (here, or in $PREBUILT_ENV), else
    built now."""
    return find_or_build(
        library_path(output_dir), PREBUILT_ENV, lambda cxx, library: compile_command(cxx, library.parent, library),
        RouterBuildError,
        missing_compiler=f"the A/B router's backend needs a C++ compiler ({compiler()} not found); on Debian or "
                         f"Ubuntu: apt-get install {' '.join(BUILD_PACKAGES)}",
        failed="building the A/B router's backend failed",
        files={"ab_router_spec.h": generated_header(), "exports.ld": VERSION_SCRIPT})


def main() -> int:
    try:
        print(build())
    except RouterBuildError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
