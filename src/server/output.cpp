#include "server/output.h"

#include <algorithm>
#include <cmath>

namespace minfer::server {

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return "";
  held_ += text;
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // The longest end of the text that begins some stop string waits for the next token. A stop
  // string is valid UTF-8, so what waits starts on a character boundary.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n) {
  double max_logit = -INFINITY;
  for (const float l : logits) max_logit = std::max(max_logit, double(l));
  double sum = 0;
  for (const float l : logits) sum += std::exp(double(l) - max_logit);
  const double log_norm = max_logit + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - log_norm);
  // The top_n best, kept sorted while scanning the row once.
  const auto better = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  std::vector<int32_t> best;
  best.reserve(size_t(top_n) + 1);
  for (int32_t id = 0; top_n > 0 && id < int32_t(logits.size()); ++id) {
    if (int(best.size()) == top_n && !better(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, better), id);
    if (int(best.size()) > top_n) best.pop_back();
  }
  for (const int32_t id : best) out.top.emplace_back(id, float(double(logits[size_t(id)]) - log_norm));
  return out;
}

ReplyAssembler::ReplyAssembler(const Tokenizer& tok, int n_choices, const std::vector<std::string>& stop) {
  choices_.reserve(size_t(n_choices));
  for (int c = 0; c < n_choices; ++c) choices_.push_back(Choice{StreamDecoder(tok), StopStringFilter(stop), {}});
}

ReplyAssembler::Delta& ReplyAssembler::delta_for(int choice, std::vector<Delta>& deltas, std::vector<int>& index) {
  if (index[size_t(choice)] < 0) {
    index[size_t(choice)] = int(deltas.size());
    Choice& c = choices_[size_t(choice)];
    Delta d;
    d.choice = choice;
    d.first = !c.announced;
    d.text_offset = c.out.text.size();
    deltas.push_back(std::move(d));
  }
  return deltas[size_t(index[size_t(choice)])];
}

void ReplyAssembler::end(Choice& c, FinishReason reason, Delta& d) {
  c.out.finish = reason;
  d.finish_reason = openai_finish_reason(c.out);
  ++n_finished_;
}

void ReplyAssembler::apply(const std::vector<GenerationEvent>& events, std::vector<Delta>& deltas, std::vector<int>& stopped) {
  const size_t first_new = deltas.size();
  std::vector<int> index(choices_.size(), -1);
  for (const GenerationEvent& e : events) {
    Choice& c = choices_[size_t(e.choice)];
    if (c.out.finish) continue;  // tokens after a stop string, or the engine's end of a stopped choice
    Delta& d = delta_for(e.choice, deltas, index);
    std::string text;
    if (e.finished) {
      text = c.filter.push(c.decoder.flush());
      text += c.filter.flush();
      end(c, e.reason, d);
    } else {
      ++c.tokens;
      if (e.logprobs) {
        d.logprobs.push_back(*e.logprobs);
        c.out.logprobs.push_back(*e.logprobs);
      }
      text = c.filter.push(c.decoder.push(e.token));
      if (c.filter.stopped()) {
        c.out.stopped_by_string = true;
        end(c, FinishReason::Stop, d);
        stopped.push_back(e.choice);
      }
    }
    d.text += text;
    c.out.text += text;
  }
  // A token that completed no character (or only held text back) shows nothing yet.
  for (size_t i = deltas.size(); i-- > first_new;) {
    const Delta& d = deltas[i];
    if (!d.text.empty() || !d.logprobs.empty() || d.finish_reason) continue;
    if (d.first) choices_[size_t(d.choice)].announced = false;
    deltas.erase(deltas.begin() + ptrdiff_t(i));
  }
  for (size_t i = first_new; i < deltas.size(); ++i) choices_[size_t(deltas[i].choice)].announced = true;
}

void ReplyAssembler::finish_all(FinishReason reason, std::vector<Delta>& deltas) {
  std::vector<int> index(choices_.size(), -1);
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (c.out.finish) continue;
    Delta& d = delta_for(int(i), deltas, index);
    d.text = c.filter.push(c.decoder.flush()) + c.filter.flush();
    c.out.text += d.text;
    end(c, reason, d);
    c.announced = true;
  }
}

int64_t ReplyAssembler::completion_tokens() const {
  int64_t n = 0;
  for (const Choice& c : choices_) n += c.tokens;
  return n;
}

int ReplyAssembler::most_tokens() const {
  int n = 0;
  for (const Choice& c : choices_) n = std::max(n, c.tokens);
  return n;
}

std::vector<ChoiceOutput> ReplyAssembler::outputs() const {
  std::vector<ChoiceOutput> out;
  for (const Choice& c : choices_) out.push_back(c.out);
  return out;
}

}  // namespace minfer::server
