// Triton's current gRPC, HTTP and metrics frontends (the tritonfrontend wheel's library) on a core made by
// backend/inprocess_server.py, with what that wheel's Python options leave out: the restricted APIs and protocols
// (the admin token) and a client shared-memory manager (off unless the launcher's --client-shared-memory asks for
// it). A C interface for ctypes: each call returns 0, or -1 with the error's text in `error` (`error_size` bytes).
//
// The library is loaded after tritonfrontend_bindings (RTLD_GLOBAL), whose exported frontend classes it calls
// (include/triton_server/frontend_abi.h), and whose dependency libtritonserver.so is the Triton 2.51 core.

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "triton_server/frontend_abi.h"

namespace {

using triton::server::RestrictedCategory;
using triton::server::RestrictedFeatures;
using triton::server::SharedMemoryManager;

int
Fail(char* error, size_t error_size, const std::string& message)
{
  if (error != nullptr && error_size > 0) {
    std::snprintf(error, error_size, "%s", message.c_str());
  }
  return -1;
}

// The error's text, the error deleted; 0 when there is none.
int
Check(TRITONSERVER_Error* err, char* error, size_t error_size, const char* what)
{
  if (err == nullptr) {
    return 0;
  }
  std::string message = std::string(what) + ": " + TRITONSERVER_ErrorMessage(err);
  TRITONSERVER_ErrorDelete(err);
  return Fail(error, error_size, message);
}

std::shared_ptr<TRITONSERVER_Server>
Unowned(void* server)
{
  // The core is made and deleted by the caller: the frontends never delete it.
  return std::shared_ptr<TRITONSERVER_Server>(static_cast<TRITONSERVER_Server*>(server), [](TRITONSERVER_Server*) {});
}

// Restricted categories by their command-line names ("statistics,trace"), each asking for `header`: `value`.
int
Restrict(
    RestrictedFeatures* features, const char* categories, const std::string& header, const char* value, char* error,
    size_t error_size)
{
  std::string list(categories == nullptr ? "" : categories);
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) {
      end = list.size();
    }
    const std::string name = list.substr(start, end - start);
    if (!name.empty()) {
      const RestrictedCategory category = RestrictedFeatures::ToCategory(name);
      if (category == RestrictedCategory::INVALID) {
        return Fail(error, error_size, "unknown restricted category '" + name + "'");
      }
      features->Insert(category, std::make_pair(header, std::string(value)));
    }
    start = end + 1;
  }
  return 0;
}

}  // namespace

