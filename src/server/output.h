// Generated tokens turned into what a client sees: text that never shows part of a stop string,
// log-probabilities computed from a logits row, and a whole reply assembled from a request's
// generation events (the same for streamed and whole replies).
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"
#include "server/worker.h"
#include "tokenizer/tokenizer.h"

namespace minfer::server {

// Holds back the end of the text while it could be the start of a stop string, so a stream never
// shows part of one; once a stop string appears, only the text before it is let through.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends generated text; returns what can be sent now.
  std::string push(std::string_view text);
  // Generation ended without a stop string: what was held back.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// log_softmax(logits)[token] and the top_n most likely tokens (ties: lower id first), in double.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n);

// One request's choices built from its events: detokenized text (whole UTF-8 characters, stop
// strings held back), logprobs, generated-token counts and finish reasons.
class ReplyAssembler {
 public:
  // What one choice gained from a batch of events.
  struct Delta {
    int choice = 0;
    bool first = false;  // the choice's first delta
    std::string text;
    size_t text_offset = 0;  // where text starts in the choice's whole text
    std::vector<TokenLogprobs> logprobs;
    const char* finish_reason = nullptr;  // set on the choice's last delta
  };

  ReplyAssembler(const Tokenizer& tok, int n_choices, const std::vector<std::string>& stop);
  // Applies the events; appends what each choice gained (choices that gained nothing visible are
  // left out) and the choices whose stop string just appeared (they must stop generating).
  void apply(const std::vector<GenerationEvent>& events, std::vector<Delta>& deltas, std::vector<int>& stopped);
  // Ends every unfinished choice (a timeout ends them with Length).
  void finish_all(FinishReason reason, std::vector<Delta>& deltas);
  bool done() const { return n_finished_ == choices_.size(); }
  int64_t completion_tokens() const;
  int most_tokens() const;  // of any one choice
  std::vector<ChoiceOutput> outputs() const;

 private:
  struct Choice {
    StreamDecoder decoder;
    StopStringFilter filter;
    ChoiceOutput out;
    int tokens = 0;
    bool announced = false;
  };
  Delta& delta_for(int choice, std::vector<Delta>& deltas, std::vector<int>& index);
  void end(Choice& c, FinishReason reason, Delta& d);

  std::vector<Choice> choices_;
  size_t n_finished_ = 0;
};

}  // namespace minfer::server
