#include "tokenizer/chat_template.h"

namespace minfer {

jinja::Value json_to_value(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return jinja::None{};
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_integer: return j.get<int64_t>();
    case Json::value_t::number_unsigned: return static_cast<int64_t>(j.get<uint64_t>());
    case Json::value_t::number_float: return j.get<double>();
    case Json::value_t::string: return j.get<std::string>();
    case Json::value_t::array: {
      jinja::Array out;
      for (auto& item : j) out.push_back(json_to_value(item));
      return out;
    }
    case Json::value_t::object: {
      jinja::Value out = jinja::make_dict();
      for (auto& [k, v] : j.items()) out.object().set(k, json_to_value(v));
      return out;
    }
    default: fail("chat template input: unsupported JSON value (", j.type_name(), ")");
  }
}

Json messages_to_json(const std::vector<ChatMessage>& messages) {
  Json out = Json::array();
  for (auto& m : messages) {
    Json j = {{"role", m.role}, {"content", m.content}};
    if (m.tool_calls) j["tool_calls"] = *m.tool_calls;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
    out.push_back(std::move(j));
  }
  return out;
}

ChatTemplate::ChatTemplate(const std::string& source) : tmpl_(jinja::Template::parse(source)) {}

std::string ChatTemplate::render(const Json& messages, const Json& tools, bool add_generation_prompt,
                                 const std::string& bos, const std::string& eos, const Json& extra) const {
  if (!messages.is_array()) fail("chat template: messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) fail("chat template: tools must be null or a JSON array");
  if (!extra.is_object()) fail("chat template: extra variables must be a JSON object");
  // The variables transformers passes: the special tokens it knows, then the call's arguments.
  jinja::Context ctx;
  if (!bos.empty()) ctx.emplace_back("bos_token", bos);
  if (!eos.empty()) ctx.emplace_back("eos_token", eos);
  ctx.emplace_back("messages", json_to_value(messages));
  ctx.emplace_back("tools", json_to_value(tools));
  ctx.emplace_back("add_generation_prompt", add_generation_prompt);
  for (auto& [k, v] : extra.items()) ctx.emplace_back(k, json_to_value(v));
  return tmpl_.render(ctx);
}

std::string render_chat(const std::string& tmpl, const Json& messages, const Json& tools,
                        bool add_generation_prompt, const std::string& bos, const std::string& eos,
                        const Json& extra) {
  return ChatTemplate(tmpl).render(messages, tools, add_generation_prompt, bos, eos, extra);
}

std::string render_chat(const std::string& tmpl, const std::vector<ChatMessage>& messages,
                        const Json& tools, bool add_generation_prompt, const std::string& bos,
                        const std::string& eos, const Json& extra) {
  return render_chat(tmpl, messages_to_json(messages), tools, add_generation_prompt, bos, eos, extra);
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace minfer
