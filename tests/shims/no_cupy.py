"""Imported first, this module makes `import cupy` fail in its interpreter, as on a machine where CuPy was
never installed: the fused engine's missing-dependency path, tested on any host (tests/test_engine_config.py).

Triton's Python stubs run isolated (PYTHONPATH and sitecustomize are ignored), but a model's own folder is on
their sys.path: a test's copy of a model holds this file and imports it before the real model.py's code."""

import importlib.abc
import sys

BLOCKED = "cupy"
MARK = "blocked by tests/shims/no_cupy.py"


class BlockCupy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == BLOCKED or name.startswith(BLOCKED + "."):
            raise ModuleNotFoundError(f"No module named {name!r} ({MARK})", name=name)
        return None


sys.meta_path.insert(0, BlockCupy())
