"""Facts about the served network and its interface, defined once.

Everything that a client, the server-side models, the tests and the load
tests must agree on lives here. Pure Python: clients import it without torch.
"""

import os
from pathlib import Path

# ImageNet preprocessing, exactly as torchvision's reference transforms:
# Resize(256) on the shorter side, CenterCrop(224), ToTensor, Normalize.
RESIZE_SHORTER_SIDE = 256
IMAGE_SIZE = 224
CHANNELS = 3
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NUM_CLASSES = 1000
LABELS_FILE = Path(__file__).with_name("imagenet_classes.txt")

# Triton model interface (identical for both networks, so a client switches by name).
MODEL_CUSTOM = "resnet18_custom"
MODEL_CUDNN = "resnet18_cudnn"
MODELS = (MODEL_CUSTOM, MODEL_CUDNN)   # the networks; each is served as one model entry per input
# A model instance's load line names where its start went, after this text (campaigns/front_door.py reads it):
# "... loaded and warmed up in 2.1 s (start phases: stub start and imports 1.20 s, CUDA context 0.31 s, ...)"
STARTUP_PHASES_TEXT = "start phases"
INPUT_UINT8 = "IMAGE"                  # UINT8 [224, 224, 3], HWC, RGB, not normalised
INPUT_FP32 = "IMAGE_NORMALIZED"        # FP32 [3, 224, 224], CHW, normalised by the client
INPUTS = (INPUT_UINT8, INPUT_FP32)     # the input kinds
# each input's shape per image (the config's dims; requests add the batch dimension in front)
INPUT_SHAPES = {INPUT_UINT8: (IMAGE_SIZE, IMAGE_SIZE, CHANNELS), INPUT_FP32: (CHANNELS, IMAGE_SIZE, IMAGE_SIZE)}
# Each model entry declares exactly one input, required: Triton's own tools need that (perf_analyzer's
# shared-memory modes refuse models with optional inputs). A network's IMAGE entry bears the network's
# name; its IMAGE_NORMALIZED entry adds this suffix (resnet18_custom_normalized), same engine and weights.
NORMALIZED_ENTRY_SUFFIX = "_normalized"
# A model that only reads its input and answers zeros (loadtest/zero_model), served beside the shipped ones by
# the perf_analyzer and multi-GPU runs: the Python backend's ceiling on the host, measured with the same traffic.
ZERO_MODEL = "zero_answer"


def served_model(network: str, input_name: str = INPUT_UINT8) -> str:
    """The Triton model entry that serves `network` (one of MODELS, or already an entry) on `input_name`."""
    network = network_of(network)
    if input_name == INPUT_UINT8:
        return network
    if input_name == INPUT_FP32:
        return network + NORMALIZED_ENTRY_SUFFIX
    raise ValueError(f"input must be one of {INPUTS}, not {input_name!r}")


def network_of(entry: str) -> str:
    """The network a model entry serves (resnet18_custom_normalized -> resnet18_custom)."""
    return entry.removesuffix(NORMALIZED_ENTRY_SUFFIX)


def entry_input(entry: str) -> str:
    """The one input a model entry declares."""
    return INPUT_FP32 if entry.endswith(NORMALIZED_ENTRY_SUFFIX) else INPUT_UINT8


