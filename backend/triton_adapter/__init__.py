"""The Triton adapter: what runs inside a Python-backend stub to serve an engine (issue 47: a room per role). Each
module imports only those before it:

    pinned_shm    the Python backend's shared memory, page-locked for the GPU (needs torch)
    python_model  the Python-backend model every model_repository/*/1/model.py delegates to: ResNetTritonModel,
                  and model_of_network for the *_normalized entries

It stands on the engines (`fusedresnet.backend.engines`), which never import it. Finding the stubs of a running
server from outside is the launcher's (`fusedresnet.backend.launcher.stub_processes`). This file imports nothing:
python_model starts the early CUDA context (engines.cuda_context) before torch is imported, and an import here
would come first.
"""
