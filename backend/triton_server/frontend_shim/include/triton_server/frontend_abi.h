// The parts of Triton's frontend classes (triton-inference-server/server, release 2.73.0, src/grpc/grpc_server.h,
// src/http_server.h, src/shared_memory_manager.h) that frontend_shim.cc calls, declared as that release defines
// them: the option structs field for field, the entry points by the exact signatures that the tritonfrontend 2.73.0
// wheel's tritonfrontend_bindings library exports (tests/test_front_end.py checks every symbol the shim imports
// against that library's export table). Upstream's copyright and licence: LICENSE beside this file.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "restricted_features.h"
#include "triton/core/tritonserver.h"

// grpc/impl/compression_types.h
typedef enum {
  GRPC_COMPRESS_LEVEL_NONE = 0,
  GRPC_COMPRESS_LEVEL_LOW,
  GRPC_COMPRESS_LEVEL_MED,
  GRPC_COMPRESS_LEVEL_HIGH,
  GRPC_COMPRESS_LEVEL_COUNT
} grpc_compression_level;

namespace triton { namespace server {

// src/tracer.h: made as the binary makes it when no --trace-* flag is given (tracing off until an admin turns it on).
// The frontends need one: 2.73's HTTP trace API never answers without it.
using TraceConfig = std::vector<std::pair<std::string, std::variant<std::string, int, uint32_t>>>;
using TraceConfigMap = std::unordered_map<std::string, TraceConfig>;
typedef enum tracemode_enum { TRACE_MODE_TRITON = 0, TRACE_MODE_OPENTELEMETRY = 1 } InferenceTraceMode;

class TraceManager {
 public:
  static TRITONSERVER_Error* Create(
      TraceManager** manager, const TRITONSERVER_InferenceTraceLevel level, const uint32_t rate, const int32_t count,
      const uint32_t log_frequency, const std::string& filepath, const InferenceTraceMode mode,
      const TraceConfigMap& config_map);
};

// src/shared_memory_manager.h: constructed here (its constructor is inline upstream), used by the frontend's own
// code. Its members in upstream's order; it is never destroyed (the launcher's process ends with it).
class SharedMemoryManager;
struct SharedMemoryManagerLayout {
  explicit SharedMemoryManagerLayout(bool allow_client_shm) : allow_client_shm_(allow_client_shm) {}
  std::map<std::string, std::shared_ptr<void>> shared_memory_map_;  // same layout for any mapped type
  std::mutex mu_;
  const bool allow_client_shm_;
};

// src/http_server.h
class HTTPServer {
 public:
  TRITONSERVER_Error* Start();
  TRITONSERVER_Error* Stop(uint32_t* exit_timeout_secs, const std::string& service_name);
  ~HTTPServer();  // never called: the shim releases its unique_ptr (upstream's is virtual)

 private:
  char opaque_;
};

class HTTPAPIServer {
 public:
  static TRITONSERVER_Error* Create(
      const std::shared_ptr<TRITONSERVER_Server>& server, TraceManager* trace_manager,
      const std::shared_ptr<SharedMemoryManager>& smb_manager, const int32_t port, const bool reuse_port,
      const std::string& address, const std::string& header_forward_pattern, const int thread_cnt,
      const size_t max_input_size, const RestrictedFeatures& restricted_apis, std::unique_ptr<HTTPServer>* http_server);
};

class HTTPMetricsServer {
 public:
  static TRITONSERVER_Error* Create(
      const std::shared_ptr<TRITONSERVER_Server>& server, int32_t port, std::string address, int thread_cnt,
      std::unique_ptr<HTTPServer>* metrics_server);
};

namespace grpc {

// src/grpc/grpc_server.h
struct SocketOptions {
  std::string address_{"0.0.0.0"};
  int32_t port_{8001};
  bool reuse_port_{false};
};

struct SslOptions {
  bool use_ssl_{false};
  std::string server_cert_{""};
  std::string server_key_{""};
  std::string root_cert_{""};
  bool use_mutual_auth_{false};
};

struct KeepAliveOptions {
  int keepalive_time_ms_{7200000};
  int keepalive_timeout_ms_{20000};
  bool keepalive_permit_without_calls_{false};
  int http2_max_pings_without_data_{2};
  int http2_min_recv_ping_interval_without_data_ms_{300000};
  int http2_max_ping_strikes_{2};
  int max_connection_age_ms_{0};
  int max_connection_age_grace_ms_{0};
};

struct Options {
  SocketOptions socket_;
  SslOptions ssl_;
  KeepAliveOptions keep_alive_;
  grpc_compression_level infer_compression_level_{GRPC_COMPRESS_LEVEL_NONE};
  int infer_thread_count_{2};
  int infer_allocation_pool_size_{8};
  int max_response_pool_size_{INT_MAX};
  RestrictedFeatures restricted_protocols_;
  std::string forward_header_pattern_;
};

constexpr char kRestrictedProtocolHeaderTemplate[] = "triton-grpc-protocol-";

class Server {
 public:
  static TRITONSERVER_Error* Create(
      const std::shared_ptr<TRITONSERVER_Server>& tritonserver, TraceManager* trace_manager,
      const std::shared_ptr<SharedMemoryManager>& shm_manager, const Options& server_options,
      std::unique_ptr<Server>* server);
  ~Server();  // never called: the shim releases its unique_ptr
  TRITONSERVER_Error* Start();
  TRITONSERVER_Error* GracefulStop(uint32_t* exit_timeout_secs, const std::string& service_name);
  TRITONSERVER_Error* Stop();

 private:
  char opaque_;
};

}  // namespace grpc
}}  // namespace triton::server
