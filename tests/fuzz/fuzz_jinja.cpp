// libFuzzer target: a chat template is untrusted input inside a model file. Any byte string must
// either parse and render within the limits of jinja.h or throw minfer::Error (TemplateError);
// crashes, hangs, sanitizer reports, leaks and other exception types are bugs.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/jinja/jinja.h"

namespace {

using minfer::jinja::Array;
using minfer::jinja::Context;
using minfer::jinja::Value;

Value dict(std::initializer_list<std::pair<const char*, Value>> entries) {
  Value d = minfer::jinja::make_dict();
  for (const auto& [k, v] : entries) d.object().set(k, v);
  return d;
}

// What a chat renders with: every message role, a tool call and a tool, so that real templates
// in the seed corpus take their usual paths.
const Context& chat_context() {
  static const Context context = [] {
    const Value tool_call = dict({{"type", "function"},
                                  {"function", dict({{"name", "get_weather"},
                                                     {"arguments", dict({{"city", "Paris"}, {"days", 3}})}})}});
    const Array messages = {
        dict({{"role", "system"}, {"content", "You are helpful."}}),
        dict({{"role", "user"}, {"content", "What is the weather in Paris?"}}),
        dict({{"role", "assistant"}, {"content", ""}, {"tool_calls", Array{tool_call}}}),
        dict({{"role", "tool"}, {"content", "sunny, 21 C"}, {"tool_call_id", "call_1"}}),
        dict({{"role", "assistant"}, {"content", "It is sunny."}, {"reasoning_content", "The tool said so."}}),
        dict({{"role", "user"}, {"content", "Thanks! \xf0\x9f\xa6\x99 <|im_end|>"}}),
    };
    const Value tool = dict({{"type", "function"},
                             {"function", dict({{"name", "get_weather"},
                                                {"description", "Weather forecast"},
                                                {"parameters", dict({{"type", "object"}})}})}});
    return Context{{"bos_token", "<s>"},
                   {"eos_token", "</s>"},
                   {"messages", Value(messages)},
                   {"tools", Value(Array{tool})},
                   {"add_generation_prompt", true},
                   {"enable_thinking", false}};
  }();
  return context;
}

}  // namespace

// A hundredth of the real budget: the same code paths, including running out, at a rate that
// reaches a million executions (a full budget takes seconds under the sanitizers).
constexpr uint64_t kFuzzRenderSteps = minfer::jinja::kMaxRenderSteps / 100;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const auto tmpl = minfer::jinja::Template::parse(source);
    volatile size_t sink = tmpl.render(chat_context(), kFuzzRenderSteps).size();
    (void)sink;
  } catch (const minfer::Error&) {
  }
  return 0;
}
