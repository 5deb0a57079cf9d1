#include "server/api.h"

#include <algorithm>

#include "util/error.h"

namespace minfer::server {

namespace {

const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

// A field that is present and not null (OpenAI treats null as absent).
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number_or(const Json& body, const char* name, double fallback) {
  const Json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, str_cat("'", name, "' must be a number"));
  return v->get<double>();
}

int64_t integer(const Json& v, const std::string& name) {
  if (!v.is_number_integer()) bad(name, str_cat("'", name, "' must be an integer"));
  return v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
}

std::optional<int64_t> integer_in(const Json& body, const char* name, int64_t lo, int64_t hi) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  const int64_t x = integer(*v, name);
  if (x < lo || x > hi) bad(name, str_cat("'", name, "' is ", x, "; it must be between ", lo, " and ", hi));
  return x;
}

bool boolean(const Json& body, const char* name, bool fallback) {
  const Json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, str_cat("'", name, "' must be true or false"));
  return v->get<bool>();
}

const std::string& string_at(const Json& v, const std::string& name) {
  if (!v.is_string()) bad(name, str_cat("'", name, "' must be a string"));
  return v.get_ref<const std::string&>();
}

// content: a string, or an array of text parts ({"type": "text", "text": ...}).
std::string message_content(const Json& v, const std::string& name) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(name, str_cat("'", name, "' must be a string or an array of text parts"));
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = str_cat(name, "[", i, "]");
    if (!v[i].is_object()) bad(part, str_cat("'", part, "' must be an object"));
    const auto type = v[i].find("type");
    if (type == v[i].end() || *type != "text")
      bad(part + ".type", str_cat("'", part, ".type' must be \"text\" (only text content is supported)"));
    const auto t = v[i].find("text");
    if (t == v[i].end()) bad(part + ".text", str_cat("'", part, ".text' is missing"));
    text += string_at(*t, part + ".text");
  }
  return text;
}

void parse_messages(const Json& body, GenerationRequest& r) {
  const Json* messages = field(body, "messages");
  if (!messages) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string at = str_cat("messages[", i, "]");
    if (!m.is_object()) bad(at, str_cat("'", at, "' must be an object"));
    const Json* role = field(m, "role");
    if (!role) bad(at + ".role", str_cat("'", at, ".role' is required"));
    ChatMessage msg;
    msg.role = string_at(*role, at + ".role");
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for the system message
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      bad(at + ".role", str_cat("'", at, ".role' is '", msg.role, "'; it must be system, developer, user, assistant or tool"));
    const auto content = m.find("content");
    if (content == m.end() && msg.role != "assistant") bad(at + ".content", str_cat("'", at, ".content' is required"));
    if (content != m.end()) msg.content = message_content(*content, at + ".content");
    if (const Json* name = field(m, "name")) msg.name = string_at(*name, at + ".name");
    if (const Json* id = field(m, "tool_call_id")) msg.tool_call_id = string_at(*id, at + ".tool_call_id");
    r.messages.push_back(std::move(msg));
  }
}

void token_ids(const Json& v, const std::string& name, std::vector<int32_t>& out) {
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t id = integer(v[i], str_cat(name, "[", i, "]"));
    if (id < 0 || id > INT32_MAX) bad(name, str_cat("'", name, "' holds the token id ", id, ", which is not a token"));
    out.push_back(int32_t(id));
  }
}

// prompt: a string, an array of token ids, or an array holding one of those.
void parse_prompt(const Json& body, GenerationRequest& r) {
  const Json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  const Json* one = p;
  if (p->is_array() && !p->empty() && !(*p)[0].is_number()) {
    if (p->size() != 1) bad("prompt", str_cat("'prompt' holds ", p->size(), " prompts; one prompt per request is supported"));
    one = &(*p)[0];
  }
  if (one->is_string()) {
    r.prompt_text = one->get<std::string>();
  } else if (one->is_array()) {
    if (one->empty()) bad("prompt", "'prompt' is empty");
    token_ids(*one, "prompt", r.prompt_tokens);
  } else {
    bad("prompt", "'prompt' must be a string or an array of token ids");
  }
}

