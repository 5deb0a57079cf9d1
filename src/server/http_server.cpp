#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>

#include "server/chat_page.h"
#include "server/output.h"
#include "util/error.h"

namespace minfer::server {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kJson = "application/json";
// How often a request waiting for tokens checks that its client is still connected.
constexpr auto kClientCheckInterval = std::chrono::milliseconds(50);

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(dump(e.body()), kJson);
}

void write_json(httplib::Response& res, const Json& j) { res.set_content(dump(j), kJson); }

// Every handler answers with one clear error: ApiError as it says, anything else as a 500 that
// names it (a server fault, never the model's output).
template <typename Handler>
httplib::Server::Handler guarded(Handler handler) {
  return [handler](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const ApiError& e) {
      write_error(res, e);
    } catch (const std::exception& e) {
      write_error(res, ApiError(500, str_cat("internal error: ", e.what())));
    }
  };
}

bool keys_equal(const std::string& a, const std::string& b) {
  // Time independent of where they differ.
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool needs_key(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

uint64_t random_u64() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

std::string reply_id(Endpoint endpoint) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(random_u64()));
  return std::string(endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + hex;
}

// One generation request from submission to its last byte: waits on the channel, turns events
// into text, writes SSE chunks (stream) or one JSON reply, cancels when the client goes away.
class Reply {
 public:
  Reply(const ServingModel& model, ServerMetrics& metrics, const std::atomic<bool>& server_stopping,
        const GenerationRequest& req, Submission sub, int n_prompt, Clock::time_point arrival, double timeout_s)
      : model_(model), metrics_(metrics), server_stopping_(server_stopping), stream_(req.stream), include_usage_(req.include_usage),
        with_logprobs_(req.top_logprobs.has_value()), sub_(std::move(sub)), n_prompt_(n_prompt),
        header_{req.endpoint, reply_id(req.endpoint), int64_t(std::time(nullptr)), model.id},
        assembler_(model.tokenizer, req.n, req.stop), arrival_(arrival),
        deadline_(arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))) {}

  // httplib's content provider: runs until the reply is complete. false: the client is gone.
  bool write(httplib::DataSink& sink) {
    std::vector<GenerationEvent> events;
    std::vector<ReplyAssembler::Delta> deltas;
    std::vector<int> stopped;
    while (!assembler_.done()) {
      events.clear();
      deltas.clear();
      stopped.clear();
      sub_.channel->wait(events, std::min(deadline_, Clock::now() + kClientCheckInterval));
      if (server_stopping_ || !sink.is_writable()) return abandon();
      if (!events.empty() && !first_token_) {
        first_token_ = Clock::now();
        metrics_.observe_first_token(std::chrono::duration<double>(*first_token_ - arrival_).count());
      }
      assembler_.apply(events, deltas, stopped);
      for (const int c : stopped) sub_.channel->stop_choice(c);
      if (events.empty() && !assembler_.done()) {
        if (const std::string f = model_.worker.failure(); !f.empty()) return fail(sink, f);
      }
      if (!assembler_.done() && Clock::now() >= deadline_) {  // as llama.cpp's time limit: what was generated, "length"
        model_.worker.cancel(sub_.id);
        assembler_.finish_all(FinishReason::Length, deltas);
      }
      if (stream_ && !deltas.empty() && !send(sink, sse_chunks(deltas))) return abandon();
    }
    const Json usage = usage_json(n_prompt_, assembler_.completion_tokens());
    std::string tail;
    if (stream_) {
      if (include_usage_) tail = "data: " + dump(usage_chunk_json(header_, usage)) + "\n\n";
      tail += "data: [DONE]\n\n";
    } else {
      tail = dump(reply_json(header_, assembler_.outputs(), model_.tokenizer, with_logprobs_, usage));
    }
    if (!send(sink, tail)) return abandon();
    sink.done();
    if (first_token_ && assembler_.most_tokens() > 1)
      metrics_.observe_time_per_output_token(std::chrono::duration<double>(Clock::now() - *first_token_).count() /
                                             (assembler_.most_tokens() - 1));
    return true;
  }

  // The response ended before the reply did (the client went away): free the request's blocks.
  bool abandon() {
    if (!assembler_.done()) model_.worker.cancel(sub_.id);
    return false;
  }

 private:
  std::string sse_chunks(const std::vector<ReplyAssembler::Delta>& deltas) const {
    std::string out;
    for (const ReplyAssembler::Delta& d : deltas) {
      const Json logprobs = with_logprobs_ ? logprobs_json(header_.endpoint, d.logprobs, model_.tokenizer, d.text_offset) : Json();
      out += "data: " + dump(chunk_json(header_, d.choice, d.text, logprobs, d.finish_reason, d.first)) + "\n\n";
    }
    return out;
  }

  static bool send(httplib::DataSink& sink, const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); }

  // The engine stopped: the stream ends with an error event; a whole reply becomes the error.
  bool fail(httplib::DataSink& sink, const std::string& why) {
    const ApiError e(500, str_cat("the engine stopped: ", why));
    send(sink, stream_ ? "data: " + dump(e.body()) + "\n\ndata: [DONE]\n\n" : dump(e.body()));
    sink.done();
    return true;
  }

  const ServingModel& model_;
  ServerMetrics& metrics_;
  const std::atomic<bool>& server_stopping_;
  const bool stream_, include_usage_, with_logprobs_;
  const Submission sub_;
  const int n_prompt_;
  const ReplyHeader header_;
  ReplyAssembler assembler_;
  const Clock::time_point arrival_, deadline_;
  std::optional<Clock::time_point> first_token_;
};

