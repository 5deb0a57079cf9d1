// libFuzzer target: any byte string must either parse into a validated File or throw minfer::Error;
// crashes, sanitizer reports, leaks and other exception types are bugs.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gguf/gguf.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::make_shared<const std::vector<uint8_t>>(data, data + size);
  try {
    const auto file = minfer::gguf::File::parse(std::move(bytes), "fuzz.gguf");
    // Touch what a loader would: every tensor's bytes (the sanitizers check they are in bounds).
    unsigned sum = 0;
    for (const auto& t : file.tensors())
      if (t.nbytes) sum += t.data[0] + t.data[t.nbytes - 1];
    for (const auto& [key, value] : file.metadata()) sum += unsigned(key.size() + value.array.size());
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const minfer::Error&) {
  }
  return 0;
}
