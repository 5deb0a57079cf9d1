// The HTTP side of `minfer serve`: routes, the API key, body limits, OpenAI errors, SSE. HTTP
// threads parse and validate requests, submit them to the Worker and write what its channels
// carry; they know the engine only through Worker, the tokenizer and the chat prompt.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "server/api.h"
#include "server/metrics.h"
#include "server/worker.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace minfer::server {

// Connections the kernel completes and queues for accept(). httplib 0.11 listens with 5
// (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's library): a burst of clients connecting at
// once overflows that queue: the kernel drops SYNs (a client waits a 1 s retransmit) and answers
// others with SYN cookies; when a request's first segment is dropped, its next one fails the
// cookie check and the connection is reset (bench-serve at 64 clients: "failure: Read").
constexpr int kListenBacklog = 4096;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port
  std::string api_key;             // "": no key needed
  int threads = 64;                // connections served at once
  double request_timeout_s = 600;  // generation time per request; then it ends with "length"
  size_t max_body_bytes = 4 << 20;
};

// The model side, once loaded.
struct ServingModel {
  std::string id;  // the name /v1/models reports
  const Tokenizer& tokenizer;
  const ChatPrompt& chat;
  Worker& worker;
  ServingLimits limits;
};

class HttpServer {
 public:
  HttpServer(HttpOptions opts, ServerMetrics& metrics);
  ~HttpServer();
  // Binds the listening socket and returns its port; throws minfer::Error when it cannot. Its
  // accept queue holds kListenBacklog connections (capped by net.core.somaxconn).
  int bind();
  // Serves until stop(); /health answers 503 until set_model.
  void serve();
  // Stops accepting; requests in progress end (cancelled) at their next wake-up.
  void stop();
  void set_model(const ServingModel* model) { model_.store(model); }

 private:
  void routes();
  const ServingModel& ready_model() const;  // throws ApiError 503 while loading

  HttpOptions opts_;
  ServerMetrics& metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<const ServingModel*> model_{nullptr};
  std::atomic<bool> stopping_{false};
  int listen_socket_ = -1;  // the socket httplib binds, seen through its socket-options hook
};

}  // namespace minfer::server
