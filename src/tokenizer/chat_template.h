// Chat prompts rendered by the model's own Jinja template (tokenizer.chat_template), the way
// transformers' apply_chat_template renders them, plus a ChatML fallback.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/jinja.h"

namespace minfer {

// Ordered so that tojson prints keys in the order given, as Python's json.dumps does.
using Json = nlohmann::ordered_json;

struct ChatMessage {
  std::string role;
  std::string content;
  std::optional<Json> tool_calls = std::nullopt;  // [{"type": "function", "function": {...}}]
  std::string tool_call_id = {};  // this and the fields below are left out when empty
  std::string name = {};
  std::string reasoning_content = {};
};

Json messages_to_json(const std::vector<ChatMessage>& messages);

class ChatTemplate {
 public:
  // Throws jinja::TemplateError (line and column) when the template does not parse.
  explicit ChatTemplate(const std::string& source);
  // messages: a JSON array of message objects; tools: null (no tools) or an array; extra: an
  // object of further template variables (e.g. enable_thinking). bos/eos: empty leaves
  // bos_token / eos_token undefined. Throws jinja::TemplateRaised when the template calls
  // raise_exception, jinja::TemplateError for other runtime errors.
  std::string render(const Json& messages, const Json& tools, bool add_generation_prompt,
                     const std::string& bos, const std::string& eos, const Json& extra = Json::object()) const;

 private:
  jinja::Template tmpl_;
};

std::string render_chat(const std::string& tmpl, const std::vector<ChatMessage>& messages,
                        const Json& tools, bool add_generation_prompt, const std::string& bos,
                        const std::string& eos, const Json& extra = Json::object());
std::string render_chat(const std::string& tmpl, const Json& messages, const Json& tools,
                        bool add_generation_prompt, const std::string& bos, const std::string& eos,
                        const Json& extra = Json::object());

// <|im_start|>role\ncontent<|im_end|>\n per message (+ "<|im_start|>assistant\n").
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

jinja::Value json_to_value(const Json& j);

}  // namespace minfer
