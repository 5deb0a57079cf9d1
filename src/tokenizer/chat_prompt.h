// A conversation turned into prompt tokens the way the model expects: its own chat template
// (tokenizer.chat_template), or ChatML when it has none or the template does not parse; bos/eos
// text from its vocabulary; a BOS token when the model wants one and the template did not write it.
// Shared by `minfer chat` and `minfer serve`.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace minfer {

class ChatPrompt {
 public:
  // force_chatml: ignore the model's template.
  ChatPrompt(const Tokenizer& tok, bool force_chatml);
  bool uses_model_template() const { return tmpl_.has_value(); }
  // Why the model's own template is not used; "" when it is or ChatML was asked for.
  const std::string& fallback_reason() const { return fallback_reason_; }
  // Throws jinja::TemplateRaised when the template rejects the conversation (raise_exception),
  // jinja::TemplateError for other template failures; both are minfer::Error.
  std::vector<int32_t> tokens(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

 private:
  const Tokenizer& tok_;
  std::optional<ChatTemplate> tmpl_;
  std::string bos_, eos_, fallback_reason_;
};

}  // namespace minfer
