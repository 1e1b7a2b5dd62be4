"""The files through which the locust processes of one step hand their records to the sweep.

Plain constants, so the sweep can read them without importing locust (which
monkey-patches the standard library with gevent on import).
"""

MEASURE_START_MARKER = "measure-start"   # holds the epoch time the measurement window opened
MEASURE_END_MARKER = "measure-end"       # ... and closed
REQUEST_LOG_PATTERN = "requests-*.npz"   # one per locust process that ran users
LOCUST_JSON_STEM = "locust"              # --json-file: locust's own final stats, locust.json
LOCUST_LOG = "locust.log"                # locust's stdout and stderr
WARMUP_SUFFIX = " (warm-up)"             # locust entry name suffix of requests finished during warm-up

# A step record's load_generator: which tool drove it (grpc_flood imports the step's helpers, so the name lives here)
LOCUST = "locust"
GRPC_FLOOD = "grpc_flood"


def request_log_name(pid: int) -> str:
    return REQUEST_LOG_PATTERN.replace("*", str(pid))