extern "C" {

// The trace manager of every frontend of one core: tracing off (level DISABLED, the binary's defaults: rate 1000,
// no count limit, Triton's own trace format) until the trace API, behind the admin token, turns it on.
int
fr_trace_manager_new(void** manager, char* error, size_t error_size)
{
  triton::server::TraceManager* made = nullptr;
  if (Check(
          triton::server::TraceManager::Create(
              &made, TRITONSERVER_TRACE_LEVEL_DISABLED, 1000, -1, 0, "", triton::server::TRACE_MODE_TRITON,
              triton::server::TraceConfigMap{}),
          error, error_size, "creating the trace manager") != 0) {
    return -1;
  }
  *manager = made;
  return 0;
}

// A shared-memory manager for every frontend of one core; allow_client_shm: whether clients may register regions.
void*
fr_shared_memory_manager_new(int allow_client_shm)
{
  auto* layout = new triton::server::SharedMemoryManagerLayout(allow_client_shm != 0);
  return new std::shared_ptr<SharedMemoryManager>(
      reinterpret_cast<SharedMemoryManager*>(layout), [](SharedMemoryManager*) {});
}

// The gRPC frontend (not started). restricted: categories (comma-separated), or empty; their metadata key is
// "triton-grpc-protocol-" + restricted_key, as tritonserver's --grpc-restricted-protocol makes it.
int
fr_grpc_new(
    void* server, void* trace_manager, void* shm_manager, const char* address, int port, int reuse_port, int infer_threads,
    int allocation_pool_size, int keepalive_time_ms, int keepalive_timeout_ms, int max_connection_age_ms,
    int max_connection_age_grace_ms, const char* restricted, const char* restricted_key,
    const char* restricted_value, void** frontend, char* error, size_t error_size)
{
  triton::server::grpc::Options options;
  options.socket_.address_ = address;
  options.socket_.port_ = port;
  options.socket_.reuse_port_ = reuse_port != 0;
  options.infer_thread_count_ = infer_threads;
  options.infer_allocation_pool_size_ = allocation_pool_size;
  options.keep_alive_.keepalive_time_ms_ = keepalive_time_ms;
  options.keep_alive_.keepalive_timeout_ms_ = keepalive_timeout_ms;
  options.keep_alive_.max_connection_age_ms_ = max_connection_age_ms;
  options.keep_alive_.max_connection_age_grace_ms_ = max_connection_age_grace_ms;
  if (Restrict(
          &options.restricted_protocols_, restricted,
          std::string(triton::server::grpc::kRestrictedProtocolHeaderTemplate) + restricted_key, restricted_value,
          error, error_size) != 0) {
    return -1;
  }
  std::unique_ptr<triton::server::grpc::Server> service;
  if (Check(
          triton::server::grpc::Server::Create(
              Unowned(server), static_cast<triton::server::TraceManager*>(trace_manager),
              *static_cast<std::shared_ptr<SharedMemoryManager>*>(shm_manager), options,
              &service),
          error, error_size, "creating the gRPC frontend") != 0) {
    return -1;
  }
  *frontend = service.release();
  return 0;
}

int
fr_grpc_start(void* frontend, char* error, size_t error_size)
{
  return Check(
      static_cast<triton::server::grpc::Server*>(frontend)->Start(), error, error_size, "starting the gRPC frontend");
}

// Stops taking calls and waits for those in flight, at most *exit_timeout_secs (which is left with what remains).
int
fr_grpc_graceful_stop(void* frontend, uint32_t* exit_timeout_secs, char* error, size_t error_size)
{
  return Check(
      static_cast<triton::server::grpc::Server*>(frontend)->GracefulStop(exit_timeout_secs, "gRPC"), error,
      error_size, "stopping the gRPC frontend");
}

int
fr_grpc_stop(void* frontend, char* error, size_t error_size)
{
  return Check(
      static_cast<triton::server::grpc::Server*>(frontend)->Stop(), error, error_size, "stopping the gRPC frontend");
}

// The HTTP frontend (not started); restricted APIs ask for the header `restricted_key`: `restricted_value`.
int
fr_http_new(
    void* server, void* trace_manager, void* shm_manager, const char* address, int port, int reuse_port, int threads,
    unsigned long long max_input_size, const char* restricted, const char* restricted_key,
    const char* restricted_value, void** frontend, char* error, size_t error_size)
{
  RestrictedFeatures features;
  if (Restrict(&features, restricted, restricted_key, restricted_value, error, error_size) != 0) {
    return -1;
  }
  std::unique_ptr<triton::server::HTTPServer> service;
  if (Check(
          triton::server::HTTPAPIServer::Create(
              Unowned(server), static_cast<triton::server::TraceManager*>(trace_manager),
              *static_cast<std::shared_ptr<SharedMemoryManager>*>(shm_manager), port, reuse_port != 0, address, "", threads, static_cast<size_t>(max_input_size), features, &service),
          error, error_size, "creating the HTTP frontend") != 0) {
    return -1;
  }
  *frontend = service.release();
  return 0;
}

int
fr_metrics_new(void* server, const char* address, int port, int threads, void** frontend, char* error,
               size_t error_size)
{
  std::unique_ptr<triton::server::HTTPServer> service;
  if (Check(
          triton::server::HTTPMetricsServer::Create(Unowned(server), port, address, threads, &service), error,
          error_size, "creating the metrics frontend") != 0) {
    return -1;
  }
  *frontend = service.release();
  return 0;
}

// HTTP and metrics frontends alike.
int
fr_http_start(void* frontend, char* error, size_t error_size)
{
  return Check(
      static_cast<triton::server::HTTPServer*>(frontend)->Start(), error, error_size, "starting an HTTP frontend");
}

int
fr_http_stop(void* frontend, uint32_t* exit_timeout_secs, char* error, size_t error_size)
{
  return Check(
      static_cast<triton::server::HTTPServer*>(frontend)->Stop(exit_timeout_secs, "HTTP"), error, error_size,
      "stopping an HTTP frontend");
}

}  // extern "C"
