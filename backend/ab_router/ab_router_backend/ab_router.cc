// The A/B router (`resnet18_ab`, docs/AB_LIVE.md) as a Triton C++ backend, `fusedresnet_ab`.
//
// It runs inside tritonserver: a request reaches the arms through Triton's in-process API
// (TRITONSERVER_ServerInferAsync, the C++ form of a BLS call), with no Python stub of its own on the path.
// Nothing here waits: `execute` hands each batch to its arm(s) and returns, and the arms' answers come back on
// Triton's threads (the response callbacks), which answer the router's requests, send the shadow copy and
// compare.
//
// Its parameters (config.pbtxt, checked at load as backend/ab_config.py checks them for client.ab_mode):
//   mode                  shadow | split | primary
//   primary, candidate    the two arms' model entries (the IMAGE contract)
//   candidate_percent     split: the share of requests to the candidate (sticky per ab_key or request id)
//   shadow_timeout_ms     shadow: the candidate call's deadline from its start (also its queue timeout)
//   shadow_max_in_flight  shadow: batches awaited at the candidate at once per instance; beyond, not shadowed
//   disagreement_records  disagreeing requests kept per instance (a JSON file, rewritten every flush)
//
// How a batch flows:
//   - Each batch (the requests Triton's dynamic batcher gave `execute`) goes to an arm as ONE call whose input is
//     the requests' own input buffers appended one after the other (no copy in the router).
//   - shadow: the batch goes to the primary; when it answers, each request gets its rows of the answer, and then
//     the same batch goes to the candidate (unless shadow_max_in_flight batches are there already: skipped). The
//     candidate's answer is compared with the primary's, per request: images whose top-1 agree, mean shared top-5,
//     relative L2 of the logits. A candidate call unanswered at its deadline is counted as a timeout (by the
//     flush thread, within kFlushS) and its late answer is not compared. Nothing about the candidate can fail or
//     delay the client's answer: it is sent before the candidate's call leaves.
//   - split: each request goes to one arm (sticky: the blake2b share of its ab_key parameter, else of its request
//     id, the same as ab_config.sticky_share; else chance); each arm gets one call of its requests, both at once.
//   - primary: every request to the primary.
//   - The arm reads the requests' input buffers in place. A request is answered and released the moment its arm
//     answers: its buffers may be reused by the frontend then (Triton 2.51's gRPC frontend recycles a call's
//     memory once its response is written), so in shadow mode the router copies the batch's input for the
//     candidate while the primary computes (in execute, after the primary's call left), unless the candidate has
//     shadow_max_in_flight batches already.
//
// Metrics (names from backend/spec.py, labels model and model_instance) go straight to Triton's metrics
// registry (in-process, an atomic add each). Disagreeing requests (request id, both top-5 of each disagreeing
// image) are kept, the last `disagreement_records`, in <disagreements-dir>/<instance>-server<pid>.json
// (the backend's command-line config `disagreements-dir`, which the launcher sets) and logged, at most a line
// every kLogEveryS.

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ab_router_spec.h"  // generated from backend/spec.py and backend/ab_config.py (ab_router_build.py)
#include "blake2.h"  // BLAKE2's reference code, vendored in third_party/blake2
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"
#include "triton/core/tritonbackend.h"
#include "triton/core/tritonserver.h"

namespace {

using Clock = std::chrono::steady_clock;

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void Log(TRITONSERVER_LogLevel level, const std::string& message) {
  TRITONSERVER_Error* error = TRITONSERVER_LogMessage(level, __FILE__, __LINE__, message.c_str());
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
}

// The message of `error`, which is deleted.
std::string TakeMessage(TRITONSERVER_Error* error) {
  std::string message = TRITONSERVER_ErrorMessage(error);
  TRITONSERVER_ErrorDelete(error);
  return message;
}

void LogIfError(TRITONSERVER_Error* error, const std::string& what) {
  if (error != nullptr) Log(TRITONSERVER_LOG_ERROR, what + ": " + TakeMessage(error));
}

#define RETURN_IF_ERROR(X)                  \
  do {                                      \
    TRITONSERVER_Error* error__ = (X);      \
    if (error__ != nullptr) return error__; \
  } while (false)

TRITONSERVER_Error* InvalidArg(const std::string& message) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, message.c_str());
}

std::string PythonRepr(const std::string& text) {  // Python's repr() of a str, as ab_config's messages quote values
  bool doubles = text.find('\'') != std::string::npos && text.find('"') == std::string::npos;
  char quote = doubles ? '"' : '\'';
  std::string out(1, quote);
  for (char c : text) {
    if (c == '\\' || c == quote) out += '\\';
    out += c;
  }
  return out + quote;
}

std::string PythonList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + PythonRepr(items[i]);
  return out + "]";
}

