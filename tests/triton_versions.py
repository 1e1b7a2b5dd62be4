"""Which Triton each path runs, for the tests that check deployment files against the pip path's server.

The image runs NGC tritonserver IMAGE_TRITON (Triton 2.73.0); the pip path (nvidia-pytriton 0.7.0) runs 2.51,
which lacks some flags the deployment files pass: IMAGE_ONLY_TRITON_FLAGS, each with the release that added
it (the server's src/command_line_parser.cc), so 2.51's --help cannot vouch for them and a 2.51 server given
them refuses to start.
"""

IMAGE_TRITON = "26.08"
IMAGE_ONLY_TRITON_FLAGS = {"--http-max-input-size": "25.06", "--allow-client-shm": "26.04",
                           "--grpc-infer-thread-count": "25.04"}


def flags_for_pip_triton(args: list[str]) -> list[str]:
    """`args` without the flags that only the image's newer Triton knows."""
    return [arg for arg in args if arg.split("=", 1)[0] not in IMAGE_ONLY_TRITON_FLAGS]
