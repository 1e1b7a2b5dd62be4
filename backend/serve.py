"""The launcher: `python -m fusedresnet.backend.serve [--host 127.0.0.1] [--http-port 8000] ...` starts the real
Triton Inference Server on the model repository and supervises it (`--help`; backend/launcher/ says how, module by
module). A program starts one the same way, with the same settings, through the names importable here:
`launch(ServerSettings(...))` (the started, ready group of processes; a context manager that stops it), or
`LaunchedServer(settings, output_file)` for this command in a subprocess (its arguments: `settings.cli_args()`).
"""

import sys

from .launcher import *  # noqa: F403 - the launcher's public names (backend/launcher/__init__.py: __all__)
from .launcher import __all__  # noqa: F401
from .launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