std::string FormatG(double value) {  // Python's f"{value:g}" (log lines)
  char text[64];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

std::string PythonFloat(double value) {  // Python's repr() of a float: the shortest text that reads back the same
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(text, sizeof(text), "%.*g", precision, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::string out = text;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

// ---------------------------------------------------------------- the parameters

struct RouterConfig {
  std::string mode = spec::kDefaultMode;
  std::string primary = spec::kDefaultPrimary;
  std::string candidate = spec::kDefaultCandidate;
  double candidate_percent = spec::kDefaultCandidatePercent;
  double shadow_timeout_ms = spec::kDefaultShadowTimeoutMs;
  int64_t shadow_max_in_flight = spec::kDefaultShadowMaxInFlight;
  int64_t disagreement_records = spec::kDefaultDisagreementRecords;
};

std::string Strip(const std::string& text) {  // ab_config.ASCII_SPACE
  const char* space = " \t\n\r\f\v";
  size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// The texts a parameter's number may be: ab_config.INTEGER and ab_config.NUMBER (ASCII digits, no underscores, no
// hexadecimal, no inf or nan), so that client.ab_mode's check and this one take the same texts.
const std::regex kInteger(spec::kIntegerPattern);
const std::regex kNumber(spec::kNumberPattern);

bool ParseInteger(const std::string& text, int64_t* value) {
  std::string stripped = Strip(text);
  if (!std::regex_match(stripped, kInteger)) return false;
  errno = 0;
  long long parsed = std::strtoll(stripped.c_str(), nullptr, 10);
  // Beyond int64: out of every range checked below, as Python's int is.
  *value = errno == ERANGE ? (stripped[0] == '-' ? INT64_MIN : INT64_MAX) : parsed;
  return true;
}

bool ParseNumber(const std::string& text, double* value) {
  std::string stripped = Strip(text);
  if (!std::regex_match(stripped, kNumber)) return false;
  *value = std::strtod(stripped.c_str(), nullptr);  // 1e999: inf, refused below as Python's float gives inf
  return true;
}

// The parameters of a model config (Triton's JSON form), validated as ab_config.parse_router_config validates
// them; an error names the parameter.
TRITONSERVER_Error* ParseRouterConfig(const rapidjson::Document& model_config, RouterConfig* config) {
  std::map<std::string, std::string> raw;
  if (model_config.HasMember("parameters") && model_config["parameters"].IsObject()) {
    for (const auto& member : model_config["parameters"].GetObject()) {
      std::string value;
      if (member.value.IsObject() && member.value.HasMember("string_value") &&
          member.value["string_value"].IsString()) {
        value = member.value["string_value"].GetString();
      }
      raw[member.name.GetString()] = value;
    }
  }
  std::vector<std::string> known(std::begin(spec::kParameters), std::end(spec::kParameters));
  std::vector<std::string> unknown;
  for (const auto& entry : raw) {
    if (std::find(known.begin(), known.end(), entry.first) == known.end()) unknown.push_back(entry.first);
  }
  if (!unknown.empty()) {
    return InvalidArg("unknown parameter(s) " + PythonList(unknown) + "; the router takes " + PythonList(known));
  }
  for (const auto& entry : raw) {
    const std::string& key = entry.first;
    const std::string& text = entry.second;
    if (key == "mode") {
      config->mode = Strip(text);
    } else if (key == "primary") {
      config->primary = Strip(text);
    } else if (key == "candidate") {
      config->candidate = Strip(text);
    } else if (key == "shadow_max_in_flight" || key == "disagreement_records") {
      int64_t value;
      if (!ParseInteger(text, &value)) {
        return InvalidArg("parameter " + key + ": " + PythonRepr(text) + " is not an integer");
      }
      (key == "shadow_max_in_flight" ? config->shadow_max_in_flight : config->disagreement_records) = value;
    } else {
      double value;
      if (!ParseNumber(text, &value)) {
        return InvalidArg("parameter " + key + ": " + PythonRepr(text) + " is not a number");
      }
      if (!std::isfinite(value)) {
        return InvalidArg("parameter " + key + ": " + PythonRepr(text) + " is not a finite number");
      }
      (key == "candidate_percent" ? config->candidate_percent : config->shadow_timeout_ms) = value;
    }
  }
  std::vector<std::string> modes(std::begin(spec::kModes), std::end(spec::kModes));
  struct Check {
    const char* key;
    bool ok;
    std::string value;
    std::string allowed;
  };
  const Check checks[] = {
      {"mode", std::find(modes.begin(), modes.end(), config->mode) != modes.end(), PythonRepr(config->mode),
       "one of " + PythonList(modes)},
      {"primary", !config->primary.empty(), PythonRepr(config->primary), "a model entry's name"},
      {"candidate", !config->candidate.empty() && config->candidate != config->primary,
       PythonRepr(config->candidate), "a model entry's name other than primary's"},
      {"candidate_percent", config->candidate_percent >= 0 && config->candidate_percent <= 100,
       PythonFloat(config->candidate_percent), "a percentage, 0 to 100"},
      {"shadow_timeout_ms",
       config->shadow_timeout_ms >= spec::kShadowTimeoutMsMin && config->shadow_timeout_ms <= spec::kShadowTimeoutMsMax,
       PythonFloat(config->shadow_timeout_ms), spec::kShadowTimeoutAllowed},
      {"shadow_max_in_flight",
       config->shadow_max_in_flight >= 1 && config->shadow_max_in_flight <= spec::kShadowMaxInFlightMax,
       std::to_string(config->shadow_max_in_flight), spec::kShadowMaxInFlightAllowed},
      {"disagreement_records",
       config->disagreement_records >= 0 && config->disagreement_records <= spec::kDisagreementRecordsMax,
       std::to_string(config->disagreement_records), spec::kDisagreementRecordsAllowed},
  };
  for (const Check& check : checks) {
    if (!check.ok) {
      return InvalidArg(std::string("parameter ") + check.key + ": " + check.value + " is not allowed; expected " +
                        check.allowed);
    }
  }
  return nullptr;
}

// Where `key` falls in 0..100 (percent): ab_config.sticky_share (blake2b, 8-byte digest, big-endian).
double StickyShare(const std::string& key) {
  uint8_t digest[8];
  blake2b(digest, sizeof(digest), key.data(), key.size(), nullptr, 0);
  uint64_t value = 0;
  for (uint8_t byte : digest) value = (value << 8) | byte;
  return static_cast<double>(value % spec::kStickyBuckets) * 100.0 / spec::kStickyBuckets;
}

// ---------------------------------------------------------------- metrics

// Every metric family and series the backend made, kept for the life of the backend and shared by every instance
// with the same labels: Triton 2.51 counts a series' holders per family object, so a series made through two
// families of one name (a reloaded instance's and the old one's) is freed when one of them deletes it, while the
// other still counts into it (a crash, seen), so the router deletes nothing until it unloads
// (TRITONBACKEND_Finalize). A reload thus continues the same counters, as Prometheus expects of a counter.
std::mutex g_metrics_mutex;
std::map<std::string, TRITONSERVER_MetricFamily*> g_metric_families;
std::map<std::string, TRITONSERVER_Metric*> g_metric_series;

// A metric series, or nothing when the server has no metrics (every update is then a no-op).
class Series {
 public:
  Series() = default;
  explicit Series(TRITONSERVER_Metric* metric) : metric_(metric) {}
  void Add(double value) {
    if (metric_ != nullptr && value != 0) LogIfError(TRITONSERVER_MetricIncrement(metric_, value), "metric");
  }
  void Observe(double value, int64_t count = 1) {  // `count` observations of `value`
    for (int64_t i = 0; metric_ != nullptr && i < count; ++i) {
      LogIfError(TRITONSERVER_MetricObserve(metric_, value), "metric");
    }
  }

 private:
  TRITONSERVER_Metric* metric_ = nullptr;
};

// The series of `name` with `labels` (made the first time), or none when the server has no metrics.
Series MakeSeries(const char* name, const char* description, const std::map<std::string, std::string>& labels,
                  const std::vector<double>* buckets) {
  std::lock_guard<std::mutex> lock(g_metrics_mutex);
  std::string key = name;
  for (const auto& label : labels) key += "\n" + label.first + "=" + label.second;
  auto found = g_metric_series.find(key);
  if (found != g_metric_series.end()) return Series(found->second);
  TRITONSERVER_MetricFamily*& family = g_metric_families[name];
  if (family == nullptr) {
    TRITONSERVER_Error* error = TRITONSERVER_MetricFamilyNew(
        &family, buckets != nullptr ? TRITONSERVER_METRIC_KIND_HISTOGRAM : TRITONSERVER_METRIC_KIND_COUNTER, name,
        description);
    if (error != nullptr) {
      family = nullptr;
      Log(TRITONSERVER_LOG_WARN, std::string("A/B router: metric ") + name + " not made: " + TakeMessage(error));
      return Series();
    }
  }
  std::vector<const TRITONSERVER_Parameter*> parameters;
  for (const auto& label : labels) {
    parameters.push_back(
        TRITONSERVER_ParameterNew(label.first.c_str(), TRITONSERVER_PARAMETER_STRING, label.second.c_str()));
  }
  TRITONSERVER_MetricArgs* args = nullptr;
  TRITONSERVER_Error* error = nullptr;
  if (buckets != nullptr) {
    error = TRITONSERVER_MetricArgsNew(&args);
    if (error == nullptr) error = TRITONSERVER_MetricArgsSetHistogram(args, buckets->data(), buckets->size());
  }
  TRITONSERVER_Metric* metric = nullptr;
  if (error == nullptr) {
    error = buckets != nullptr
                ? TRITONSERVER_MetricNewWithArgs(&metric, family, parameters.data(), parameters.size(), args)
                : TRITONSERVER_MetricNew(&metric, family, parameters.data(), parameters.size());
  }
  if (args != nullptr) LogIfError(TRITONSERVER_MetricArgsDelete(args), "metric arguments");
  for (const TRITONSERVER_Parameter* parameter : parameters) {
    TRITONSERVER_ParameterDelete(const_cast<TRITONSERVER_Parameter*>(parameter));
  }
  if (error != nullptr) {
    Log(TRITONSERVER_LOG_WARN, std::string("A/B router: a series of ") + name + " not made: " + TakeMessage(error));
    return Series();
  }
  g_metric_series[key] = metric;
  return Series(metric);
}

void DeleteMetrics() {  // the series before their families (Triton requires that order)
  std::lock_guard<std::mutex> lock(g_metrics_mutex);
  for (auto& series : g_metric_series) LogIfError(TRITONSERVER_MetricDelete(series.second), "metric delete");
  for (auto& family : g_metric_families) {
    if (family.second != nullptr) LogIfError(TRITONSERVER_MetricFamilyDelete(family.second), "metric family delete");
  }
  g_metric_series.clear();
  g_metric_families.clear();
}

// One instance's series (labels model and model_instance; mode and arm where said).
class Metrics {
 public:
  Metrics(const std::string& model, const std::string& instance, const std::string& mode) : mode_(mode) {
    base_ = {{"model", model}, {"model_instance", instance}};
    std::vector<std::string> arms = {"primary"};
    if (mode != "primary") arms.push_back("candidate");
    for (const std::string& arm : arms) {
      requests[arm] = Make(spec::kRequestsMetric, "Requests the A/B router sent to each arm", arm);
      failures[arm] = Make(spec::kFailuresMetric, "Requests an arm answered with an error (for the router)", arm);
      latency[arm] = Make(spec::kLatencyMetric,
                          "Seconds each arm took to answer the router's batched call, per request", arm,
                          &latency_buckets_);
    }
    if (mode == "shadow") {
      timeouts = Make(spec::kTimeoutsMetric, "Shadow requests the candidate did not answer within shadow_timeout_ms");
      skipped = Make(spec::kSkippedMetric, "Shadow requests not sent: shadow_max_in_flight batches awaited already");
      compared = Make(spec::kComparedMetric, "Requests answered by both arms and compared");
      disagreeing = Make(spec::kDisagreeingMetric, "Compared requests with an image whose top-1 class differs");
      images = Make(spec::kImagesMetric, "Images compared");
      top1_agree = Make(spec::kTop1AgreeMetric, "Compared images whose top-1 class is the same in both arms");
      top5_overlap = Make(spec::kTop5OverlapMetric, "Top-5 classes both arms share, mean over a request's images",
                          "", &top5_buckets_);
      rel_l2 = Make(spec::kRelL2Metric, "Relative L2 distance of the candidate's logits to the primary's, per request",
                    "", &rel_l2_buckets_);
    }
  }

  std::map<std::string, Series> requests, failures, latency;
  Series timeouts, skipped, compared, disagreeing, images, top1_agree, top5_overlap, rel_l2;

 private:
  Series Make(const char* name, const char* description, const std::string& arm = "",
              const std::vector<double>* buckets = nullptr) {
    std::map<std::string, std::string> labels = base_;
    if (!arm.empty()) {
      labels["mode"] = mode_;
      labels["arm"] = arm;
    }
    return MakeSeries(name, description, labels, buckets);
  }

  std::string mode_;
  std::map<std::string, std::string> base_;
  const std::vector<double> latency_buckets_{std::begin(spec::kLatencyBucketsS), std::end(spec::kLatencyBucketsS)};
  const std::vector<double> top5_buckets_{std::begin(spec::kTop5OverlapBuckets), std::end(spec::kTop5OverlapBuckets)};
  const std::vector<double> rel_l2_buckets_{std::begin(spec::kRelL2Buckets), std::end(spec::kRelL2Buckets)};
};

// ---------------------------------------------------------------- the output of an arm's call

TRITONSERVER_Error* AllocateOutput(TRITONSERVER_ResponseAllocator*, const char*, size_t byte_size,
                                   TRITONSERVER_MemoryType, int64_t, void*, void** buffer, void** buffer_userp,
                                   TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id) {
  *actual_memory_type = TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = 0;
  *buffer_userp = nullptr;
  *buffer = byte_size == 0 ? nullptr : std::malloc(byte_size);
  if (byte_size != 0 && *buffer == nullptr) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, "A/B router: out of memory for an arm's output");
  }
  return nullptr;
}

TRITONSERVER_Error* ReleaseOutput(TRITONSERVER_ResponseAllocator*, void* buffer, void*, size_t, TRITONSERVER_MemoryType,
                                  int64_t) {
  std::free(buffer);
  return nullptr;
}

TRITONSERVER_ResponseAllocator* g_allocator = nullptr;  // made in TRITONBACKEND_Initialize
std::string g_disagreements_dir = "build/ab_disagreements";

// Copy between host memory and a buffer that a client's CUDA shared memory may put on a GPU (`on_gpu`: an input
// read, or an output written, there): then through cudaMemcpy of the CUDA runtime tritonserver has loaded.
TRITONSERVER_Error* CopyBytes(void* destination, const void* source, size_t bytes, bool on_gpu) {
  if (!on_gpu) {
    std::memcpy(destination, source, bytes);
    return nullptr;
  }
  using Memcpy = int (*)(void*, const void*, size_t, int);
  static Memcpy cuda_memcpy = reinterpret_cast<Memcpy>(dlsym(RTLD_DEFAULT, "cudaMemcpy"));
  if (cuda_memcpy == nullptr) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "A/B router: a tensor in GPU memory, and no CUDA runtime");
  }
  constexpr int kCudaMemcpyDefault = 4;
  if (cuda_memcpy(destination, source, bytes, kCudaMemcpyDefault) != 0) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "A/B router: cudaMemcpy failed");
  }
  return nullptr;
}

