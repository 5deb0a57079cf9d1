#include "tokenizer/chat_prompt.h"

namespace minfer {

ChatPrompt::ChatPrompt(const Tokenizer& tok, bool force_chatml)
    : tok_(tok),
      bos_(tok.bos() >= 0 ? tok.token_text(tok.bos()) : ""),
      eos_(tok.eos() >= 0 ? tok.token_text(tok.eos()) : "") {
  if (force_chatml) return;
  const std::string source = tok.chat_template();
  if (source.empty()) {
    fallback_reason_ = "the model has no tokenizer.chat_template";
    return;
  }
  try {
    tmpl_.emplace(source);
  } catch (const jinja::TemplateError& e) {
    fallback_reason_ = e.what();
  }
}

std::vector<int32_t> ChatPrompt::tokens(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  const std::string text = tmpl_ ? tmpl_->render(messages_to_json(messages), Json(), add_generation_prompt, bos_, eos_)
                                 : render_chatml(messages, add_generation_prompt);
  std::vector<int32_t> ids = tok_.encode(text, false, true);
  // Templates usually write bos_token themselves; add it when the model wants one and they did not.
  if (tok_.add_bos() && tok_.bos() >= 0 && (ids.empty() || ids.front() != tok_.bos())) ids.insert(ids.begin(), tok_.bos());
  return ids;
}

}  // namespace minfer
