// The OpenAI API as minfer serves it: request bodies parsed and validated into a
// GenerationRequest (every field family in one function, OpenAI's ranges), errors in OpenAI's
// shape, and the JSON of replies and stream chunks. Nothing here knows HTTP or the engine.
#pragma once
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/scheduler.h"
#include "sampling/sampler.h"
#include "tokenizer/chat_prompt.h"

namespace minfer::server {

// A request the server refuses: the HTTP status and OpenAI's
// {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::exception {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  Json body() const;
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int status_;
  std::string message_, param_, code_;
};

enum class Endpoint { Chat, Completion };  // /v1/chat/completions, /v1/completions

// What the server can run, for the range checks.
struct ServingLimits {
  int n_ctx = 0;        // positions per sequence: prompt + generated tokens
  int max_choices = 1;  // n at most
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::vector<ChatMessage> messages;  // chat
  std::string prompt_text;            // completion: text ...
  std::vector<int32_t> prompt_tokens; // ... or token ids
  std::optional<int> max_tokens;      // absent: what the context leaves
  SamplerParams sampling;             // OpenAI's defaults: temperature 1, no top-k/top-p/min-p
  bool has_seed = false;
  int n = 1;
  bool stream = false, include_usage = false;
  std::vector<std::string> stop;
  std::optional<int> top_logprobs;    // set when logprobs are wanted (0..20 alternatives)
  bool ignore_eos = false;
};

// Throws ApiError (400) naming the first field that is missing, of the wrong type or out of range.
GenerationRequest parse_generation_request(Endpoint endpoint, std::string_view body, const ServingLimits& limits);
// The body as a JSON object; ApiError 400 when it is not one.
Json parse_json_object(std::string_view body);

// The prompt's tokens (chat: rendered by the model's template). ApiError 400 when the template
// rejects the conversation, the prompt is empty or a token id is outside the vocabulary.
std::vector<int32_t> prompt_tokens(const GenerationRequest& req, const Tokenizer& tok, const ChatPrompt& chat);
// max_tokens for a prompt of n_prompt tokens; ApiError 400 (with the numbers) when prompt and
// completion do not fit the context.
int completion_budget(const GenerationRequest& req, int n_prompt, int n_ctx);

// One token's log-probability and its most likely alternatives, from the raw logits.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// The JSON of replies; id, created and model are the same in every chunk of one reply.
struct ReplyHeader {
  Endpoint endpoint;
  std::string id;
  int64_t created = 0;
  std::string model;
};

struct ChoiceOutput {
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  std::optional<FinishReason> finish;  // set when the choice has finished
  bool stopped_by_string = false;
};

// "stop" or "length" as OpenAI names them (a cancelled choice only reaches a client on timeout).
const char* openai_finish_reason(const ChoiceOutput& c);
Json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// A logprobs object in the endpoint's format (chat: content[]; completion: tokens/token_logprobs/...).
Json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& lps, const Tokenizer& tok, size_t text_offset);
// A stream chunk for one choice: new text (chat: the first carries role "assistant"), its logprobs
// and, on the last, the finish reason.
Json chunk_json(const ReplyHeader& h, int choice, const std::string& text, const Json& logprobs,
                const char* finish_reason, bool first);
Json usage_chunk_json(const ReplyHeader& h, const Json& usage);  // choices [] and the usage
Json reply_json(const ReplyHeader& h, const std::vector<ChoiceOutput>& choices, const Tokenizer& tok, bool with_logprobs,
                const Json& usage);

// JSON text for the wire: invalid UTF-8 from the model becomes U+FFFD instead of an exception.
std::string dump(const Json& j);

}  // namespace minfer::server