struct Tensor {  // an output of an arm's answer
  const void* base = nullptr;
  std::vector<int64_t> shape;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  size_t byte_size = 0;
  size_t RowBytes() const { return shape.empty() || shape[0] == 0 ? 0 : byte_size / shape[0]; }
};

// ---------------------------------------------------------------- one router instance

// The disagreement record of one file (<model instance>-server<pid>.json), shared by the instances that write it: an
// instance and the one that replaces it at a reload have the same name, and go on with the same record.
struct RecordStore {
  std::mutex mutex;  // the records, and the file's writing
  std::deque<std::string> records;
  bool changed = false;
};
std::mutex g_records_mutex;
std::map<std::string, std::shared_ptr<RecordStore>> g_records;

std::shared_ptr<RecordStore> RecordOf(const std::string& file) {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  std::shared_ptr<RecordStore>& store = g_records[file];
  if (!store) store = std::make_shared<RecordStore>();
  return store;
}

// Threads that run posted jobs in order of posting (the router's sends to the arms).
class Workers {
 public:
  explicit Workers(int count) {
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Workers() { Stop(); }
  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
  }
  void Stop() {  // after the jobs posted
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The router's calls leave from threads of its own: TRITONSERVER_ServerInferAsync can block. Triton 2.51's
// dynamic batcher takes, while it enqueues a request, the lock of its current batch, which is held while that batch
// executes: a send waits out the arm's batch in progress (measured on a 2-core CPU: p90 8 ms, up to 39 ms).
// Neither the router's execute (one thread per instance: the router's queue grew, its batches reached 128
// images) nor an arm's thread that delivers its answer (the shadow call: the primary waited for the candidate's
// batch) may wait so. Enough threads for the calls a busy server has waiting at the arms' schedulers at once.
constexpr int kSenderThreads = 8;  // per arm
constexpr int64_t kComparisonsQueued = 4;  // comparisons waiting, per shadow_max_in_flight

class Instance;

struct InputChunk {
  const void* base;
  uint64_t byte_size;
  TRITONSERVER_MemoryType memory_type;
  int64_t memory_type_id;
};

// A host buffer for a batch's shadow copy. Kept for the next batch when it is returned (Instance::ReturnBuffer):
// a fresh multi-megabyte allocation per batch costs page faults, and its release TLB shootdowns on every core the
// server's threads run on (a shadow sweep at 32 images per request on an H200 ran at a third of the direct
// calls' throughput so).
struct Buffer {
  std::unique_ptr<uint8_t[]> data;
  size_t capacity = 0;
};

// Requests of one execute() given to one arm. The requests are answered and released when the arm answers
// (Instance::Answer); what the shadow call needs is kept here (a copy of the input) until its comparison is done.
struct Batch {
  Instance* instance = nullptr;
  std::string arm;  // "primary" or "candidate": whose answer the requests get
  std::vector<TRITONBACKEND_Request*> requests;  // until answered
  // The shadow copy against the primary's answer, which may come first: the answer waits for a copy pending or
  // running (it reads the requests' buffers, which answering them frees), unless it comes on the very sender thread
  // that is to make the copy, inside the send (a response from a cache): then it cancels it (not shadowed).
  enum class Copy { kNone, kPending, kRunning, kDone, kFailed, kCancelled };
  std::mutex copy_mutex;
  std::condition_variable copy_done;
  Copy copy = Copy::kNone;
  std::thread::id copier;                // the sender thread that makes the copy
  std::unique_ptr<Buffer> input_copy;    // shadow: the requests' inputs, for the candidate's call
  size_t input_bytes = 0;
  std::vector<int64_t> rows;             // images of each request
  std::vector<std::string> request_ids;
  std::vector<InputChunk> chunks;        // every request's input buffers, in order
  std::vector<int64_t> image_dims;       // an image's shape ([224, 224, 3])
  int64_t total_rows = 0;
  uint64_t exec_start_ns = 0;
  std::atomic<uint64_t> sent_ns{0};      // execute is done with it (its call sent, the shadow copy made)
  std::vector<float> primary_logits;     // shadow: kept for the comparison
  int64_t classes = 0;
  ~Batch();
};

struct Call {  // one call of a batch at an arm
  std::shared_ptr<Batch> batch;
  std::string arm;                       // the arm called
  bool shadow = false;
  uint64_t start_ns = 0;
  Clock::time_point deadline;
  bool settled = false;                  // shadow: answered or counted late (under the instance's shadow lock)
  bool answered = false;                 // a response came (only the response callback touches it)
  std::atomic<int> pending{2};           // the response callback and the release callback
};

class Instance {
 public:
  Instance(TRITONBACKEND_ModelInstance* instance, const std::string& model_name, const std::string& name,
           const RouterConfig& config, TRITONSERVER_Server* server)
      : instance_(instance), model_name_(model_name), name_(name), config_(config), server_(server),
        metrics_(model_name, name, config.mode), random_(std::random_device{}()) {
    arm_models_["primary"] = config.primary;
    arm_models_["candidate"] = config.candidate;
    record_file_ = g_disagreements_dir + "/" + name + "-server" + std::to_string(getpid()) + ".json";
    record_ = RecordOf(record_file_);
    flusher_ = std::thread([this] { FlushLoop(); });
    comparer_ = std::thread([this] { CompareLoop(); });
    std::string says = model_name + ": A/B router (C++ backend), mode " + config.mode + ", primary " + config.primary +
                       ", candidate " + config.candidate;
    if (config.mode == "split") says += ", " + FormatG(config.candidate_percent) + " % to the candidate";
    if (config.mode == "shadow") {
      says += ", the candidate called once the client has its answer, its deadline " +
              FormatG(config.shadow_timeout_ms) + " ms";
    }
    Log(TRITONSERVER_LOG_INFO, says);
  }

  ~Instance() {
    {  // every batch handed to an arm is done first: its callbacks use this instance (said every minute)
      std::unique_lock<std::mutex> lock(batches_mutex_);
      while (!batches_done_.wait_for(lock, std::chrono::seconds(60), [this] { return batches_ == 0; })) {
        Log(TRITONSERVER_LOG_WARN, model_name_ + ": unloading waits for " + std::to_string(batches_) +
                                       " batches still at the arms");
      }
    }
    primary_senders_.Stop();  // nothing to send once every batch is done
    candidate_senders_.Stop();
    {  // the comparisons queued (none come after the batches are done)
      std::lock_guard<std::mutex> lock(comparisons_mutex_);
      comparer_stopping_ = true;
    }
    comparisons_ready_.notify_all();
    comparer_.join();
    {
      std::lock_guard<std::mutex> lock(stop_mutex_);
      stopping_ = true;
    }
    stop_.notify_all();
    flusher_.join();
    Flush();
  }

  void Execute(TRITONBACKEND_Request** requests, uint32_t count);
  void BatchDone();
  void RespondError(TRITONBACKEND_Request* request, const std::string& message);
  void ReleaseRequests(Batch* batch);
  std::unique_ptr<Buffer> TakeBuffer(size_t bytes);
  void ReturnBuffer(std::unique_ptr<Buffer> buffer);

  // Triton's callbacks of an arm's call
  static void OnResponse(TRITONSERVER_InferenceResponse* response, uint32_t flags, void* userp);
  static void OnRelease(TRITONSERVER_InferenceRequest* request, uint32_t flags, void* userp);

 private:
  std::string Send(Call* call);
  void Fail(Call* call, const std::string& failure);
  void Finish(Call* call);
  void Answer(Call* call, TRITONSERVER_InferenceResponse* response, const std::string& failure);
  void Shadow(const std::shared_ptr<Batch>& batch);
  bool Compared(Call* call, TRITONSERVER_InferenceResponse* response, const std::string& failure);
  void Compare(const Batch& batch, const Tensor& candidate);
  void Record(const std::string& request_id, int64_t images, double rel_l2, const std::string& disagreeing_json,
              int64_t first_image, const std::vector<int64_t>& first_primary, const std::vector<int64_t>& first_candidate);
  bool ShadowRoom();
  std::chrono::microseconds ShadowTimeout() const {  // at least 1 µs (0 is Triton's "no timeout")
    return std::chrono::microseconds(std::max<int64_t>(1, std::llround(config_.shadow_timeout_ms * 1e3)));
  }
  void ReportStatistics(const Batch& batch, bool success, uint64_t answered_ns);
  void FlushLoop();
  void Flush();

  TRITONBACKEND_ModelInstance* instance_;
  std::string model_name_, name_;
  RouterConfig config_;
  TRITONSERVER_Server* server_;
  Metrics metrics_;
  std::map<std::string, std::string> arm_models_;

  std::mutex batches_mutex_;  // batches not yet released
  std::condition_variable batches_done_;
  int64_t batches_ = 0;

  std::mutex random_mutex_;
  std::mt19937_64 random_;

  Workers primary_senders_{kSenderThreads};    // a slow candidate's sends never hold the primary's up
  Workers candidate_senders_{kSenderThreads};
  void Dispatch(Call* call, bool copy);

  std::mutex buffers_mutex_;  // the shadow copies' buffers not in use, smallest first
  std::vector<std::unique_ptr<Buffer>> free_buffers_;

  // The comparisons, on a thread of their own (not on the arm's thread that answered).
  struct Comparison {
    std::shared_ptr<Batch> batch;
    TRITONSERVER_InferenceResponse* response;
    Tensor logits;
  };
  std::mutex comparisons_mutex_;
  std::condition_variable comparisons_ready_;
  std::deque<Comparison> comparisons_;
  bool comparer_stopping_ = false;
  std::thread comparer_;
  void CompareLoop();

  std::mutex shadow_mutex_;  // the candidate calls in flight
  std::set<Call*> shadow_calls_;

  std::shared_ptr<RecordStore> record_;  // the disagreement record (its file's)
  std::mutex record_mutex_;              // the log lines about disagreements
  Clock::time_point last_log_{};
  int64_t suppressed_logs_ = 0;
  std::string record_file_;

  std::mutex stop_mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread flusher_;
};

Batch::~Batch() {
  // Every request is answered and released by Instance::Answer; one that was not (a bug) still gets an answer.
  for (TRITONBACKEND_Request* request : requests) instance->RespondError(request, "the A/B router lost this request");
  instance->ReleaseRequests(this);
  if (input_copy) instance->ReturnBuffer(std::move(input_copy));  // a batch whose shadow call never left
  instance->BatchDone();
}

std::unique_ptr<Buffer> Instance::TakeBuffer(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(buffers_mutex_);
    for (auto it = free_buffers_.begin(); it != free_buffers_.end(); ++it) {  // smallest first: the best fit
      if ((*it)->capacity >= bytes) {
        std::unique_ptr<Buffer> buffer = std::move(*it);
        free_buffers_.erase(it);
        return buffer;
      }
    }
  }
  std::unique_ptr<Buffer> buffer(new Buffer);
  buffer->capacity = std::max<size_t>(bytes, 1);
  buffer->data.reset(new uint8_t[buffer->capacity]);
  return buffer;
}

void Instance::ReturnBuffer(std::unique_ptr<Buffer> buffer) {
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  // As many as the batches the candidate may have at once, and the one being copied; the smallest goes first.
  free_buffers_.push_back(std::move(buffer));
  std::sort(free_buffers_.begin(), free_buffers_.end(),
            [](const std::unique_ptr<Buffer>& a, const std::unique_ptr<Buffer>& b) { return a->capacity < b->capacity; });
  if (static_cast<int64_t>(free_buffers_.size()) > config_.shadow_max_in_flight + 1) {
    free_buffers_.erase(free_buffers_.begin());
  }
}

void Instance::ReleaseRequests(Batch* batch) {
  for (TRITONBACKEND_Request* request : batch->requests) {
    LogIfError(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "request release");
  }
  batch->requests.clear();
}

bool Instance::ShadowRoom() {
  std::lock_guard<std::mutex> lock(shadow_mutex_);
  return static_cast<int64_t>(shadow_calls_.size()) < config_.shadow_max_in_flight;
}

void Instance::BatchDone() {
  std::lock_guard<std::mutex> lock(batches_mutex_);
  if (--batches_ == 0) batches_done_.notify_all();
}

void Instance::RespondError(TRITONBACKEND_Request* request, const std::string& message) {
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ResponseNew(&response, request);
  if (error != nullptr) {
    Log(TRITONSERVER_LOG_ERROR, model_name_ + ": no response for a request: " + TakeMessage(error));
    return;
  }
  TRITONSERVER_Error* answer = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, message.c_str());
  LogIfError(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, answer), "response send");
  TRITONSERVER_ErrorDelete(answer);
}