Json tokenize(const ServingModel& m, const std::string& body_text) {
  const Json body = parse_json_object(body_text);
  const auto content = body.find("content");
  if (content == body.end() || !content->is_string()) throw ApiError(400, "'content' must be a string", "content");
  const auto flag = [&](const char* name) {
    const auto it = body.find(name);
    if (it == body.end() || it->is_null()) return false;
    if (!it->is_boolean()) throw ApiError(400, str_cat("'", name, "' must be true or false"), name);
    return it->get<bool>();
  };
  const bool add_special = flag("add_special"), with_pieces = flag("with_pieces");
  const std::vector<int32_t> ids = m.tokenizer.encode(content->get<std::string>(), add_special, true);
  Json tokens = Json::array();
  for (const int32_t id : ids) tokens.push_back(with_pieces ? Json{{"id", id}, {"piece", m.tokenizer.token_to_piece(id)}} : Json(id));
  return Json{{"tokens", tokens}};
}

Json detokenize(const ServingModel& m, const std::string& body_text) {
  const Json body = parse_json_object(body_text);
  const auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const Json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.tokenizer.n_vocab())
      throw ApiError(400, str_cat("'tokens' holds ", dump(t), ", which is not a token id (0 to ", m.tokenizer.n_vocab() - 1, ")"), "tokens");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return Json{{"content", m.tokenizer.decode(ids)}};
}

std::string status_message(const httplib::Request& req, int status, size_t max_body) {
  switch (status) {
    case 404: return str_cat("no route for ", req.method, " ", req.path);
    case 413: return str_cat("the request body is larger than the server's limit of ", max_body, " bytes");
    default: return str_cat("HTTP status ", status);
  }
}

}  // namespace

HttpServer::HttpServer(HttpOptions opts, ServerMetrics& metrics)
    : opts_(std::move(opts)), metrics_(metrics), http_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() = default;

