// The server's pieces that need no socket: OpenAI request validation (one test per field family),
// the error shape, context checks, stop strings, logprobs, reply assembly and /metrics text.
#include <gtest/gtest.h>

#include <cmath>

#include "model/model.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/output.h"
#include "support.h"

namespace minfer::server {
namespace {

const ServingLimits kLimits{256, 4};

GenerationRequest chat(const std::string& extra) {
  return parse_generation_request(Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}", kLimits);
}

// The status and param of the ApiError that parsing `body` raises.
std::pair<int, std::string> refusal(Endpoint e, const std::string& body) {
  try {
    parse_generation_request(e, body, kLimits);
  } catch (const ApiError& err) {
    const Json j = err.body();
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("code"));
    return {err.status(), j["error"]["param"].is_string() ? j["error"]["param"].get<std::string>() : ""};
  }
  return {0, "accepted"};
}

std::pair<int, std::string> chat_refusal(const std::string& extra) {
  return refusal(Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}");
}

TEST(ServerApi, DefaultsAreOpenAIs) {
  const GenerationRequest r = chat("");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);
  EXPECT_FALSE(r.has_seed);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.top_logprobs);
}

TEST(ServerApi, BodyMustBeAJsonObject) {
  EXPECT_EQ(refusal(Endpoint::Chat, "{not json").first, 400);
  EXPECT_EQ(refusal(Endpoint::Chat, "[1,2]").first, 400);
  EXPECT_EQ(refusal(Endpoint::Chat, "").first, 400);
}

TEST(ServerApi, Messages) {
  EXPECT_EQ(refusal(Endpoint::Chat, "{}"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages":[]})").second, "messages");
  EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages":"hi"})").second, "messages");
  EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages":[{"role":"wizard","content":"hi"}]})").second, "messages[0].role");
  EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages":[{"role":"user","content":5}]})").second, "messages[0].content");
  EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages":[{"role":"user"}]})").second, "messages[0].content");
  EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})").second,
            "messages[0].content[0].type");
  const GenerationRequest r = parse_generation_request(
      Endpoint::Chat,
      R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]})",
      kLimits);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].content, "");
}

TEST(ServerApi, Prompt) {
  const auto prompt = [](const std::string& p) {
    return parse_generation_request(Endpoint::Completion, R"({"prompt":)" + p + "}", kLimits);
  };
  EXPECT_EQ(prompt(R"("hello")").prompt_text, "hello");
  EXPECT_EQ(prompt(R"(["hello"])").prompt_text, "hello");
  EXPECT_EQ(prompt("[1,2,3]").prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(prompt("[[4,5]]").prompt_tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(refusal(Endpoint::Completion, "{}").second, "prompt");
  EXPECT_EQ(refusal(Endpoint::Completion, R"({"prompt":["a","b"]})").second, "prompt");
  EXPECT_EQ(refusal(Endpoint::Completion, R"({"prompt":[-1]})").second, "prompt");
  EXPECT_EQ(refusal(Endpoint::Completion, R"({"prompt":[1.5]})").second, "prompt[0]");
  EXPECT_EQ(refusal(Endpoint::Completion, R"({"prompt":{}})").second, "prompt");
}

TEST(ServerApi, Sampling) {
  const GenerationRequest r =
      chat(R"(,"temperature":0,"top_p":0.5,"top_k":7,"min_p":0.1,"presence_penalty":-2,"frequency_penalty":2,"seed":-3,"ignore_eos":true)");
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -2.0f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 2.0f);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.sampling.seed, uint64_t(-3));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(chat(R"(,"temperature":null)").sampling.temperature, 1.0f);  // null is absent
  // The ranges are the sampler's rules, with the CLI's message spelled with the request field.
  try {
    parse_generation_request(Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}],"top_p":2})", kLimits);
    ADD_FAILURE() << "top_p 2 accepted";
  } catch (const ApiError& err) {
    EXPECT_EQ(err.body()["error"]["message"], "top_p 2 is out of range: top_p must be in (0, 1]");
  }
  SamplerParams cli_rules;
  cli_rules.top_p = 2;
  EXPECT_THROW(cli_rules.validate(), Error);
  // top_k -1 is "off" (as vLLM), which the sampler spells 0; every accepted request passes its rules.
  EXPECT_EQ(chat(R"(,"top_k":-1)").sampling.top_k, 0);
  for (const char* extra : {R"(,"top_k":-1)", R"(,"temperature":2,"top_p":1,"repetition_penalty":3)", ""})
    EXPECT_NO_THROW(chat(extra).sampling.validate()) << extra;
  for (const auto& [extra, param] : std::vector<std::pair<std::string, std::string>>{
           {R"(,"temperature":2.5)", "temperature"},
           {R"(,"temperature":"hot")", "temperature"},
           {R"(,"top_p":0)", "top_p"},
           {R"(,"top_p":1.1)", "top_p"},
           {R"(,"top_k":-2)", "top_k"},
           {R"(,"min_p":2)", "min_p"},
           {R"(,"presence_penalty":3)", "presence_penalty"},
           {R"(,"repetition_penalty":0)", "repetition_penalty"},
           {R"(,"frequency_penalty":-2.1)", "frequency_penalty"},
           {R"(,"seed":1.5)", "seed"},
           {R"(,"ignore_eos":1)", "ignore_eos"}})
    EXPECT_EQ(chat_refusal(extra), std::make_pair(400, param)) << extra;
}