// Triton's statistics of the router's requests, in its terms: compute input = the router's own work in execute
// (reading the inputs, sending the call, the shadow copy), compute infer = the arm's answer after that, compute
// output = answering the requests (from `answered_ns` to now).
void Instance::ReportStatistics(const Batch& batch, bool success, uint64_t answered_ns) {
  uint64_t end_ns = NowNs();
  uint64_t sent_ns = std::min(std::max(batch.sent_ns.load(), batch.exec_start_ns), answered_ns);
  for (TRITONBACKEND_Request* request : batch.requests) {
    LogIfError(TRITONBACKEND_ModelInstanceReportStatistics(instance_, request, success, batch.exec_start_ns, sent_ns,
                                                           answered_ns, end_ns),
               "statistics");
  }
  LogIfError(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance_, batch.total_rows, batch.exec_start_ns,
                                                              sent_ns, answered_ns, end_ns),
             "batch statistics");
}

// The arm of a split request: its ab_key, else its request id, hashed; else chance.
static bool RequestKey(TRITONBACKEND_Request* request, std::string* key) {
  uint32_t count = 0;
  if (TRITONBACKEND_RequestParameterCount(request, &count) == nullptr) {
    for (uint32_t i = 0; i < count; ++i) {
      const char* name = nullptr;
      TRITONSERVER_ParameterType type;
      const void* value = nullptr;
      TRITONSERVER_Error* error = TRITONBACKEND_RequestParameter(request, i, &name, &type, &value);
      if (error != nullptr) {
        TRITONSERVER_ErrorDelete(error);
        continue;
      }
      if (std::strcmp(name, spec::kStickyParameter) != 0) continue;
      switch (type) {  // as Python's str() of the JSON value the Python router read
        case TRITONSERVER_PARAMETER_STRING: *key = static_cast<const char*>(value); return true;
        case TRITONSERVER_PARAMETER_INT: *key = std::to_string(*static_cast<const int64_t*>(value)); return true;
        case TRITONSERVER_PARAMETER_BOOL: *key = *static_cast<const bool*>(value) ? "True" : "False"; return true;
        case TRITONSERVER_PARAMETER_DOUBLE: *key = PythonFloat(*static_cast<const double*>(value)); return true;
        default: break;
      }
    }
  }
  const char* id = nullptr;
  if (TRITONBACKEND_RequestId(request, &id) == nullptr && id != nullptr && id[0] != '\0') {
    *key = id;
    return true;
  }
  return false;
}