const ServingModel& HttpServer::ready_model() const {
  const ServingModel* m = model_.load();
  if (!m) throw ApiError(503, "the model is loading", "", "loading");
  return *m;
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  const size_t threads = size_t(opts_.threads);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_tcp_nodelay(true);  // a streamed token must not wait for the previous one's ACK
  s.set_socket_options([this](socket_t sock) {  // called for the listening socket only
    httplib::default_socket_options(sock);
    listen_socket_ = sock;
  });
  s.set_keep_alive_max_count(100000);
  s.set_payload_max_length(opts_.max_body_bytes);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || !needs_key(req.path) ||
        keys_equal(req.get_header_value("Authorization"), "Bearer " + opts_.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    write_error(res, ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets itself (404, 413, 400 for a malformed request) get OpenAI's error shape.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) write_error(res, ApiError(res.status, status_message(req, res.status, opts_.max_body_bytes)));
  });

  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const std::string_view page = chat_page_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  s.Get("/health", guarded([this](const httplib::Request&, httplib::Response& res) {
    const ServingModel* m = model_.load();
    const std::string failure = m ? m->worker.failure() : "";
    res.status = m && failure.empty() ? 200 : 503;
    write_json(res, !m ? Json{{"status", "loading"}} : failure.empty() ? Json{{"status", "ok"}} : Json{{"status", "error"}, {"message", failure}});
  }));
  s.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.prometheus_text(ready_model().worker.counts()), "text/plain; version=0.0.4");
  }));
  s.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
    const ServingModel& m = ready_model();
    write_json(res, Json{{"object", "list"},
                         {"data", Json::array({Json{{"id", m.id}, {"object", "model"}, {"created", 0}, {"owned_by", "minfer"},
                                                    {"max_model_len", m.limits.n_ctx}}})}});
  }));
  s.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
    write_json(res, tokenize(ready_model(), req.body));
  }));
  s.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
    write_json(res, detokenize(ready_model(), req.body));
  }));
  for (const auto& [path, endpoint] : {std::pair{"/v1/chat/completions", Endpoint::Chat}, std::pair{"/v1/completions", Endpoint::Completion}}) {
    s.Post(path, guarded([this, endpoint = endpoint](const httplib::Request& req, httplib::Response& res) {
      const auto arrival = Clock::now();
      const ServingModel& m = ready_model();
      GenerationRequest g = parse_generation_request(endpoint, req.body, m.limits);
      const std::vector<int32_t> prompt = prompt_tokens(g, m.tokenizer, m.chat);
      Request r;
      r.max_tokens = completion_budget(g, int(prompt.size()), m.limits.n_ctx);
      r.prompt = prompt;
      r.sampling = g.sampling;
      if (!g.has_seed) r.sampling.seed = random_u64();
      r.n = g.n;
      r.ignore_eos = g.ignore_eos;
      std::optional<Submission> sub;
      try {
        sub = m.worker.submit(std::move(r), g.top_logprobs);
      } catch (const Error& e) {  // the engine stopped
        throw ApiError(503, e.what());
      }
      if (!sub) {
        res.set_header("Retry-After", "1");
        throw ApiError(429, "the server's queue is full; retry later", "", "queue_full");
      }
      auto reply = std::make_shared<Reply>(m, metrics_, stopping_, g, std::move(*sub), int(prompt.size()), arrival, opts_.request_timeout_s);
      res.set_chunked_content_provider(
          g.stream ? "text/event-stream" : kJson, [reply](size_t, httplib::DataSink& sink) { return reply->write(sink); },
          [reply](bool success) {
            if (!success) reply->abandon();
          });
      if (g.stream) res.set_header("Cache-Control", "no-cache");
    }));
  }
}

int HttpServer::bind() {
  const int port = opts_.port == 0 ? http_->bind_to_any_port(opts_.host) : (http_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (port < 0) fail("cannot listen on ", opts_.host, ":", opts_.port, ": ", std::strerror(errno));
  // httplib listened with a backlog of 5; listen() again on the listening socket sets the backlog.
  if (listen_socket_ < 0 || ::listen(listen_socket_, kListenBacklog) != 0)
    fail("cannot set the listen backlog of ", opts_.host, ":", port, ": ", std::strerror(errno));
  return port;
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::stop() {
  stopping_ = true;
  http_->stop();
}

}  // namespace minfer::server