void parse_sampling(const Json& body, GenerationRequest& r) {
  SamplerParams& s = r.sampling;
  // Types here; ranges are the sampler's own rules (SamplerParams::validate), the CLI's too.
  s.temperature = float(number_or(body, "temperature", 1.0));
  s.top_p = float(number_or(body, "top_p", 1.0));
  s.top_k = std::max(0, int(integer_in(body, "top_k", -1, 1 << 30).value_or(0)));  // -1 (vLLM's "off") is 0
  s.min_p = float(number_or(body, "min_p", 0.0));
  s.presence_penalty = float(number_or(body, "presence_penalty", 0.0));
  s.frequency_penalty = float(number_or(body, "frequency_penalty", 0.0));
  s.repeat_penalty = float(number_or(body, "repetition_penalty", 1.0));
  std::string refused;  // the request field the sampler's rules refuse
  try {
    s.validate([&refused](std::string_view name) {
      refused = name == "repeat_penalty" ? "repetition_penalty" : std::string(name);
      return refused;
    });
  } catch (const Error& e) {
    bad(refused, e.what());
  }
  if (const Json* seed = field(body, "seed")) {
    s.seed = uint64_t(integer(*seed, "seed"));
    r.has_seed = true;
  }
  r.ignore_eos = boolean(body, "ignore_eos", false);
}

void parse_lengths(const Json& body, const ServingLimits& limits, GenerationRequest& r) {
  // max_completion_tokens is OpenAI's newer name; it wins when both are given.
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (const auto v = integer_in(body, name, 1, INT64_MAX)) {
      if (*v > limits.n_ctx)
        bad(name, str_cat("'", name, "' is ", *v, ", but this model's context holds ", limits.n_ctx, " tokens in all"));
      r.max_tokens = int(*v);
    }
  r.n = int(integer_in(body, "n", 1, limits.max_choices).value_or(1));
}

void parse_stop(const Json& body, GenerationRequest& r) {
  constexpr size_t kMaxStops = 16;
  const Json* stop = field(body, "stop");
  if (!stop) return;
  if (stop->is_string()) {
    r.stop.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > kMaxStops) bad("stop", str_cat("'stop' holds ", stop->size(), " strings; at most ", kMaxStops));
    for (size_t i = 0; i < stop->size(); ++i) r.stop.push_back(string_at((*stop)[i], str_cat("stop[", i, "]")));
  } else {
    bad("stop", "'stop' must be a string or an array of strings");
  }
  for (const std::string& s : r.stop)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
}