void Instance::Execute(TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t exec_start_ns = NowNs();
  std::map<std::string, std::shared_ptr<Batch>> groups;
  for (uint32_t r = 0; r < count; ++r) {
    TRITONBACKEND_Request* request = requests[r];
    std::string arm = "primary";
    if (config_.mode == "split") {
      std::string key;
      double share;
      if (RequestKey(request, &key)) {
        share = StickyShare(key);
      } else {
        std::lock_guard<std::mutex> lock(random_mutex_);
        share = std::uniform_real_distribution<double>(0.0, 100.0)(random_);
      }
      if (share < config_.candidate_percent) arm = "candidate";
    }
    // The request's input: its buffers are appended to the arm's call as they are.
    TRITONBACKEND_Input* input = nullptr;
    TRITONSERVER_DataType datatype;
    const int64_t* shape = nullptr;
    uint32_t dims = 0, buffers = 0;
    uint64_t byte_size = 0;
    TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, spec::kInput, &input);
    if (error == nullptr) {
      error = TRITONBACKEND_InputProperties(input, nullptr, &datatype, &shape, &dims, &byte_size, &buffers);
    }
    std::vector<InputChunk> chunks;
    for (uint32_t b = 0; error == nullptr && b < buffers; ++b) {
      InputChunk chunk{nullptr, 0, TRITONSERVER_MEMORY_CPU, 0};
      error = TRITONBACKEND_InputBuffer(input, b, &chunk.base, &chunk.byte_size, &chunk.memory_type,
                                        &chunk.memory_type_id);
      chunks.push_back(chunk);
    }
    if (error == nullptr && dims < 1) error = InvalidArg("the input has no batch dimension");
    if (error != nullptr) {
      RespondError(request, model_name_ + ": " + TakeMessage(error));
      uint64_t now = NowNs();
      LogIfError(TRITONBACKEND_ModelInstanceReportStatistics(instance_, request, false, exec_start_ns, exec_start_ns,
                                                             now, now),
                 "statistics");
      LogIfError(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "request release");
      continue;
    }
    std::shared_ptr<Batch>& batch = groups[arm];
    if (!batch) {
      batch = std::make_shared<Batch>();
      batch->instance = this;
      batch->arm = arm;
      batch->exec_start_ns = exec_start_ns;
      batch->image_dims.assign(shape + 1, shape + dims);
      std::lock_guard<std::mutex> lock(batches_mutex_);
      ++batches_;
    }
    const char* id = nullptr;
    batch->request_ids.push_back(TRITONBACKEND_RequestId(request, &id) == nullptr && id != nullptr ? id : "");
    batch->requests.push_back(request);
    batch->rows.push_back(shape[0]);
    batch->total_rows += shape[0];
    batch->chunks.insert(batch->chunks.end(), chunks.begin(), chunks.end());
  }
  for (auto& group : groups) {
    std::shared_ptr<Batch> batch = group.second;
    bool copy = config_.mode == "shadow" && ShadowRoom();
    batch->copy = copy ? Batch::Copy::kPending : Batch::Copy::kNone;
    Call* call = new Call;
    call->batch = batch;
    call->arm = group.first;
    Workers& senders = group.first == "primary" ? primary_senders_ : candidate_senders_;
    senders.Post([this, call, copy] { Dispatch(call, copy); });
  }
}

// Send a batch's call to its arm and (shadow) copy its input for the candidate while the primary computes (the
// primary's answer, which releases the requests, waits for the copy). On a sender thread.
void Instance::Dispatch(Call* call, bool copy) {
  std::shared_ptr<Batch> batch = call->batch;
  if (copy) {
    std::lock_guard<std::mutex> lock(batch->copy_mutex);
    batch->copier = std::this_thread::get_id();
  }
  std::string failure = Send(call);
  if (copy) {
    {
      std::lock_guard<std::mutex> lock(batch->copy_mutex);
      if (batch->copy == Batch::Copy::kPending) {
        batch->copy = Batch::Copy::kRunning;
      } else {
        copy = false;  // cancelled: the primary answered inside the send (the batch is not shadowed)
      }
    }
  }
  if (copy) {
    uint64_t bytes = 0;
    for (const InputChunk& chunk : batch->chunks) bytes += chunk.byte_size;
    std::unique_ptr<Buffer> buffer = TakeBuffer(bytes);
    uint64_t offset = 0;
    TRITONSERVER_Error* error = nullptr;
    for (size_t i = 0; error == nullptr && i < batch->chunks.size(); ++i) {
      const InputChunk& chunk = batch->chunks[i];
      error = CopyBytes(buffer->data.get() + offset, chunk.base, chunk.byte_size,
                        chunk.memory_type == TRITONSERVER_MEMORY_GPU);
      offset += chunk.byte_size;
    }
    if (error != nullptr) {
      Log(TRITONSERVER_LOG_WARN, model_name_ + ": the shadow copy of a batch failed: " + TakeMessage(error));
      ReturnBuffer(std::move(buffer));
    }
    {
      std::lock_guard<std::mutex> lock(batch->copy_mutex);
      if (error == nullptr) {
        batch->input_copy = std::move(buffer);
        batch->input_bytes = bytes;
      }
      batch->copy = error == nullptr ? Batch::Copy::kDone : Batch::Copy::kFailed;
    }
    batch->copy_done.notify_all();
  }
  batch->sent_ns = NowNs();
  if (!failure.empty()) Fail(call, failure);
}

// Send `call` to its arm: "", or why it could not leave (then no callback will come: the caller Fails it).
std::string Instance::Send(Call* call) {
  Batch& batch = *call->batch;
  const std::string& model = arm_models_.at(call->arm);
  metrics_.requests.at(call->arm).Add(static_cast<double>(batch.rows.size()));
  call->start_ns = NowNs();
  TRITONSERVER_InferenceRequest* request = nullptr;
  TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestNew(&request, server_, model.c_str(), -1);
  if (error == nullptr) {
    std::vector<int64_t> shape = {batch.total_rows};
    shape.insert(shape.end(), batch.image_dims.begin(), batch.image_dims.end());
    error = TRITONSERVER_InferenceRequestAddInput(request, spec::kInput, TRITONSERVER_TYPE_UINT8, shape.data(),
                                                  shape.size());
  }
  if (call->shadow) {  // the copy (the requests are answered and released by now)
    if (error == nullptr) {
      error = TRITONSERVER_InferenceRequestAppendInputData(request, spec::kInput, batch.input_copy->data.get(),
                                                           batch.input_bytes, TRITONSERVER_MEMORY_CPU, 0);
    }
  } else {
    for (size_t i = 0; error == nullptr && i < batch.chunks.size(); ++i) {
      const InputChunk& chunk = batch.chunks[i];
      error = TRITONSERVER_InferenceRequestAppendInputData(request, spec::kInput, chunk.base, chunk.byte_size,
                                                           chunk.memory_type, chunk.memory_type_id);
    }
  }
  if (error == nullptr) error = TRITONSERVER_InferenceRequestAddRequestedOutput(request, spec::kLogits);
  if (error == nullptr) error = TRITONSERVER_InferenceRequestAddRequestedOutput(request, spec::kEngine);
  if (error == nullptr && call->shadow) {
    error = TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(request, ShadowTimeout().count());
  }
  if (error == nullptr) error = TRITONSERVER_InferenceRequestSetReleaseCallback(request, OnRelease, call);
  if (error == nullptr) {
    error = TRITONSERVER_InferenceRequestSetResponseCallback(request, g_allocator, nullptr, OnResponse, call);
  }
  if (error == nullptr) error = TRITONSERVER_ServerInferAsync(server_, request, nullptr);
  if (error == nullptr) return "";
  if (request != nullptr) LogIfError(TRITONSERVER_InferenceRequestDelete(request), "request delete");
  return TakeMessage(error);
}

