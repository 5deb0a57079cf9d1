// The minfer executable against hostile invocations (issue 14): nothing lost, nothing hung, no
// silent wrong answer. Every case runs the built binary as a user would and checks the exit
// status, the one error line and that the files involved are as they were. Commands that could
// hang run under `timeout`, so a regression fails instead of stalling the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "convert/synth.h"
#include "gguf/gguf.h"
#include "support.h"
#include "tokenizer/jinja/jinja.h"
#include "util/files.h"

namespace minfer {
namespace {

namespace fs = std::filesystem;

struct Result {
  int rc;
  std::string out;  // stdout and stderr
};


// `args` may end in redirections of minfer's stdin and stdout; its stderr is always captured.
// `shell_prefix` runs first in the same shell ("cd DIR && ", "printf ... | ").
Result minfer(const std::string& args, const std::string& shell_prefix = "") {
  Result r;
  r.rc = test::run_command("{ " + shell_prefix + "timeout 120 " + test::minfer_binary() + " " + args + "; }", &r.out);
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string default_model() { return (test::source_dir() / "models" / "default.gguf").string(); }

// One clear error: exit status 1 (not a signal, not a hang), the message, no internal error and
// no 300-digit number.
void expect_error(const Result& r, const std::string& fragment) {
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find(fragment), std::string::npos) << "expected '" << fragment << "' in:\n" << r.out;
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  EXPECT_LT(r.out.size(), 400u) << r.out;
}

// The default model with one metadata key replaced.
std::string default_model_with(const fs::path& dir, const std::string& key, gguf::Value value) {
  const gguf::File model = gguf::File::open(default_model());
  const std::string path = (dir / "model.gguf").string();
  gguf::Writer w(path);
  for (const auto& [k, v] : model.metadata()) w.set(k, v);
  w.set(key, std::move(value));
  for (const auto& t : model.tensors()) w.add_tensor(t.name, t.type, t.shape);
  w.begin_data();
  for (const auto& t : model.tensors()) w.write_tensor_data(t.name, t.data, t.nbytes);
  w.finish();
  return path;
}

std::string tiny_f16_model(const fs::path& dir) {
  synth::Options o;
  o.preset = "tiny";
  o.ftype = synth::FileType::F16;
  o.out_path = (dir / "in.gguf").string();
  synth::write_model(o);
  return o.out_path;
}

// ---- data loss -------------------------------------------------------------------------------

TEST(HostileInput, QuantizeNeverOverwritesItsInput) {
  const fs::path dir = test::temp_dir("hostile-quantize");
  const std::string in = tiny_f16_model(dir);
  const std::string original = slurp(in);
  fs::create_symlink(in, dir / "link.gguf");
  fs::create_hard_link(in, dir / "hard.gguf");
  for (const std::string out : {std::string("./in.gguf"), in, std::string("link.gguf"), std::string("hard.gguf"),
                                std::string("../") + dir.filename().string() + "/in.gguf"}) {
    const Result r = minfer("quantize in.gguf " + out + " q8_0", "cd " + dir.string() + " && ");
    expect_error(r, "is the input in.gguf (same file); writing it would destroy the input");
    EXPECT_TRUE(slurp(in) == original) << "input changed by quantize in.gguf " << out;
  }
  // A different output path works, and leaves no temporary file behind.
  const Result ok = minfer("quantize in.gguf out.gguf q8_0", "cd " + dir.string() + " && ");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find("minfer-tmp"), std::string::npos) << e.path();
}

TEST(HostileInput, ConvertNeverOverwritesItsCheckpoint) {
  const fs::path dir = test::temp_dir("hostile-convert");
  fs::copy(test::source_dir() / "tests" / "data" / "hf" / "qwen2", dir / "ckpt");
  const fs::path ckpt = dir / "ckpt";
  for (const char* name : {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}) {
    const std::string before = slurp(ckpt / name);
    expect_error(minfer("convert " + ckpt.string() + " -o " + (ckpt / name).string()), "(same file)");
    EXPECT_TRUE(slurp(ckpt / name) == before) << name;
  }
  // Writing a new file into the checkpoint directory is fine.
  const Result ok = minfer("convert " + ckpt.string() + " -o " + (ckpt / "model.gguf").string() + " --outtype f32");
  EXPECT_EQ(ok.rc, 0) << ok.out;
}

// `quantize IN /dev/full` as root used to delete the device node after the write error.
TEST(HostileInput, WritersNeverReplaceOrDeleteWhatIsNotARegularFile) {
  const fs::path dir = test::temp_dir("hostile-dev");
  const std::string in = tiny_f16_model(dir);
  for (const char* device : {"/dev/full", "/dev/null"}) {
    expect_error(minfer("quantize " + in + " " + device + " q8_0"), "is a character device");
    EXPECT_TRUE(fs::is_character_file(device)) << device;
  }
  expect_error(minfer("synth --preset tiny -o " + dir.string()), "is a directory");
}

// ---- hangs and unbounded memory -----------------------------------------------------------------

TEST(HostileInput, ReadersRefuseFifosDevicesAndDirectoriesAtOnce) {
  const fs::path dir = test::temp_dir("hostile-read");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(minfer("inspect " + fifo.string()), "is a named pipe (FIFO)");
  expect_error(minfer("run -m " + fifo.string() + " -p hi"), "is a named pipe (FIFO)");
  expect_error(minfer("perplexity -f " + fifo.string()), "is a named pipe (FIFO)");
  expect_error(minfer("perplexity -f /dev/zero"), "/dev/zero: is a character device");
  expect_error(minfer("perplexity -f " + dir.string()), "is a directory");
  expect_error(minfer("inspect " + dir.string()), "is a directory");
}

TEST(HostileInput, TextInputsHaveASizeLimit) {
  const fs::path dir = test::temp_dir("hostile-big");
  const fs::path big = dir / "big.txt";
  std::ofstream(big).close();
  fs::resize_file(big, kMaxTextFileBytes + 1);  // sparse: costs no disk
  expect_error(minfer("perplexity -f " + big.string()),
               std::to_string(kMaxTextFileBytes + 1) + " bytes is more than minfer reads from one text file");
  // chat reads lines: endless input without a newline ends in an error, not in gigabytes.
  expect_error(minfer("chat -n 1 < /dev/zero"), "an input line is longer than 1048576 bytes");
}

// A model file whose chat template never ends: chat reports the template error for that turn and
// carries on to the end of input instead of rendering for minutes.
TEST(HostileInput, ChatSurvivesAHostileTemplate) {
  const std::string hostile = default_model_with(
      test::temp_dir("hostile-template"), "tokenizer.chat_template",
      gguf::Value::from_string("{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}"));
  const Result r = minfer("chat -m " + hostile + " -n 4 --backend cpu", "printf 'hello\\n' | ");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("rendering needs more than " + std::to_string(jinja::kMaxRenderSteps) + " steps"),
            std::string::npos)
      << r.out;
}

