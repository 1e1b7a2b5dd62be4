"""The A/B router: `resnet18_ab`, a Triton C++ backend that sends each request to cuDNN and custom in shadow or
split mode (docs/AB_LIVE.md; issue 47: a room per role). Each module imports only those before it:

    config             the router's config parameters, parsed once into a validated RouterConfig, and sticky_share
                       (standard library only: client.ab_mode checks a change with it before it sends it)
    build              the backend's build: the facts it takes from the wire contract and `config` as a generated
                       header, compiled with the C++ compiler alone (python -m fusedresnet.backend.ab_router.build)
    ab_router_backend/ the C++ source (ab_router.cc), Triton's r24.10 API headers (include/, which the in-process
                       front end's shim compiles against too) and the vendored RapidJSON and BLAKE2 (third_party/)

It stands on the wire contract (`fusedresnet.backend.spec`) and the native builds' shared pattern
(`fusedresnet.backend.native_build`); the launcher builds it, lazily, where its repository serves the router. This
file imports nothing, so a client-only install reads `config` without the server's packages.
"""