// A call that could not leave: answered as a failed one, and ended.
void Instance::Fail(Call* call, const std::string& failure) {
  if (call->shadow) {
    Compared(call, nullptr, failure);
  } else {
    Answer(call, nullptr, failure);
  }
  call->pending = 1;
  Finish(call);
}

void Instance::OnRelease(TRITONSERVER_InferenceRequest* request, uint32_t, void* userp) {
  LogIfError(TRITONSERVER_InferenceRequestDelete(request), "request delete");
  Call* call = static_cast<Call*>(userp);
  call->batch->instance->Finish(call);
}

void Instance::OnResponse(TRITONSERVER_InferenceResponse* response, uint32_t flags, void* userp) {
  Call* call = static_cast<Call*>(userp);
  Instance* self = call->batch->instance;
  if (response == nullptr) {  // a flag alone: only a decoupled arm sends one, maybe after its response
    if ((flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) == 0) return;
    if (!call->answered) {
      call->answered = true;
      if (call->shadow) {
        self->Compared(call, nullptr, "the arm sent no response");
      } else {
        self->Answer(call, nullptr, "the arm sent no response");
      }
    }
  } else if (call->answered) {  // a decoupled arm's second response: the router takes the first
    LogIfError(TRITONSERVER_InferenceResponseDelete(response), "response delete");
  } else {
    call->answered = true;
    TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseError(response);
    std::string failure = error != nullptr ? TRITONSERVER_ErrorMessage(error) : "";
    bool kept = false;  // by the comparison, which deletes it
    if (call->shadow) {
      kept = self->Compared(call, response, failure);
    } else {
      self->Answer(call, response, failure);
    }
    if (!kept) LogIfError(TRITONSERVER_InferenceResponseDelete(response), "response delete");
  }
  if ((flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0) self->Finish(call);
}

void Instance::Finish(Call* call) {
  if (--call->pending > 0) return;
  if (call->shadow) {
    {
      std::lock_guard<std::mutex> lock(shadow_mutex_);
      shadow_calls_.erase(call);
    }
    std::unique_ptr<Buffer> copy;  // read by the call only: back to the pool (the comparison needs the logits)
    {
      std::lock_guard<std::mutex> lock(call->batch->copy_mutex);
      copy = std::move(call->batch->input_copy);
    }
    if (copy) ReturnBuffer(std::move(copy));
  }
  delete call;
}

// The outputs of an arm's answer, or an error message.
static std::string ReadOutputs(TRITONSERVER_InferenceResponse* response, Tensor* logits, Tensor* engine,
                               int64_t rows) {
  uint32_t count = 0;
  TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseOutputCount(response, &count);
  if (error != nullptr) return TakeMessage(error);
  for (uint32_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    Tensor tensor;
    const int64_t* shape = nullptr;
    uint64_t dims = 0;
    TRITONSERVER_MemoryType memory_type;
    int64_t memory_type_id;
    void* userp;
    error = TRITONSERVER_InferenceResponseOutput(response, i, &name, &tensor.datatype, &shape, &dims, &tensor.base,
                                                 &tensor.byte_size, &memory_type, &memory_type_id, &userp);
    if (error != nullptr) return TakeMessage(error);
    tensor.shape.assign(shape, shape + dims);
    if (std::strcmp(name, spec::kLogits) == 0) *logits = tensor;
    if (std::strcmp(name, spec::kEngine) == 0) *engine = tensor;
  }
  if (logits->base == nullptr || logits->datatype != TRITONSERVER_TYPE_FP32 || logits->shape.size() != 2 ||
      logits->shape[0] != rows || logits->byte_size != static_cast<size_t>(rows * logits->shape[1]) * sizeof(float)) {
    return "the arm's answer has no FP32 " + std::string(spec::kLogits) + " of " + std::to_string(rows) + " rows";
  }
  if (engine->base != nullptr && (engine->shape.empty() || engine->shape[0] != rows)) {
    return "the arm's " + std::string(spec::kEngine) + " does not have " + std::to_string(rows) + " rows";
  }
  return "";
}

// The answer of the primary (shadow, primary) or of a split's arm: each request gets its rows, or the error.
void Instance::Answer(Call* call, TRITONSERVER_InferenceResponse* response, const std::string& arm_failure) {
  Batch& batch = *call->batch;
  {  // the shadow copy reads the requests' buffers, which answering them frees (Batch::Copy)
    std::unique_lock<std::mutex> lock(batch.copy_mutex);
    if (batch.copy == Batch::Copy::kPending && batch.copier == std::this_thread::get_id()) {
      batch.copy = Batch::Copy::kCancelled;
    }
    batch.copy_done.wait(lock, [&batch] {
      return batch.copy != Batch::Copy::kPending && batch.copy != Batch::Copy::kRunning;
    });
  }
  uint64_t answered_ns = NowNs();
  double elapsed_s = (answered_ns - batch.exec_start_ns) * 1e-9;
  int64_t requests = static_cast<int64_t>(batch.rows.size());
  metrics_.latency.at(call->arm).Observe(elapsed_s, requests);
  Tensor logits, engine;
  std::string failure = arm_failure;
  if (failure.empty()) failure = ReadOutputs(response, &logits, &engine, batch.total_rows);
  if (!failure.empty()) {
    metrics_.failures.at(call->arm).Add(static_cast<double>(requests));
    for (TRITONBACKEND_Request* request : batch.requests) {
      RespondError(request, model_name_ + ": " + arm_models_.at(call->arm) + " failed: " + failure);
    }
    ReportStatistics(batch, false, answered_ns);
    ReleaseRequests(&batch);
    return;
  }
  int64_t first_row = 0;
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    TRITONBACKEND_Request* request = batch.requests[i];
    int64_t rows = batch.rows[i];
    const char* base_logits = static_cast<const char*>(logits.base) + logits.RowBytes() * first_row;
    const char* base_engine =
        engine.base == nullptr ? nullptr : static_cast<const char*>(engine.base) + engine.RowBytes() * first_row;
    first_row += rows;
    TRITONBACKEND_Response* reply = nullptr;
    TRITONSERVER_Error* error = TRITONBACKEND_ResponseNew(&reply, request);
    if (error != nullptr) {
      Log(TRITONSERVER_LOG_ERROR, model_name_ + ": no response for a request: " + TakeMessage(error));
      continue;
    }
    uint32_t outputs = 0;
    error = TRITONBACKEND_RequestOutputCount(request, &outputs);
    for (uint32_t o = 0; error == nullptr && o < outputs; ++o) {
      const char* name = nullptr;
      error = TRITONBACKEND_RequestOutputName(request, o, &name);
      if (error != nullptr) break;
      const Tensor* tensor = std::strcmp(name, spec::kLogits) == 0 ? &logits
                             : std::strcmp(name, spec::kEngine) == 0 && engine.base != nullptr ? &engine
                                                                                               : nullptr;
      if (tensor == nullptr) {
        error = InvalidArg(std::string("the arm gave no output ") + name);
        break;
      }
      std::vector<int64_t> shape = tensor->shape;
      shape[0] = rows;
      TRITONBACKEND_Output* output = nullptr;
      error = TRITONBACKEND_ResponseOutput(reply, &output, name, tensor->datatype, shape.data(), shape.size());
      if (error != nullptr) break;
      size_t bytes = tensor->RowBytes() * rows;
      void* buffer = nullptr;
      TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
      int64_t memory_type_id = 0;
      error = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory_type, &memory_type_id);
      if (error == nullptr && bytes != 0) {
        const char* source = tensor == &logits ? base_logits : base_engine;
        error = CopyBytes(buffer, source, bytes, memory_type == TRITONSERVER_MEMORY_GPU);
      }
    }
    if (error != nullptr) {
      std::string message = model_name_ + ": " + TakeMessage(error);
      TRITONSERVER_Error* answer = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, message.c_str());
      LogIfError(TRITONBACKEND_ResponseSend(reply, TRITONSERVER_RESPONSE_COMPLETE_FINAL, answer), "response send");
      TRITONSERVER_ErrorDelete(answer);
    } else {
      LogIfError(TRITONBACKEND_ResponseSend(reply, TRITONSERVER_RESPONSE_COMPLETE_FINAL, nullptr), "response send");
    }
  }
  ReportStatistics(batch, true, answered_ns);
  ReleaseRequests(&batch);
  if (config_.mode == "shadow") {
    batch.classes = logits.shape[1];
    const float* values = static_cast<const float*>(logits.base);
    batch.primary_logits.assign(values, values + batch.total_rows * batch.classes);
    Shadow(call->batch);
  }
}