// chat: logprobs (bool) + top_logprobs (0..20); completion: logprobs is the number of alternatives.
void parse_logprobs(Endpoint endpoint, const Json& body, GenerationRequest& r) {
  constexpr int kMaxTop = 20;
  if (endpoint == Endpoint::Completion) {
    if (const auto n = integer_in(body, "logprobs", 0, kMaxTop)) r.top_logprobs = int(*n);
    return;
  }
  const auto top = integer_in(body, "top_logprobs", 0, kMaxTop);
  if (boolean(body, "logprobs", false)) {
    r.top_logprobs = int(top.value_or(0));
  } else if (top.value_or(0) > 0) {
    bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
}

void parse_streaming(const Json& body, GenerationRequest& r) {
  r.stream = boolean(body, "stream", false);
  if (const Json* o = field(body, "stream_options")) {
    if (!o->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*o, "include_usage", false);
  }
}

// Parameters that would change what the reply means: refused rather than silently ignored.
void refuse_unsupported(const Json& body) {
  if (const Json* tools = field(body, "tools"); tools && !(tools->is_array() && tools->empty()))
    bad("tools", "tool calling is not supported by this server");
  if (const Json* f = field(body, "response_format")) {
    const auto type = f->is_object() ? f->find("type") : f->end();
    if (!f->is_object() || type == f->end() || *type != "text")
      bad("response_format", "only 'response_format': {\"type\": \"text\"} is supported by this server");
  }
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : status_(status), message_(std::move(message)), param_(std::move(param)), code_(std::move(code)) {}

Json ApiError::body() const {
  Json e = Json::object();
  e["message"] = message_;
  e["type"] = error_type(status_);
  e["param"] = param_.empty() ? Json() : Json(param_);
  e["code"] = code_.empty() ? Json() : Json(code_);
  return Json{{"error", e}};
}

Json parse_json_object(std::string_view body) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");
  return j;
}

GenerationRequest parse_generation_request(Endpoint endpoint, std::string_view body_text, const ServingLimits& limits) {
  const Json body = parse_json_object(body_text);
  GenerationRequest r;
  r.endpoint = endpoint;
  if (const Json* model = field(body, "model")) string_at(*model, "model");  // any name: one model is served
  if (endpoint == Endpoint::Chat) {
    parse_messages(body, r);
  } else {
    parse_prompt(body, r);
  }
  parse_sampling(body, r);
  parse_lengths(body, limits, r);
  parse_stop(body, r);
  parse_logprobs(endpoint, body, r);
  parse_streaming(body, r);
  refuse_unsupported(body);
  return r;
}

std::vector<int32_t> prompt_tokens(const GenerationRequest& req, const Tokenizer& tok, const ChatPrompt& chat) {
  const char* param = req.endpoint == Endpoint::Chat ? "messages" : "prompt";
  std::vector<int32_t> ids;
  if (req.endpoint == Endpoint::Chat) {
    try {
      ids = chat.tokens(req.messages, true);
    } catch (const Error& e) {  // the template refused this conversation (e.g. roles out of order)
      throw ApiError(400, str_cat("the chat template cannot render these messages: ", e.what()), param);
    }
  } else if (!req.prompt_tokens.empty()) {
    ids = req.prompt_tokens;
    for (const int32_t id : ids)
      if (id >= tok.n_vocab()) bad(param, str_cat("'prompt' holds the token id ", id, "; the vocabulary has ", tok.n_vocab()));
  } else {
    ids = tok.encode(req.prompt_text, true, true);  // special-token text counts, as in llama.cpp and vLLM
  }
  if (ids.empty()) bad(param, str_cat("the ", param, " encode to no tokens"));
  return ids;
}

int completion_budget(const GenerationRequest& req, int n_prompt, int n_ctx) {
  const char* what = req.endpoint == Endpoint::Chat ? "messages" : "prompt";
  if (n_prompt >= n_ctx)
    throw ApiError(400, str_cat("This model's maximum context length is ", n_ctx, " tokens. However, your ", what,
                                " resulted in ", n_prompt, " tokens, which leaves no room for a completion."),
                   what, "context_length_exceeded");
  if (req.max_tokens && n_prompt + *req.max_tokens > n_ctx)
    throw ApiError(400, str_cat("This model's maximum context length is ", n_ctx, " tokens. However, you requested ",
                                n_prompt + *req.max_tokens, " tokens (", n_prompt, " in the ", what, ", ",
                                *req.max_tokens, " in the completion). Please reduce the length of the ", what,
                                " or completion."),
                   what, "context_length_exceeded");
  return req.max_tokens.value_or(n_ctx - n_prompt);
}

const char* openai_finish_reason(const ChoiceOutput& c) {
  if (c.stopped_by_string) return "stop";
  return c.finish == FinishReason::Stop ? "stop" : "length";
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

Json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& lps, const Tokenizer& tok, size_t text_offset) {
  if (endpoint == Endpoint::Chat) {
    const auto entry = [&](int32_t id, float lp) {
      const std::string piece = tok.token_to_piece(id);
      return Json{{"token", piece}, {"logprob", lp}, {"bytes", std::vector<uint8_t>(piece.begin(), piece.end())}};
    };
    Json content = Json::array();
    for (const TokenLogprobs& t : lps) {
      Json e = entry(t.token, t.logprob);
      e["top_logprobs"] = Json::array();
      for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(id, lp));
      content.push_back(std::move(e));
    }
    return Json{{"content", std::move(content)}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  for (const TokenLogprobs& t : lps) {
    const std::string piece = tok.token_to_piece(t.token);
    tokens.push_back(piece);
    token_logprobs.push_back(t.logprob);
    Json alternatives = Json::object();
    for (const auto& [id, lp] : t.top) alternatives[tok.token_to_piece(id)] = lp;
    top.push_back(std::move(alternatives));
    offsets.push_back(text_offset);
    text_offset += piece.size();
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

namespace {

Json reply_head(const ReplyHeader& h, const char* object) {
  return Json{{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

}  // namespace

Json chunk_json(const ReplyHeader& h, int choice, const std::string& text, const Json& logprobs,
                const char* finish_reason, bool first) {
  const bool chat = h.endpoint == Endpoint::Chat;
  Json j = reply_head(h, chat ? "chat.completion.chunk" : "text_completion");
  Json c = Json{{"index", choice}};
  if (chat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text;
  }
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish_reason ? Json(finish_reason) : Json();
  j["choices"] = Json::array({std::move(c)});
  return j;
}

Json usage_chunk_json(const ReplyHeader& h, const Json& usage) {
  Json j = reply_head(h, h.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = Json::array();
  j["usage"] = usage;
  return j;
}

Json reply_json(const ReplyHeader& h, const std::vector<ChoiceOutput>& choices, const Tokenizer& tok, bool with_logprobs,
                const Json& usage) {
  const bool chat = h.endpoint == Endpoint::Chat;
  Json j = reply_head(h, chat ? "chat.completion" : "text_completion");
  Json list = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    Json e = Json{{"index", i}};
    if (chat) {
      e["message"] = Json{{"role", "assistant"}, {"content", c.text}};
    } else {
      e["text"] = c.text;
    }
    e["logprobs"] = with_logprobs ? logprobs_json(h.endpoint, c.logprobs, tok, 0) : Json();
    e["finish_reason"] = openai_finish_reason(c);
    list.push_back(std::move(e));
  }
  j["choices"] = std::move(list);
  j["usage"] = usage;
  return j;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace minfer::server
