// What one Template::render may spend (the limits are in jinja.h). A template comes from a model
// file, so one that loops, compares, sorts or serializes without end must stop with a
// TemplateError, not hang. Work is charged where it grows with the data: every statement and loop
// iteration, every value walked, compared or serialized, every dict entry searched, and every
// kBytesPerStep bytes a string helper scans or builds. The helpers that charge (equals, to_json,
// pystr) also run outside renders, so the budget of the render in progress on this thread is found
// through a thread-local pointer; outside a render charging costs nothing and never throws.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace minfer::jinja::detail {

// The budget of one render: installs itself as this thread's budget until destroyed.
class RenderBudget {
 public:
  explicit RenderBudget(uint64_t max_steps);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  const uint64_t max_steps;
  uint64_t used = 0;

 private:
  RenderBudget* previous_;
};

// Scanning or copying bytes is far cheaper than interpreting a statement: this many make a step.
inline constexpr size_t kBytesPerStep = 16;

void charge(uint64_t steps);  // throws TemplateError once the render has spent its max_steps
inline void charge_bytes(size_t n) { charge(1 + n / kBytesPerStep); }

// Throw TemplateError when a string the template builds (`what`: "output", "~ result", ...)
// would exceed kMaxRenderBytes, or a list kMaxSequence elements, before it is allocated.
void check_string_size(uint64_t bytes, std::string_view what);
void check_list_size(uint64_t elements, std::string_view what);

}  // namespace minfer::jinja::detail