// ---------------------------------------------------------------- shadow: the candidate after the answer

void Instance::Shadow(const std::shared_ptr<Batch>& batch) {
  int64_t requests = static_cast<int64_t>(batch->rows.size());
  bool copied;
  {
    std::lock_guard<std::mutex> lock(batch->copy_mutex);
    copied = batch->copy == Batch::Copy::kDone;
  }
  Call* call = nullptr;
  {
    std::lock_guard<std::mutex> lock(shadow_mutex_);
    if (copied && static_cast<int64_t>(shadow_calls_.size()) < config_.shadow_max_in_flight) {
      call = new Call;
      call->batch = batch;
      call->arm = "candidate";
      call->shadow = true;
      call->deadline = Clock::now() + ShadowTimeout();
      shadow_calls_.insert(call);
    }
  }
  if (call == nullptr) {
    metrics_.skipped.Add(static_cast<double>(requests));
    return;
  }
  candidate_senders_.Post([this, call] {
    {  // from its start: a call counted late while it waited for a sender is not sent (no late work)
      std::lock_guard<std::mutex> lock(shadow_mutex_);
      if (call->settled) {
        call->pending = 1;
      } else {
        call->deadline = Clock::now() + ShadowTimeout();
      }
    }
    if (call->pending == 1) {
      Finish(call);
      return;
    }
    std::string failure = Send(call);
    if (!failure.empty()) Fail(call, failure);
  });
}

// The candidate's answer (shadow): counted here, compared on the comparer thread (true: it keeps `response`, and
// deletes it when compared).
bool Instance::Compared(Call* call, TRITONSERVER_InferenceResponse* response, const std::string& arm_failure) {
  const Batch& batch = *call->batch;
  double elapsed_s = (NowNs() - call->start_ns) * 1e-9;
  bool counted_late;
  {
    std::lock_guard<std::mutex> lock(shadow_mutex_);
    counted_late = call->settled;
    call->settled = true;
  }
  if (counted_late) return false;  // the flush thread counted it at its deadline
  double requests = static_cast<double>(batch.rows.size());
  std::string failure = arm_failure;
  Tensor logits, engine;
  if (failure.empty() && response != nullptr) failure = ReadOutputs(response, &logits, &engine, batch.total_rows);
  // Triton's own queue timeout (the call's timeout) reads "Request timeout expired".
  std::string lower = failure;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  bool late = elapsed_s > config_.shadow_timeout_ms * 1e-3 || lower.find("timeout") != std::string::npos;
  if (late) {
    metrics_.timeouts.Add(requests);
    return false;
  }
  if (!failure.empty()) {
    metrics_.failures.at("candidate").Add(requests);
    return false;
  }
  metrics_.latency.at("candidate").Observe(elapsed_s, static_cast<int64_t>(requests));
  if (logits.shape[1] != batch.classes) {
    metrics_.failures.at("candidate").Add(requests);
    Log(TRITONSERVER_LOG_WARN, model_name_ + ": the candidate's logits have " + std::to_string(logits.shape[1]) +
                                   " classes, the primary's " + std::to_string(batch.classes));
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(comparisons_mutex_);
    // Bounded: a comparer that falls behind drops comparisons (counted as not shadowed) rather than memory.
    if (static_cast<int64_t>(comparisons_.size()) >= kComparisonsQueued * config_.shadow_max_in_flight) {
      metrics_.skipped.Add(requests);
      return false;
    }
    comparisons_.push_back(Comparison{call->batch, response, logits});
  }
  comparisons_ready_.notify_one();
  return true;
}

void Instance::CompareLoop() {
  std::unique_lock<std::mutex> lock(comparisons_mutex_);
  while (true) {
    comparisons_ready_.wait(lock, [this] { return comparer_stopping_ || !comparisons_.empty(); });
    if (comparisons_.empty()) return;  // stopping, and nothing left
    Comparison comparison = std::move(comparisons_.front());
    comparisons_.pop_front();
    lock.unlock();
    Compare(*comparison.batch, comparison.logits);
    LogIfError(TRITONSERVER_InferenceResponseDelete(comparison.response), "response delete");
    comparison.batch.reset();  // may be the batch's last holder
    lock.lock();
  }
}

// The indices of the k largest values, largest first (ties: the lower index first), in one pass.
static std::vector<int64_t> TopK(const float* values, int64_t count, int64_t k) {
  std::vector<int64_t> top;
  top.reserve(k + 1);
  for (int64_t i = 0; i < count; ++i) {
    if (static_cast<int64_t>(top.size()) == k && !(values[i] > values[top.back()])) continue;
    auto at = std::upper_bound(top.begin(), top.end(), i,
                               [values](int64_t a, int64_t b) { return values[a] > values[b]; });
    top.insert(at, i);
    if (static_cast<int64_t>(top.size()) > k) top.pop_back();
  }
  return top;
}

static std::string JsonList(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

void Instance::Compare(const Batch& batch, const Tensor& candidate_logits) {
  const float* primary = batch.primary_logits.data();
  const float* candidate = static_cast<const float*>(candidate_logits.base);
  int64_t classes = batch.classes;
  int64_t row = 0;
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    int64_t images = batch.rows[r];
    int64_t agree = 0;
    double overlap_sum = 0, norm2 = 0, diff2 = 0;
    rapidjson::StringBuffer disagreeing;
    rapidjson::Writer<rapidjson::StringBuffer> writer(disagreeing);
    writer.StartArray();
    int64_t first_image = -1;
    std::vector<int64_t> first_primary, first_candidate;
    for (int64_t image = 0; image < images; ++image, ++row) {
      const float* p = primary + row * classes;
      const float* c = candidate + row * classes;
      for (int64_t k = 0; k < classes; ++k) {
        norm2 += static_cast<double>(p[k]) * p[k];
        double d = static_cast<double>(c[k]) - p[k];
        diff2 += d * d;
      }
      std::vector<int64_t> top_p = TopK(p, classes, spec::kTopK), top_c = TopK(c, classes, spec::kTopK);
      int64_t shared = 0;
      for (int64_t a : top_p) shared += std::count(top_c.begin(), top_c.end(), a) > 0;
      overlap_sum += shared;
      if (!top_p.empty() && !top_c.empty() && top_p[0] == top_c[0]) {
        ++agree;
        continue;
      }
      writer.StartObject();
      writer.Key("image");
      writer.Int64(image);
      writer.Key("primary_top5");
      writer.StartArray();
      for (int64_t v : top_p) writer.Int64(v);
      writer.EndArray();
      writer.Key("candidate_top5");
      writer.StartArray();
      for (int64_t v : top_c) writer.Int64(v);
      writer.EndArray();
      writer.EndObject();
      if (first_image < 0) {
        first_image = image;
        first_primary = top_p;
        first_candidate = top_c;
      }
    }
    writer.EndArray();
    double rel_l2 = norm2 > 0 ? std::sqrt(diff2) / std::sqrt(norm2) : INFINITY;
    metrics_.compared.Add(1);
    metrics_.images.Add(static_cast<double>(images));
    metrics_.top1_agree.Add(static_cast<double>(agree));
    metrics_.top5_overlap.Observe(images ? overlap_sum / images : 0);
    metrics_.rel_l2.Observe(rel_l2);
    if (agree < images) {
      metrics_.disagreeing.Add(1);
      Record(batch.request_ids[r], images, rel_l2, disagreeing.GetString(), first_image, first_primary,
             first_candidate);
    }
  }
}

