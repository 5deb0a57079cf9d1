#include "tokenizer/jinja/budget.h"

#include "tokenizer/jinja/jinja.h"

namespace minfer::jinja::detail {

namespace {
thread_local RenderBudget* g_active = nullptr;
}  // namespace

RenderBudget::RenderBudget(uint64_t max_steps) : max_steps(max_steps), previous_(g_active) { g_active = this; }
RenderBudget::~RenderBudget() { g_active = previous_; }

void charge(uint64_t steps) {
  if (!g_active) return;
  g_active->used += steps;
  if (g_active->used > g_active->max_steps)
    throw TemplateError(str_cat("rendering needs more than ", g_active->max_steps,
                                " steps, the limit for one render (a loop over too much data?)"));
}

void check_string_size(uint64_t bytes, std::string_view what) {
  if (bytes > kMaxRenderBytes)
    throw TemplateError(str_cat("the ", what, " would be ", bytes, " bytes, more than the limit of ",
                                kMaxRenderBytes, " bytes for one render"));
}

void check_list_size(uint64_t elements, std::string_view what) {
  if (elements > kMaxSequence)
    throw TemplateError(str_cat("the ", what, " would have ", elements, " elements, more than the limit of ",
                                kMaxSequence, " for one list"));
}

}  // namespace minfer::jinja::detail