TEST(ServerApi, LengthsAndChoices) {
  EXPECT_EQ(*chat(R"(,"max_tokens":10)").max_tokens, 10);
  EXPECT_EQ(*chat(R"(,"max_tokens":10,"max_completion_tokens":20)").max_tokens, 20);
  EXPECT_EQ(chat(R"(,"n":4)").n, 4);
  for (const auto& [extra, param] : std::vector<std::pair<std::string, std::string>>{
           {R"(,"max_tokens":0)", "max_tokens"},
           {R"(,"max_tokens":-5)", "max_tokens"},
           {R"(,"max_tokens":257)", "max_tokens"},  // beyond the context
           {R"(,"max_tokens":99999999999999)", "max_tokens"},
           {R"(,"max_tokens":"10")", "max_tokens"},
           {R"(,"max_completion_tokens":1e3)", "max_completion_tokens"},
           {R"(,"n":0)", "n"},
           {R"(,"n":5)", "n"}})
    EXPECT_EQ(chat_refusal(extra), std::make_pair(400, param)) << extra;
}

TEST(ServerApi, StopLogprobsStreaming) {
  EXPECT_EQ(chat(R"(,"stop":"\n")").stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(chat(R"(,"stop":["a","bc"])").stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(chat_refusal(R"(,"stop":[""])").second, "stop");
  EXPECT_EQ(chat_refusal(R"(,"stop":[1])").second, "stop[0]");
  EXPECT_EQ(chat_refusal(R"(,"stop":5)").second, "stop");
  EXPECT_EQ(*chat(R"(,"logprobs":true,"top_logprobs":3)").top_logprobs, 3);
  EXPECT_EQ(*chat(R"(,"logprobs":true)").top_logprobs, 0);
  EXPECT_EQ(chat_refusal(R"(,"top_logprobs":2)").second, "top_logprobs");
  EXPECT_EQ(chat_refusal(R"(,"logprobs":true,"top_logprobs":21)").second, "top_logprobs");
  EXPECT_EQ(*parse_generation_request(Endpoint::Completion, R"({"prompt":"x","logprobs":2})", kLimits).top_logprobs, 2);
  const GenerationRequest s = chat(R"(,"stream":true,"stream_options":{"include_usage":true})");
  EXPECT_TRUE(s.stream && s.include_usage);
  EXPECT_EQ(chat_refusal(R"(,"stream":"yes")").second, "stream");
  EXPECT_EQ(chat_refusal(R"(,"tools":[{"type":"function"}])").second, "tools");
  EXPECT_EQ(chat_refusal(R"(,"response_format":{"type":"json_object"})").second, "response_format");
  EXPECT_EQ(chat_refusal(R"(,"user":"x","response_format":{"type":"text"},"tools":[])").first, 0);  // harmless ones pass
}

TEST(ServerApi, ContextBudget) {
  GenerationRequest r = chat("");
  EXPECT_EQ(completion_budget(r, 100, 256), 156);
  r.max_tokens = 100;
  EXPECT_EQ(completion_budget(r, 156, 256), 100);
  try {
    completion_budget(r, 157, 256);
    FAIL() << "accepted a prompt and completion beyond the context";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    const std::string m = e.what();
    for (const char* number : {"256", "257", "157", "100"}) EXPECT_NE(m.find(number), std::string::npos) << m;
    EXPECT_EQ(e.body()["error"]["code"], "context_length_exceeded");
  }
  r.max_tokens.reset();
  EXPECT_THROW(completion_budget(r, 256, 256), ApiError);
}

TEST(StopStringFilter, NeverShowsPartOfAStopString) {
  StopStringFilter f({"END", "\n\n"});
  EXPECT_EQ(f.push("Hello E"), "Hello ");  // "E" may start "END"
  EXPECT_EQ(f.push("N"), "");
  EXPECT_EQ(f.push("x"), "ENx");           // it did not
  EXPECT_EQ(f.push("ok\n"), "ok");
  EXPECT_EQ(f.push("\nrest"), "");         // "\n\n" appeared
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.push("more"), "");
  EXPECT_EQ(f.flush(), "");

  StopStringFilter g({"stop"});
  EXPECT_EQ(g.push("a sto"), "a ");
  EXPECT_EQ(g.flush(), "sto");  // generation ended: the held text was real text
  StopStringFilter h({"é!"});
  EXPECT_EQ(h.push("café"), "caf");  // the held part starts on a character boundary
  EXPECT_EQ(h.push("!"), "");
  EXPECT_TRUE(h.stopped());
  StopStringFilter none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

TEST(Logprobs, LogSoftmaxAndTopAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  const TokenLogprobs t = token_logprobs(logits, 4, 3);
  double norm = 0;
  for (float l : logits) norm += std::exp(double(l));
  EXPECT_NEAR(t.logprob, 0.5 - std::log(norm), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 1);  // ties: lower id first
  EXPECT_EQ(t.top[1].first, 3);
  EXPECT_EQ(t.top[2].first, 0);
  EXPECT_NEAR(t.top[2].second, 1.0 - std::log(norm), 1e-6);
  EXPECT_TRUE(token_logprobs(logits, 0, 0).top.empty());
}

TEST(ServerMetrics, PrometheusText) {
  ServerMetrics m;
  m.observe_first_token(0.05);
  m.observe_first_token(3.0);
  m.observe_time_per_output_token(0.02);
  SchedulerCounts c;
  c.running = 2;
  c.waiting = 1;
  c.kv_used = 5;
  c.kv_cached = 3;
  c.kv_total = 64;
  c.prompt_tokens = 100;
  c.generated_tokens = 40;
  c.prefix_hit_tokens = 64;
  c.decode_steps = {30, 0.125, 0.1};
  c.prompt_steps = {2, 0.5, 0.25};
  const std::string text = m.prometheus_text(c);
  for (const char* line :
       {"minfer_requests_running 2\n", "minfer_requests_waiting 1\n", "minfer_kv_blocks_used 5\n",
        "minfer_kv_blocks_cached 3\n", "minfer_kv_blocks_total 64\n", "minfer_prompt_tokens_total 100\n",
        "minfer_generated_tokens_total 40\n", "minfer_prefix_cache_hit_tokens_total 64\n",
        "minfer_steps_total{kind=\"decode\"} 30\n", "minfer_steps_total{kind=\"prompt\"} 2\n",
        "minfer_step_seconds_total{kind=\"decode\"} 0.125\n", "minfer_step_forward_seconds_total{kind=\"prompt\"} 0.25\n",
        "# TYPE minfer_step_seconds_total counter\n",
        "# TYPE minfer_time_to_first_token_seconds histogram\n",
        "minfer_time_to_first_token_seconds_bucket{le=\"0.04\"} 0\n",
        "minfer_time_to_first_token_seconds_bucket{le=\"0.06\"} 1\n",
        "minfer_time_to_first_token_seconds_bucket{le=\"2.5\"} 1\n",
        "minfer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n", "minfer_time_to_first_token_seconds_count 2\n",
        "minfer_time_to_first_token_seconds_sum 3.05\n",
        "minfer_time_per_output_token_seconds_bucket{le=\"0.025\"} 1\n", "# TYPE minfer_generated_tokens_total counter\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

const Tokenizer& default_tokenizer() {
  static const Model model = Model::load((test::source_dir() / "models" / "default.gguf").string());
  static const Tokenizer tok = Tokenizer::from_gguf(model.file);
  return tok;
}

TEST(ServerApi, PromptTokens) {
  const Tokenizer& tok = default_tokenizer();
  const ChatPrompt chat_prompt(tok, false);
  const auto completion = [](const std::string& body) {
    return parse_generation_request(Endpoint::Completion, body, kLimits);
  };
  // Special-token text in a completion prompt is the special token, as in llama.cpp and vLLM.
  EXPECT_EQ(prompt_tokens(completion(R"({"prompt":"<|im_start|>user"})"), tok, chat_prompt).front(), 1);
  EXPECT_EQ(prompt_tokens(completion(R"({"prompt":[5,6]})"), tok, chat_prompt), (std::vector<int32_t>{5, 6}));
  EXPECT_THROW(prompt_tokens(completion(R"({"prompt":[4096]})"), tok, chat_prompt), ApiError);  // beyond the vocabulary
  EXPECT_THROW(prompt_tokens(completion(R"({"prompt":""})"), tok, chat_prompt), ApiError);
  const GenerationRequest c = chat("");
  const std::vector<int32_t> ids = prompt_tokens(c, tok, chat_prompt);
  EXPECT_EQ(ids, chat_prompt.tokens(c.messages, true));  // the model's template with a generation prompt
}

TEST(ReplyAssembler, StreamsTextHoldsStopStringsAndCountsTokens) {
  const Tokenizer& tok = default_tokenizer();
  const std::vector<int32_t> ids = tok.encode(" In the beginning God created the heaven and the earth.", false, false);
  ASSERT_GT(ids.size(), 6u);
  ReplyAssembler a(tok, 2, {"God"});
  std::vector<GenerationEvent> events;
  for (int32_t id : ids) {
    events.push_back(GenerationEvent::generated(0, id));
    events.push_back(GenerationEvent::generated(1, id));
  }
  std::vector<ReplyAssembler::Delta> deltas;
  std::vector<int> stopped;
  a.apply(events, deltas, stopped);
  EXPECT_EQ(stopped, std::vector<int>({0, 1}));
  EXPECT_TRUE(a.done());
  const auto out = a.outputs();
  EXPECT_EQ(out[0].text, " In the beginning ");
  EXPECT_TRUE(out[0].stopped_by_string);
  EXPECT_STREQ(openai_finish_reason(out[1]), "stop");
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_TRUE(deltas[0].first);
  EXPECT_STREQ(deltas[0].finish_reason, "stop");
  // Tokens are counted up to the one that completed the stop string.
  EXPECT_EQ(a.completion_tokens(), 2 * int64_t(tok.encode(" In the beginning God", false, false).size()));

  ReplyAssembler b(tok, 1, {});
  deltas.clear();
  b.apply({GenerationEvent::generated(0, ids[0]), GenerationEvent::end(0, FinishReason::Length)}, deltas, stopped);
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_STREQ(deltas[0].finish_reason, "length");
  EXPECT_EQ(b.outputs()[0].text, tok.decode(std::vector<int32_t>{ids[0]}));
}

TEST(ReplyJson, ChunksRepliesAndErrors) {
  const Tokenizer& tok = default_tokenizer();
  const ReplyHeader h{Endpoint::Chat, "chatcmpl-1", 7, "m"};
  const Json first = chunk_json(h, 0, "Hi", Json(), nullptr, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const Json last = chunk_json(h, 1, "", Json(), "length", false);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["index"], 1);
  ChoiceOutput c;
  c.text = "x";
  c.finish = FinishReason::Stop;
  c.logprobs.push_back(TokenLogprobs{tok.encode(" the", false, false)[0], -0.5f, {{5, -1.0f}}});
  const Json reply = reply_json(h, {c}, tok, true, usage_json(3, 1));
  EXPECT_EQ(reply["choices"][0]["message"]["content"], "x");
  EXPECT_EQ(reply["choices"][0]["logprobs"]["content"][0]["token"], " the");
  EXPECT_EQ(reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(reply["usage"]["total_tokens"], 4);
  const Json legacy = logprobs_json(Endpoint::Completion, c.logprobs, tok, 0);
  EXPECT_EQ(legacy["tokens"][0], " the");
  EXPECT_EQ(legacy["text_offset"][0], 0);
  // The model's bytes need not be UTF-8: they are sent with U+FFFD, never an exception.
  EXPECT_EQ(dump(Json("a\xff")), "\"a\xEF\xBF\xBD\"");
  const Json err = ApiError(413, "too big").body();
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(err["error"]["param"].is_null());
}

}  // namespace
}  // namespace minfer::server
