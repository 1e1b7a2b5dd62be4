"""The Triton server the launcher runs, and the front ends it answers through (issue 47: a room per role). Each
module imports only those before it:

    installation         where `tritonserver` comes from ($TRITON_HOME, PATH or the nvidia-pytriton wheel), the
                         private backend tree with this interpreter's Python-backend stub, the host's GPUs
    frontend_shim_build  the in-process front end's shim (frontend_shim/frontend_shim.cc), built with the C++
                         compiler alone (python -m fusedresnet.backend.triton_server.frontend_shim_build)
    front_end            which front end serves here: Triton 2.73's frontends in-process, or the tritonserver binary
    inprocess_server     the in-process server: the 2.51 core behind Triton 2.73's frontends in one Python process
                         (python -m fusedresnet.backend.triton_server.inprocess_server, started by the launcher)

It stands on the launcher's error (`fusedresnet.backend.server_error`), the wire contract and the native builds'
shared pattern; the launcher (`fusedresnet.backend.launcher`) runs what it finds, and nothing here imports the
launcher or the A/B router (the launcher hands the router's library to `installation.private_backend_tree`). This
file imports nothing.
"""
