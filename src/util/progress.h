// Progress reporting for long operations (synth, quantize, convert, perplexity, weight upload).
#pragma once
#include <functional>
#include <string>

namespace minfer {

// A callback taking the fraction done that draws "label [#####     ] 42%" on stderr: redrawn in
// place on a terminal, one line per 10% otherwise (logs stay readable).
std::function<void(double)> stderr_progress_bar(std::string label);

}  // namespace minfer