// ---- silent wrong results -----------------------------------------------------------------------

TEST(HostileInput, StdoutWriteErrorsAreErrors) {
  expect_error(minfer("run -p 'In the beginning' -n 2 --backend cpu > /dev/full"),
               "writing to standard output failed: No space left on device");
  expect_error(minfer("inspect " + default_model() + " > /dev/full"), "writing to standard output failed");
  expect_error(minfer("tokenize -p hello > /dev/full"), "writing to standard output failed");
}

// One validation routine for the sampling parameters (sampling/sampler.h); the CLI spells them by
// flag. run and chat share the rules.
TEST(HostileInput, SamplingOptionsAreValidated) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--temp nan", "--temp nan is out of range: temperature must be in [0, 2]"},
      {"--temp 3", "--temp 3 is out of range: temperature must be in [0, 2]"},
      {"--top-p 2", "--top-p 2 is out of range: top_p must be in (0, 1]"},
      {"--min-p -1", "--min-p -1 is out of range: min_p must be in [0, 1]"},
      {"--repeat-penalty -1", "--repeat-penalty -1 is out of range: repeat_penalty must be a finite number > 0"},
      {"--repeat-penalty 0", "--repeat-penalty 0 is out of range"},
      {"--repeat-penalty nan", "--repeat-penalty nan is out of range"},
      {"--frequency-penalty inf", "--frequency-penalty inf is out of range: frequency_penalty must be in [-2, 2]"},
      {"--frequency-penalty -inf", "--frequency-penalty -inf is out of range"},
      {"--presence-penalty 2.5", "--presence-penalty 2.5 is out of range: presence_penalty must be in [-2, 2]"},
      {"--top-k -1", "--top-k -1 is out of range: top_k must be >= 0"},
      {"--repeat-last-n -2", "--repeat-last-n -2 is out of range: repeat_last_n must be >= -1"},
      {"--seed -1", "--seed -1 is out of range: seed must be an integer in [0, 18446744073709551615]"},
      {"--seed 18446744073709551616", "--seed 18446744073709551616 is out of range"},
  };
  for (const auto& [args, expected] : cases) {
    expect_error(minfer("run -p hi -n 1 " + args), expected);
    expect_error(minfer("chat -n 1 " + args + " < /dev/null"), expected);
  }
  // The ends of the ranges are accepted.
  const Result ok = minfer("run -p hi -n 1 --backend cpu --temp 0 --top-p 1 --min-p 0 --top-k 0 "
                           "--frequency-penalty -2 --presence-penalty 2 --seed 18446744073709551615");
  EXPECT_EQ(ok.rc, 0) << ok.out;
}

