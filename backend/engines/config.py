"""The models' config parameters (config.pbtxt `parameters`), parsed once into a validated `EngineConfig`.

Both Triton models are the same code (`backend/triton_adapter/python_model.py`); what a model
serves is said by its config alone:

| parameter       | values                              | applies to            | default |
|-----------------|-------------------------------------|-----------------------|---------|
| `engine`        | auto, cuda, torch, torchscript      | every model           | auto    |
| `conv_path`     | auto, mma, wgmma                    | the fused CUDA engine | auto    |
| `pdl`           | auto, on, off                       | the fused CUDA engine | auto    |
| `precision`     | fp16, fp32                          | torchscript           | fp16    |
| `cuda_graphs`   | true, false                         | torchscript           | true    |
| `torch_threads` | auto or a positive integer          | every model           | auto    |

`engine`: auto = the fused CUDA kernels on a GPU instance (refusing to load if
they cannot run there: no silent fallback, see `serving.custom_engine_plan`),
the folded graph on PyTorch ops on a CPU instance; cuda = the fused kernels or
nothing; torch = the folded graph on PyTorch ops on any device (the explicit
opt-in to serve without our kernels); torchscript = the cuDNN baseline.

`conv_path` (the fused engine's kernel family: auto = mixed on compute
capability 9.0, each conv on the family its plan names, mma.sync elsewhere) and
`pdl` (programmatic dependent launch; auto = where the device and cuda.bindings
have it) have developer overrides in the environment, FUSEDRESNET_CONV_PATH and
FUSEDRESNET_PDL: when set they win over the config, and the load log says so.
They are read here and only here (`conv_path_override`, `pdl_override`, also
used by the harness's command-line tools); the kernel library below takes
explicit arguments.

A parameter set to other than its default for an engine it does not apply to,
an unknown key or a bad value is a `ConfigError` at load, naming the key, the value and what is
allowed. Triton's own Python-backend parameters pass through untouched.

Pure Python: the tests read both config.pbtxt files through it without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ...kernels.launch_choices import CONV_PATHS, MIXED

CONV_PATH_ENV = "FUSEDRESNET_CONV_PATH"   # auto, mma or wgmma: the fused engine's kernel family
PDL_ENV = "FUSEDRESNET_PDL"               # 0 or 1: programmatic dependent launch off or required
ENGINES = ("auto", "cuda", "torch", "torchscript")
CUSTOM_ENGINES = ("auto", "cuda", "torch")   # resnet18_custom's folded network
CONV_PATH_CHOICES = ("auto", "mma", "wgmma")
PDL_CHOICES = {"auto": None, "on": True, "off": False}
PRECISIONS = ("fp16", "fp32")
BOOLEANS = {"true": True, "false": False}
# Parameters read by Triton's Python backend itself, not by our models.
TRITON_PARAMETERS = ("FORCE_CPU_ONLY_INPUT_TENSORS", "EXECUTION_ENV_PATH")
# Which engines each engine-specific parameter applies to (the others apply to all).
APPLIES_TO = {"conv_path": ("auto", "cuda"), "pdl": ("auto", "cuda"),
              "precision": ("torchscript",), "cuda_graphs": ("torchscript",)}


class ConfigError(ValueError):
    """A config parameter that cannot be served as written; the message names the key and what is allowed."""


@dataclass(frozen=True)
class EngineConfig:
    engine: str = "auto"
    conv_path: str = "auto"
    pdl: str = "auto"
    precision: str = "fp16"
    cuda_graphs: bool = True
    torch_threads: int | None = None    # None: auto (triton_adapter.python_model.torch_threads)

    def conv_path_request(self) -> tuple[str, str]:
        """(the `conv_path` argument of the fused engine, where it comes from): FUSEDRESNET_CONV_PATH when
        set, else the config's."""
        override = conv_path_override()
        if override is not None:
            return override, f"{CONV_PATH_ENV}={os.environ[CONV_PATH_ENV].strip()} overrides config conv_path"
        return self.conv_path, f"config conv_path {self.conv_path}"

    def pdl_request(self) -> tuple[bool | None, str]:
        """(the `pdl` argument of the fused engine, where it comes from): FUSEDRESNET_PDL when set, else the
        config's."""
        override = pdl_override()
        if override is not None:
            return override, f"{PDL_ENV}={os.environ[PDL_ENV].strip()} overrides config pdl"
        return PDL_CHOICES[self.pdl], f"config pdl {self.pdl}"


def conv_path_override() -> str | None:
    """$FUSEDRESNET_CONV_PATH as the fused engine's `conv_path` argument, None when unset or empty."""
    value = os.environ.get(CONV_PATH_ENV, "").strip().lower()
    if not value:
        return None
    if value not in ("auto", MIXED, *CONV_PATHS):
        raise ConfigError(f"{CONV_PATH_ENV}={value!r}: expected auto, mma or wgmma")
    return value


def environment_engine_arguments() -> dict:
    """The environment's overrides as the fused engine's keyword arguments ({"conv_path": ..., "pdl": ...},
    None where unset): what the harness's command-line tools read once and pass down."""
    return {"conv_path": conv_path_override(), "pdl": pdl_override()}


def pdl_override() -> bool | None:
    """$FUSEDRESNET_PDL as the fused engine's `pdl` argument (0: False, 1: True), None when unset or empty."""
    value = os.environ.get(PDL_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{PDL_ENV}={value!r}: expected 0 or 1")
    return None if value == "" else value == "1"


def _choice(key: str, value: str, allowed) -> str:
    if value not in allowed:
        raise ConfigError(f"config parameter {key}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _threads(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ConfigError(f"config parameter torch_threads: {value!r} is neither auto nor a positive integer")
    return threads


PARSERS = {
    "engine": lambda v: _choice("engine", v, ENGINES),
    "conv_path": lambda v: _choice("conv_path", v, CONV_PATH_CHOICES),
    "pdl": lambda v: _choice("pdl", v, tuple(PDL_CHOICES)),
    "precision": lambda v: _choice("precision", v, PRECISIONS),
    "cuda_graphs": lambda v: BOOLEANS[_choice("cuda_graphs", v, tuple(BOOLEANS))],
    "torch_threads": _threads,
}
assert set(PARSERS) == {f.name for f in fields(EngineConfig)}


def parse_engine_config(model_config: dict) -> EngineConfig:
    """The `parameters` of a model configuration (Triton's JSON form, as `initialize` gets it) as an
    EngineConfig, or ConfigError naming the first thing wrong."""
    raw = {key: str(entry.get("string_value", "")).strip()
           for key, entry in (model_config.get("parameters") or {}).items()}
    unknown = sorted(set(raw) - set(PARSERS) - set(TRITON_PARAMETERS))
    if unknown:
        raise ConfigError(f"unknown config parameter(s) {', '.join(unknown)}: the models read "
                          f"{', '.join(PARSERS)} (and Triton's {', '.join(TRITON_PARAMETERS)})")
    values = {key: PARSERS[key](value) for key, value in raw.items() if key in PARSERS}
    config = EngineConfig(**values)
    defaults = EngineConfig()
    for key, engines in APPLIES_TO.items():
        # A default left in place is no contradiction (engine switched to torch, conv_path still auto).
        if key in values and config.engine not in engines and values[key] != getattr(defaults, key):
            raise ConfigError(f"config parameter {key} applies to engine {' or '.join(engines)}, "
                              f"not to engine {config.engine}")
    return config