MODEL_ENTRIES = tuple(served_model(network, name) for network in MODELS for name in INPUTS)  # all served entries
# The A/B router (docs/AB_LIVE.md): one more entry with the IMAGE contract that sends live traffic to both networks'
# entries (shadow) or splits it between them (split), or to one (primary). It is a Triton C++ backend of its own
# (backend/ab_router/ab_router_backend/, built by backend/ab_router/build.py, which hands it these facts as a header).
AB_ROUTER_MODEL = "resnet18_ab"
AB_ROUTER_BACKEND = "fusedresnet_ab"   # its config's `backend:`; <backends>/fusedresnet_ab/libtriton_fusedresnet_ab.so
SERVED_ENTRIES = (*MODEL_ENTRIES, AB_ROUTER_MODEL)   # every entry of model_repository/
AB_MODES = ("shadow", "split", "primary")
# A request parameter that names the client: a split sends every request with the same value to the same arm
# (else the Triton request id decides, else chance).
AB_STICKY_PARAMETER = "ab_key"
# The router's own metrics (labels model, model_instance, and mode/arm where said). Counters are named as Triton
# and the models name theirs, without a _total suffix (prometheus_client's parser cannot tell the two apart).
# Histograms are written as Prometheus exposes them: <name>_bucket{le=...}, <name>_sum, <name>_count.
AB_REQUESTS_METRIC = "fusedresnet_ab_requests"                  # requests sent to each arm {mode, arm}
AB_FAILURES_METRIC = "fusedresnet_ab_arm_failures"              # of those, answered with an error {mode, arm}
AB_TIMEOUTS_METRIC = "fusedresnet_ab_shadow_timeouts"           # shadow copies not answered in time
AB_SKIPPED_METRIC = "fusedresnet_ab_shadow_skipped"             # shadow copies not sent (too many in flight)
AB_COMPARED_METRIC = "fusedresnet_ab_compared_requests"         # requests both arms answered, compared
AB_DISAGREEING_METRIC = "fusedresnet_ab_disagreeing_requests"   # of those, some image's top-1 differed
AB_IMAGES_METRIC = "fusedresnet_ab_compared_images"
AB_TOP1_AGREE_METRIC = "fusedresnet_ab_top1_agree_images"
AB_LATENCY_METRIC = "fusedresnet_ab_arm_latency_seconds"        # histogram per request {mode, arm}
AB_TOP5_OVERLAP_METRIC = "fusedresnet_ab_top5_overlap"          # histogram per request: shared top-5 classes
AB_REL_L2_METRIC = "fusedresnet_ab_logits_rel_l2"               # histogram per request: |c - p| / |p|
AB_HISTOGRAM_METRICS = (AB_LATENCY_METRIC, AB_TOP5_OVERLAP_METRIC, AB_REL_L2_METRIC)
HISTOGRAM_SERIES = ("bucket", "sum", "count")   # <histogram>_bucket, _sum, _count
AB_ARMS = ("primary", "candidate")
AB_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
AB_TOP5_OVERLAP_BUCKETS = (0, 1, 2, 3, 4, 4.5, 5)   # mean shared classes of a request's images (4.5: one image off)
AB_REL_L2_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
AB_TOP_K = 5                       # the compared top-k (top-5 overlap, the record's top-5)
AB_LOG_EVERY_S = 1.0               # at most one log line a second about disagreements
OUTPUT_LOGITS = "LOGITS"               # FP32 [1000]
# Normalised pixels lie within about -2.2..2.7. Far larger finite values (0..255 floats sent by
# mistake, or 1e30) would come back as meaningless or non-finite logits (fp16 engines overflow
# past 65504), so they are refused like NaN/Inf.
FP32_INPUT_ABS_LIMIT = 100.0
# Smallest H and W the fused engine (and its nn.Module) takes: five stride-2 stages leave 1x1.
MIN_INPUT_SIZE = 32
# Phases of a model's execute(), timed and added to Triton's metrics endpoint as this counter
# (microseconds, labels METRIC_LABELS and phase); h2d/engine/d2h are GPU time between CUDA events.
EXECUTE_PHASE_METRIC = "fusedresnet_execute_phase_us"
EXECUTE_PHASES = ("read", "gather", "h2d", "engine", "d2h", "respond")
# Images and engine runs (one per input kind in an execute()) of each instance (labels METRIC_LABELS):
# Triton's own per-model counters carry no GPU label in this build, so these tell how GPUs share
# the work. Written with the phases, at most every METRICS_FLUSH_S (each update is a message from the
# stub to the server) and at unload, so they lag by up to that.
METRICS_FLUSH_S = 0.5
IMAGES_METRIC = "fusedresnet_images"
EXECUTIONS_METRIC = "fusedresnet_executions"
# Labels of the models' own metrics. Not "instance": Prometheus renames a scraped "instance" label
# (it names the scrape target); gpu_uuid as Triton's GPU gauges write it ("GPU-..."), empty on a CPU.
GPU_UUID_LABEL = "gpu_uuid"
METRIC_LABELS = ("model", "model_instance", "device", GPU_UUID_LABEL)
OUTPUT_ENGINE = "ENGINE"               # UINT8 [-1]: UTF-8 name of the engine that computed the response

# Files that `prepare` writes into each model's version folder.
TORCHSCRIPT_FILE = "resnet18_traced.pt"
FOLDED_PARAMS_FILE = "resnet18_folded.pt"
LABELS_FILENAME = "labels.txt"         # the config.pbtxt `label_filename`

# Server defaults: loopback only unless the user says otherwise.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002


def metrics_url(host: str, port: int) -> str:
    """Triton's Prometheus endpoint on `host`:`port`."""
    return f"http://{host}:{port}/metrics"


DEFAULT_GRPC_URL = f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}"
DEFAULT_METRICS_URL = metrics_url(DEFAULT_HOST, DEFAULT_METRICS_PORT)
ADMIN_TOKEN_ENV = "FUSEDRESNET_ADMIN_TOKEN"
ADMIN_TOKEN_HEADER = "admin-key"      # HTTP header; gRPC metadata key is GRPC_ADMIN_TOKEN_HEADER
GRPC_ADMIN_TOKEN_HEADER = "triton-grpc-protocol-" + ADMIN_TOKEN_HEADER  # Triton's gRPC frontend prefixes it
# Triton endpoints that only the holder of the admin token may call.
RESTRICTED_APIS = ("model-repository", "shared-memory", "statistics", "trace", "logging")

# The installed package: the checkout itself under an editable install (`make setup`), else
# site-packages/fusedresnet. The sample photos are package data, so they are found either way.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = PACKAGE_ROOT / "client" / "samples"
# The checkout: it holds the model repository and build/. An editable install knows it; a regular
# install takes $FUSEDRESNET_HOME, else the working directory.
PROJECT_HOME_ENV = "FUSEDRESNET_HOME"
REPO_ROOT = Path(os.environ.get(PROJECT_HOME_ENV)
                 or (PACKAGE_ROOT if (PACKAGE_ROOT / "model_repository").is_dir() else Path.cwd())).resolve()
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
BUILD_DIR = REPO_ROOT / "build"
# The A/B router's bounded record of disagreeing requests: one JSON file per router instance.
AB_DISAGREEMENTS_DIR = BUILD_DIR / "ab_disagreements"


def model_config(model: str, repository: Path = MODEL_REPOSITORY):
    """The model's `config.pbtxt` as Triton's ModelConfig message (the one place its batch limit is set)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    return text_format.Parse((Path(repository) / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def max_batch_size(model: str = MODEL_CUSTOM, repository: Path = MODEL_REPOSITORY) -> int:
    """`max_batch_size` of the model's config (both models declare the same)."""
    return model_config(model, repository).max_batch_size


def power_of_two_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `limit`: the batch sizes the fused engine captures a CUDA graph for."""
    return tuple(2 ** i for i in range(limit.bit_length()) if 2 ** i <= limit)


def load_labels():
    """The 1000 ImageNet class names, in class-index order."""
    return LABELS_FILE.read_text().splitlines()