TEST(HostileInput, CountsAndThreadsAreValidated) {
  for (const char* cmd : {"run -p hi", "chat", "perplexity -f /dev/null", "quantize a b q8_0"}) {
    for (const char* threads : {"-3", "10000"}) {
      const Result r = minfer(std::string(cmd) + " -t " + threads + " < /dev/null");
      EXPECT_NE(r.rc, 0) << r.out;
      EXPECT_NE(r.out.find("--threads: Value " + std::string(threads) + " not in range 0 to"), std::string::npos)
          << cmd << ": " << r.out;
      EXPECT_LT(r.out.size(), 200u) << r.out;
    }
  }
  for (const char* cmd : {"run -p hi -n -1", "chat -n -1"}) {
    const Result r = minfer(std::string(cmd) + " < /dev/null");
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("--n-predict: Value -1 not in range 0 to 2147483647"), std::string::npos) << r.out;
  }
  expect_error(minfer("bench -p -5"), "-p \"-5\": token counts must be integers in [0, 1073741824]");
  expect_error(minfer("bench -p abc"), "-p \"abc\": token counts must be integers");
  expect_error(minfer("bench -n 99999999999"), "-n \"99999999999\": token counts must be integers");
  expect_error(minfer("bench -d 100000 --backend cpu"), "more than this model's context length");
}

// A model whose hyperparameters would produce NaN logits is refused at load, by the CLI too.
TEST(HostileInput, NanEpsilonModelIsRefusedNotRun) {
  const std::string arch = gguf::File::open(default_model()).get_string("general.architecture");
  const std::string path = default_model_with(test::temp_dir("hostile-nan"), arch + ".attention.layer_norm_rms_epsilon",
                                              gguf::Value::from_f32(std::numeric_limits<float>::quiet_NaN()));
  expect_error(minfer("run -m " + path + " -p hi -n 2"), "attention.layer_norm_rms_epsilon = nan is out of range");
  expect_error(minfer("perplexity -m " + path + " -f " + (test::source_dir() / "README.md").string()),
               "attention.layer_norm_rms_epsilon = nan is out of range");
}

// A context the model allows but the machine cannot hold: the KV cache is sized before anything is
// allocated and refused with the numbers (needed, available) and the flag to change.
TEST(HostileInput, AContextThatCannotFitIsRefusedWithTheNumbers) {
  const std::string arch = gguf::File::open(default_model()).get_string("general.architecture");
  const std::string path = default_model_with(test::temp_dir("hostile-ctx"), arch + ".context_length",
                                              gguf::Value::from_u32(1u << 30));
  const Result r = minfer("run -m " + path + " -c 1073741824 -p hi -n 2 --backend cpu");
  expect_error(r, "lower -c (context size 1073741824)");
  EXPECT_NE(r.out.find(" need "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" of memory are available"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace minfer