std::string UtcNow() {
  char text[32];
  std::time_t now = std::time(nullptr);
  std::tm utc;
  gmtime_r(&now, &utc);
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

void Instance::Record(const std::string& request_id, int64_t images, double rel_l2,
                      const std::string& disagreeing_json, int64_t first_image,
                      const std::vector<int64_t>& first_primary, const std::vector<int64_t>& first_candidate) {
  rapidjson::StringBuffer text;
  rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator,
                    rapidjson::kWriteNanAndInfFlag>
      writer(text);
  writer.StartObject();
  writer.Key("time");
  writer.String(UtcNow().c_str());
  writer.Key("request_id");
  writer.String(request_id.c_str());
  writer.Key("primary");
  writer.String(config_.primary.c_str());
  writer.Key("candidate");
  writer.String(config_.candidate.c_str());
  writer.Key("images");
  writer.Int64(images);
  writer.Key("rel_l2");
  writer.Double(rel_l2);
  writer.Key("disagreeing");
  writer.RawValue(disagreeing_json.c_str(), disagreeing_json.size(), rapidjson::kArrayType);
  writer.EndObject();
  int64_t suppressed;
  {
    std::lock_guard<std::mutex> lock(record_->mutex);
    if (config_.disagreement_records > 0) record_->records.push_back(text.GetString());
    while (static_cast<int64_t>(record_->records.size()) > config_.disagreement_records) record_->records.pop_front();
    record_->changed = true;
  }
  {
    std::lock_guard<std::mutex> lock(record_mutex_);
    Clock::time_point now = Clock::now();
    if (now - last_log_ < std::chrono::duration<double>(spec::kLogEveryS)) {
      ++suppressed_logs_;
      return;
    }
    suppressed = suppressed_logs_;
    last_log_ = now;
    suppressed_logs_ = 0;
  }
  std::string line = model_name_ + ": top-1 differs on request '" + request_id + "' image " +
                     std::to_string(first_image) + ": " + config_.primary + " top-5 " + JsonList(first_primary) +
                     ", " + config_.candidate + " top-5 " + JsonList(first_candidate);
  if (suppressed) line += " (" + std::to_string(suppressed) + " more such requests since the last line)";
  Log(TRITONSERVER_LOG_WARN, line);
}

// ---------------------------------------------------------------- every kFlushS: late shadows, the record

void Instance::FlushLoop() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!stop_.wait_for(lock, std::chrono::duration<double>(spec::kFlushS), [this] { return stopping_; })) {
    lock.unlock();
    Flush();
    lock.lock();
  }
}

void Instance::Flush() {
  if (config_.mode == "shadow") {  // count as timeouts the candidate calls past their deadline
    Clock::time_point now = Clock::now();
    double late = 0;
    {
      std::lock_guard<std::mutex> lock(shadow_mutex_);
      for (Call* call : shadow_calls_) {
        if (!call->settled && now > call->deadline) {
          call->settled = true;
          late += static_cast<double>(call->batch->rows.size());
        }
      }
    }
    metrics_.timeouts.Add(late);
  }
  std::lock_guard<std::mutex> lock(record_->mutex);  // one writer of the file at a time
  if (!record_->changed) return;
  record_->changed = false;
  std::string json = "[";
  for (size_t i = 0; i < record_->records.size(); ++i) json += (i ? ",\n " : "\n ") + record_->records[i];
  json += "\n]\n";
  std::error_code made;  // an error shows as the write's failure below
  std::filesystem::create_directories(g_disagreements_dir, made);
  std::string temporary = record_file_ + ".tmp";
  FILE* file = std::fopen(temporary.c_str(), "w");
  bool written = file != nullptr && std::fwrite(json.data(), 1, json.size(), file) == json.size();
  if (file != nullptr) written = std::fclose(file) == 0 && written;
  if (!written || std::rename(temporary.c_str(), record_file_.c_str()) != 0) {
    Log(TRITONSERVER_LOG_WARN, model_name_ + ": the disagreement record " + record_file_ + " not written: " +
                                   std::strerror(errno));
  }
}

// ---------------------------------------------------------------- the model

struct ModelState {
  std::string name;
  RouterConfig config;
  TRITONSERVER_Server* server = nullptr;
};

TRITONSERVER_Error* CheckContract(const rapidjson::Document& config, const std::string& name) {
  std::vector<std::string> inputs, outputs;
  if (config.HasMember("input") && config["input"].IsArray()) {
    for (const auto& input : config["input"].GetArray()) inputs.push_back(input["name"].GetString());
  }
  if (config.HasMember("output") && config["output"].IsArray()) {
    for (const auto& output : config["output"].GetArray()) outputs.push_back(output["name"].GetString());
  }
  std::sort(outputs.begin(), outputs.end());
  std::vector<std::string> expected = {spec::kEngine, spec::kLogits};  // sorted
  if (inputs != std::vector<std::string>{spec::kInput} || outputs != expected) {
    return InvalidArg(name + ": the router's config must declare input " + spec::kInput + " and outputs " +
                      spec::kLogits + ", " + spec::kEngine + " only (got inputs " + PythonList(inputs) + ", outputs " +
                      PythonList(outputs) + ")");
  }
  if (!config.HasMember("max_batch_size") || !config["max_batch_size"].IsInt() || config["max_batch_size"].GetInt() < 1) {
    return InvalidArg(name + ": the router batches (its config's max_batch_size must be 1 or more)");
  }
  return nullptr;
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  uint32_t major, minor;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                 ("fusedresnet_ab: built for backend API " + std::to_string(TRITONBACKEND_API_VERSION_MAJOR) +
                                  "." + std::to_string(TRITONBACKEND_API_VERSION_MINOR) + ", the server has " +
                                  std::to_string(major) + "." + std::to_string(minor))
                                     .c_str());
  }
  TRITONSERVER_Message* message = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_BackendConfig(backend, &message));
  const char* text = nullptr;
  size_t size = 0;
  RETURN_IF_ERROR(TRITONSERVER_MessageSerializeToJson(message, &text, &size));
  rapidjson::Document config;
  if (size != 0 && !config.Parse(text, size).HasParseError() && config.IsObject() && config.HasMember("cmdline") &&
      config["cmdline"].IsObject() && config["cmdline"].HasMember("disagreements-dir") &&
      config["cmdline"]["disagreements-dir"].IsString()) {
    g_disagreements_dir = config["cmdline"]["disagreements-dir"].GetString();
  }
  return TRITONSERVER_ResponseAllocatorNew(&g_allocator, AllocateOutput, ReleaseOutput, nullptr);
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend*) {
  DeleteMetrics();
  if (g_allocator != nullptr) RETURN_IF_ERROR(TRITONSERVER_ResponseAllocatorDelete(g_allocator));
  g_allocator = nullptr;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  TRITONSERVER_Message* message = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelConfig(model, 1, &message));
  const char* text = nullptr;
  size_t size = 0;
  TRITONSERVER_Error* error = TRITONSERVER_MessageSerializeToJson(message, &text, &size);
  rapidjson::Document config;
  if (error == nullptr && config.Parse(text, size).HasParseError()) error = InvalidArg("unreadable model config");
  std::unique_ptr<ModelState> state(new ModelState);
  state->name = name;
  if (error == nullptr) error = CheckContract(config, state->name);
  if (error == nullptr) {
    error = ParseRouterConfig(config, &state->config);
    if (error != nullptr) error = InvalidArg(state->name + ": " + TakeMessage(error));
  }
  if (error == nullptr) error = TRITONBACKEND_ModelServer(model, &state->server);
  TRITONSERVER_MessageDelete(message);
  RETURN_IF_ERROR(error);
  return TRITONBACKEND_ModelSetState(model, state.release());
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  delete static_cast<ModelState*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  const char* name = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  TRITONBACKEND_Model* model = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  ModelState* model_state = static_cast<ModelState*>(state);
  Instance* router = new Instance(instance, model_state->name, name, model_state->config, model_state->server);
  return TRITONBACKEND_ModelInstanceSetState(instance, router);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  delete static_cast<Instance*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  static_cast<Instance*>(state)->Execute(requests, count);  // owns the requests from here: each is answered, released
  return nullptr;
}

}  // extern "C"
