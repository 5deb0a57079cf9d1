// GGUF reader/writer: round trips, byte-exact layout against a hand-encoded file, one test per
// malformed-file rule, and `minfer inspect` on the shared vocabularies.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "gguf/gguf.h"
#include "support.h"
#include "util/error.h"

namespace minfer::gguf {
namespace {

using Bytes = std::vector<uint8_t>;

// Little-endian GGUF encoder written independently of the library's writer.
struct Builder {
  Bytes b;
  Builder& u8(uint8_t v) { b.push_back(v); return *this; }
  Builder& u32(uint32_t v) { for (int k = 0; k < 4; ++k) b.push_back(uint8_t(v >> (8 * k))); return *this; }
  Builder& u64(uint64_t v) { for (int k = 0; k < 8; ++k) b.push_back(uint8_t(v >> (8 * k))); return *this; }
  Builder& str(const std::string& s) { u64(s.size()); b.insert(b.end(), s.begin(), s.end()); return *this; }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Builder& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  Builder& tensor(const std::string& name, std::vector<uint64_t> shape, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(shape.size()));
    for (uint64_t d : shape) u64(d);
    return u32(type).u64(offset);
  }
  Builder& pad(size_t align = 32) { while (b.size() % align) b.push_back(0); return *this; }
  Builder& zeros(size_t n) { b.resize(b.size() + n, 0); return *this; }
};

File parse(const Bytes& bytes) { return File::parse(std::make_shared<const Bytes>(bytes), "bad.gguf"); }

// Parsing must fail with a minfer::Error whose message contains every fragment.
void expect_rejected(const Bytes& bytes, std::initializer_list<std::string> fragments) {
  try {
    parse(bytes);
    ADD_FAILURE() << "parse accepted the file; expected an error mentioning " << *fragments.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

Bytes random_bytes(size_t n, uint64_t salt) {
  std::mt19937_64 rng(test::seed() + salt);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

Value scalar(ValueType t, uint64_t u, int64_t i) {
  Value v;
  v.type = t;
  v.u = u;
  v.i = i;
  return v;
}

TEST(Gguf, RoundTripEveryValueTypeAndTensors) {
  const auto path = test::temp_dir("gguf") / "all.gguf";
  const std::string odd_string("nul\0inside \xe2\x9c\x93 \"quoted\"\n", 25);
  std::vector<std::pair<std::string, Value>> kv = {
      {"t.u8", scalar(ValueType::UINT8, 255, 0)},
      {"t.i8", scalar(ValueType::INT8, 0, -128)},
      {"t.u16", scalar(ValueType::UINT16, 65535, 0)},
      {"t.i16", scalar(ValueType::INT16, 0, -32768)},
      {"t.u32", Value::from_u32(4000000000u)},
      {"t.i32", Value::from_i32(-2000000000)},
      {"t.u64", Value::from_u64(18446744073709551615ull)},
      {"t.i64", Value::from_i64(std::numeric_limits<int64_t>::min())},
      {"t.f32", Value::from_f32(0.1f)},
      {"t.f64", Value::from_f64(0.1)},
      {"t.bool", Value::from_bool(true)},
      {"t.string", Value::from_string(odd_string)},
      {"t.empty_string", Value::from_string("")},
      {"t.strings", Value::from_strings({"a", "", odd_string, "token"})},
      {"t.i32s", Value::from_i32s({1, -2, 2147483647})},
      {"t.f32s", Value::from_f32s({1.5f, -0.25f})},
      {"t.empty_array", Value::from_array(ValueType::UINT8, {})},
      {"t.u64s", Value::from_array(ValueType::UINT64, {Value::from_u64(1), Value::from_u64(1ull << 63)})},
      {"t.nested", Value::from_array(ValueType::ARRAY, {Value::from_i32s({1, 2}), Value::from_i32s({}),
                                                        Value::from_array(ValueType::STRING, {Value::from_string("x")})})},
  };
  struct T { std::string name; GgmlType type; std::vector<int64_t> shape; uint64_t nbytes; };
  // Byte sizes from the GGUF block layouts: f32 4 B/elem, f16 2, q8_0 34 B/32, q4_K 144 B/256, q6_K 210 B/256.
  const std::vector<T> tensors = {
      {"a.f32", GgmlType::F32, {5, 3}, 5 * 3 * 4},
      {"b.f16", GgmlType::F16, {7}, 14},
      {"c.q8_0", GgmlType::Q8_0, {64, 2, 3}, 2 * 2 * 3 * 34},
      {"d.q4_K", GgmlType::Q4_K, {256, 1, 1, 2}, 2 * 144},
      {"e.q6_K", GgmlType::Q6_K, {512}, 2 * 210},
  };
  std::vector<Bytes> data;
  uint64_t expected_size = 0;
  {
    Writer w(path.string());
    for (const auto& [k, v] : kv) w.set(k, v);
    for (const auto& t : tensors) w.add_tensor(t.name, t.type, t.shape);
    expected_size = w.total_bytes();
    w.begin_data();
    for (size_t k = 0; k < tensors.size(); ++k) {
      data.push_back(random_bytes(tensors[k].nbytes, k));
      w.write_tensor_data(tensors[k].name, data.back().data(), data.back().size());
    }
    w.finish();
  }
  EXPECT_EQ(std::filesystem::file_size(path), expected_size);

  const File f = File::open(path.string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), kv.size());
  for (size_t k = 0; k < kv.size(); ++k) EXPECT_EQ(f.metadata()[k].first, kv[k].first);  // order kept
  EXPECT_EQ(f.get("t.u8").u, 255u);
  EXPECT_EQ(f.get("t.i8").i, -128);
  EXPECT_EQ(f.get_int("t.u16"), 65535);
  EXPECT_EQ(f.get_int("t.i16"), -32768);
  EXPECT_EQ(f.get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("t.i32"), -2000000000ll);
  EXPECT_EQ(f.get("t.u64").u, 18446744073709551615ull);
  EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get("t.f32").type, ValueType::FLOAT32);
  EXPECT_EQ(f.get_float("t.f32"), double(0.1f));
  EXPECT_EQ(f.get_float("t.f64"), 0.1);
  EXPECT_TRUE(f.get("t.bool").as_bool());
  EXPECT_EQ(f.get_int("t.bool"), 1);
  EXPECT_EQ(f.get_string("t.string"), odd_string);
  EXPECT_EQ(f.get_string("t.empty_string"), "");
  EXPECT_EQ(f.get("t.strings").as_strings(), (std::vector<std::string>{"a", "", odd_string, "token"}));
  EXPECT_EQ(f.get("t.i32s").as_ints(), (std::vector<int64_t>{1, -2, 2147483647}));
  EXPECT_EQ(f.get("t.f32s").as_floats(), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(f.get("t.empty_array").array_type, ValueType::UINT8);
  EXPECT_TRUE(f.get("t.empty_array").array.empty());
  EXPECT_EQ(f.get("t.u64s").array.at(1).u, 1ull << 63);
  const Value& nested = f.get("t.nested");
  ASSERT_EQ(nested.array_type, ValueType::ARRAY);
  ASSERT_EQ(nested.array.size(), 3u);
  EXPECT_EQ(nested.array[0].as_ints(), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(nested.array[1].array.empty());
  EXPECT_EQ(nested.array[2].as_strings(), std::vector<std::string>{"x"});

  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorInfo* t = f.find_tensor(tensors[k].name);
    ASSERT_NE(t, nullptr) << tensors[k].name;
    EXPECT_EQ(t->type, tensors[k].type);
    EXPECT_EQ(t->shape, tensors[k].shape);
    EXPECT_EQ(t->nbytes, tensors[k].nbytes);
    EXPECT_EQ(t->offset % 32, 0u);
    EXPECT_EQ(uintptr_t(t->data - f.data_begin()), t->offset);
    EXPECT_EQ(0, std::memcmp(t->data, data[k].data(), data[k].size())) << tensors[k].name;
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data_begin()) % 32, 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
}

TEST(Gguf, WriterOutputMatchesHandEncodedBytes) {
  const auto path = test::temp_dir("gguf") / "tiny.gguf";
  const Bytes weights = random_bytes(34, 7);  // one q8_0 block
  {
    Writer w(path.string());
    w.set("n", Value::from_u32(7));
    w.add_tensor("w", GgmlType::Q8_0, {32});
    w.begin_data();
    w.write_tensor_data("w", weights.data(), weights.size());
    w.finish();
  }
  Builder expected;
  expected.header(1, 1).kv_u32("n", 7).tensor("w", {32}, 8, 0).pad();
  expected.b.insert(expected.b.end(), weights.begin(), weights.end());
  expected.pad();
  EXPECT_EQ(read_file(path), expected.b);
}

TEST(Gguf, CustomAlignmentRoundTrips) {
  const auto path = test::temp_dir("gguf") / "align.gguf";
  const Bytes a = random_bytes(4, 1), b = random_bytes(8, 2);
  {
    Writer w(path.string(), 256);
    w.add_tensor("a", GgmlType::F32, {1});
    w.add_tensor("b", GgmlType::F16, {4});
    w.begin_data();
    w.write_tensor_data("a", a.data(), a.size());
    w.write_tensor_data("b", b.data(), b.size());
    w.finish();
  }
  const File f = File::open(path.string());
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.get_int("general.alignment"), 256);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data_begin()) % 256, 0u);  // the mapping is page-aligned
  EXPECT_EQ(f.find_tensor("b")->offset, 256u);
  EXPECT_EQ(0, std::memcmp(f.find_tensor("b")->data, b.data(), b.size()));
}

TEST(Gguf, ReadsVersion2AndMetadataOnlyFilesWithoutPadding) {
  Builder v2;
  v2.header(0, 1, 2).kv_u32("k", 5);  // no padding after the metadata
  const File f = parse(v2.b);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_int("k"), 5);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, AccessorsRejectKindMismatches) {
  Builder b;
  b.header(0, 2).kv_u32("n", 3).str("s").u32(8).str("text");
  const File f = parse(b.b);
  EXPECT_NE(error_of([&] { f.get_int("s"); }).find("bad.gguf: metadata key s: expected an integer, found a value of type string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.get_string("n"); }).find("expected a string, found a value of type uint32"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get("absent"); }).find("bad.gguf: missing metadata key absent"), std::string::npos);
  EXPECT_EQ(f.get_int("absent", 42), 42);
  EXPECT_EQ(f.get_float("n"), 3.0);  // ints widen to float
  EXPECT_NE(error_of([&] { f.get("n").as_bool(); }).find("expected a bool"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get("n").as_strings(); }).find("expected an array of strings"), std::string::npos);
  EXPECT_NE(error_of([] { Value::from_u64(1ull << 63).as_int(); }).find("does not fit in int64"), std::string::npos);
  EXPECT_NE(error_of([] { Value::from_strings({"a"}).as_ints(); }).find("found an array of string"), std::string::npos);
}

// ---- malformed files: one rule each --------------------------------------------------------------

TEST(GgufMalformed, BadMagic) {
  Builder b;
  b.header(0, 0);
  b.b[0] = 'X';
  expect_rejected(b.b, {"not a GGUF file", "\"XGUF\""});
}

TEST(GgufMalformed, UnsupportedVersions) {
  expect_rejected(Builder().header(0, 0, 1).b, {"version 1 is not supported"});
  expect_rejected(Builder().header(0, 0, 4).b, {"unsupported GGUF version 4"});
}

TEST(GgufMalformed, TruncatedHeaderAtEveryLength) {
  Builder b;
  b.header(1, 1).kv_u32("key", 1).tensor("t", {4}, 0, 0).pad().zeros(16);
  for (size_t n = 0; n < b.b.size(); ++n) {
    Bytes cut(b.b.begin(), b.b.begin() + n);
    EXPECT_THROW(parse(cut), Error) << "prefix of " << n << " bytes";
  }
  expect_rejected(Bytes(b.b.begin(), b.b.begin() + 6), {"truncated", "header (version)", "offset 4", "only 2 remain"});
  EXPECT_NO_THROW(parse(b.b));
}

TEST(GgufMalformed, StringLengthPastEndOfFile) {
  Builder b;
  b.header(0, 1).str("key").u32(8).u64(1000).zeros(10);
  expect_rejected(b.b, {"metadata key \"key\"", "string length 1000", "10 bytes remain"});
}

TEST(GgufMalformed, UnknownMetadataValueType) {
  Builder b;
  b.header(0, 1).str("key").u32(13).u32(0);
  expect_rejected(b.b, {"metadata key \"key\"", "unknown metadata value type 13"});
}

TEST(GgufMalformed, ArrayCountLargerThanFile) {
  Builder b;
  b.header(0, 1).str("arr").u32(9).u32(6).u64(1ull << 60).zeros(64);
  expect_rejected(b.b, {"metadata key \"arr\"", "array of 1152921504606846976 float32", "64 bytes"});
}

TEST(GgufMalformed, CountsLargerThanFile) {
  expect_rejected(Builder().header(0, 1ull << 40).zeros(100).b, {"1099511627776 metadata entries"});
  expect_rejected(Builder().header(1ull << 40, 0).zeros(100).b, {"1099511627776 tensors"});
}

TEST(GgufMalformed, ArraysNestedTooDeep) {
  Builder b;
  b.header(0, 1).str("deep").u32(9);
  for (int k = 0; k < 20; ++k) b.u32(9).u64(1);
  b.u32(0).u64(0);
  expect_rejected(b.b, {"metadata key \"deep\"", "nested deeper than 8"});
}

TEST(GgufMalformed, UnknownTensorType) {
  Builder b;
  b.header(1, 0).tensor("w", {32}, 4, 0).pad().zeros(64);  // 4 was q4_2, removed from GGUF
  expect_rejected(b.b, {"tensor \"w\"", "unknown tensor type id 4"});
}

TEST(GgufMalformed, BadDimensions) {
  expect_rejected(Builder().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(64).b,
                  {"tensor \"w\"", "n_dims is 5"});
  expect_rejected(Builder().header(1, 0).tensor("w", {}, 0, 0).u64(0).pad().zeros(64).b, {"tensor \"w\"", "n_dims is 0"});
  expect_rejected(Builder().header(1, 0).tensor("w", {4, 0}, 0, 0).pad().zeros(64).b,
                  {"tensor \"w\"", "dimension 1 is 0"});
}

TEST(GgufMalformed, ElementCountOverflow) {
  Builder b;
  b.header(1, 0).tensor("big", {1ull << 32, 1ull << 32}, 0, 0).pad().zeros(64);
  expect_rejected(b.b, {"tensor \"big\"", "element count overflows", "dimension 1"});
}

TEST(GgufMalformed, RowLengthNotMultipleOfBlockSize) {
  Builder b;
  b.header(1, 0).tensor("q", {33, 2}, 2, 0).pad().zeros(128);
  expect_rejected(b.b, {"tensor \"q\"", "row length 33", "q4_0 block size 32"});
}

TEST(GgufMalformed, TensorDataOutOfBounds) {
  Builder b;
  b.header(1, 0).tensor("w", {16}, 0, 32).pad().zeros(64);  // needs [32, 96) of 64 bytes
  expect_rejected(b.b, {"tensor \"w\"", "offset 32 with 64 bytes", "past the end"});
  Builder huge;
  huge.header(1, 0).tensor("w", {16}, 0, ~uint64_t(31)).pad().zeros(64);  // offset + size wraps
  expect_rejected(huge.b, {"tensor \"w\"", "past the end"});
}

TEST(GgufMalformed, TensorOffsetNotAligned) {
  Builder b;
  b.header(1, 0).tensor("w", {4}, 0, 8).pad().zeros(64);
  expect_rejected(b.b, {"tensor \"w\"", "offset 8 is not a multiple of the alignment 32"});
}

TEST(GgufMalformed, OverlappingTensorData) {
  Builder b;
  b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(128);  // a is [0, 64)
  expect_rejected(b.b, {"tensor \"b\" data [32, 64) overlaps tensor \"a\" data [0, 64)"});
}

TEST(GgufMalformed, DuplicateTensorNames) {
  Builder b;
  b.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64);
  expect_rejected(b.b, {"duplicate tensor \"w\"", "tensor info 1"});
}

TEST(GgufMalformed, DuplicateMetadataKeys) {
  Builder b;
  b.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
  expect_rejected(b.b, {"duplicate metadata key \"k\"", "entry 1"});
}

TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
  expect_rejected(Builder().header(0, 1).kv_u32("general.alignment", 48).b, {"general.alignment is 48", "power of two"});
  expect_rejected(Builder().header(0, 1).kv_u32("general.alignment", 0).b, {"general.alignment is 0"});
  expect_rejected(Builder().header(0, 1).str("general.alignment").u32(8).str("32").b, {"general.alignment has type string"});
}

TEST(GgufMalformed, UnreadableFile) {
  const std::string missing = (test::temp_dir("gguf") / "absent.gguf").string();
  EXPECT_NE(error_of([&] { File::open(missing); }).find(missing + ": cannot open"), std::string::npos);
  const auto empty = test::temp_dir("gguf") / "empty.gguf";
  std::ofstream(empty).close();
  EXPECT_NE(error_of([&] { File::open(empty.string()); }).find("truncated"), std::string::npos);
}

// ---- writer misuse ----------------------------------------------------------------------------------

TEST(GgufWriter, RejectsMisuse) {
  const auto dir = test::temp_dir("gguf");
  const std::string path = (dir / "w.gguf").string();
  const Bytes four(4), eight(8);
  {
    Writer w(path);
    EXPECT_NE(error_of([&] { w.add_tensor("q", GgmlType::Q4_0, {48}); }).find("row length 48 is not a multiple of the q4_0 block size 32"),
              std::string::npos);
    EXPECT_NE(error_of([&] { w.add_tensor("z", GgmlType::F32, {0}); }).find("dimension 0 is 0"), std::string::npos);
    w.add_tensor("a", GgmlType::F32, {1});
    w.add_tensor("b", GgmlType::F32, {2});
    EXPECT_NE(error_of([&] { w.add_tensor("a", GgmlType::F32, {1}); }).find("duplicate tensor name"), std::string::npos);
    Value bad = scalar(ValueType::UINT8, 300, 0);
    w.set("bad", bad);
    EXPECT_NE(error_of([&] { w.begin_data(); }).find("value 300 does not fit"), std::string::npos);
    w.set("bad", Value::from_u32(300));  // replacing the key fixes it
    w.begin_data();
    EXPECT_NE(error_of([&] { w.set("late", Value::from_u32(1)); }).find("after begin_data()"), std::string::npos);
    EXPECT_NE(error_of([&] { w.write_tensor_data("b", eight.data(), 8); }).find("expected \"a\" (tensor 0 of 2), got \"b\""),
              std::string::npos);
    EXPECT_NE(error_of([&] { w.write_tensor_data("a", eight.data(), 8); }).find("got 8 bytes of data, its f32 shape needs 4"),
              std::string::npos);
    w.write_tensor_data("a", four.data(), 4);
    EXPECT_NE(error_of([&] { w.finish(); }).find("finish() after 1 of 2 tensors; next expected \"b\""), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "an unfinished file must not be left behind";
  EXPECT_NE(error_of([&] { Writer(path, 48); }).find("alignment 48"), std::string::npos);
  EXPECT_NE(error_of([] { Value::from_array(ValueType::INT32, {Value::from_u32(1)}); }).find("element 0 has type uint32"),
            std::string::npos);
}

// ---- minfer inspect ---------------------------------------------------------------------------------

TEST(GgufInspect, PrintsTensorTableAndTotals) {
  const auto path = test::temp_dir("gguf") / "model.gguf";
  {
    Writer w(path.string());
    w.set("general.architecture", Value::from_string("llama"));
    std::vector<std::string> tokens;
    for (int k = 0; k < 1000; ++k) tokens.push_back("tok" + std::to_string(k));
    w.set("tokenizer.ggml.tokens", Value::from_strings(tokens));
    w.add_tensor("x.weight", GgmlType::Q8_0, {64, 3});
    w.add_tensor("y.weight", GgmlType::Q8_0, {32});
    w.add_tensor("z.bias", GgmlType::F32, {10});
    w.begin_data();
    const Bytes x(6 * 34), y(34), z(40);
    w.write_tensor_data("x.weight", x.data(), x.size());
    w.write_tensor_data("y.weight", y.data(), y.size());
    w.write_tensor_data("z.bias", z.data(), z.size());
    w.finish();
  }
  std::string out;
  ASSERT_EQ(test::run_command(test::minfer_binary() + " inspect " + path.string(), &out), 0) << out;
  EXPECT_NE(out.find("[1000 strings: \"tok0\", \"tok1\", \"tok2\", ...]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"llama\""), std::string::npos) << out;
  EXPECT_NE(out.find("[64, 3]"), std::string::npos) << out;
  EXPECT_NE(out.find("q8_0          2 tensors             238 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("total: 3 tensors, 234 parameters, 278 bytes"), std::string::npos) << out;

  std::filesystem::resize_file(path, 100);
  ASSERT_EQ(test::run_command(test::minfer_binary() + " inspect " + path.string(), &out), 1) << out;
  EXPECT_NE(out.find("error: " + path.string()), std::string::npos) << out;
}

TEST(GgufInspect, EverySharedVocabulary) {
  const auto dir = test::shared_dir() / "vocab";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no shared vocab dir at " << dir;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".gguf") continue;
    ++files;
    std::string out;
    EXPECT_EQ(test::run_command(test::minfer_binary() + " inspect " + entry.path().string(), &out), 0)
        << entry.path() << "\n" << out;
    EXPECT_NE(out.find("tokenizer.ggml.tokens"), std::string::npos) << entry.path();
    EXPECT_NE(out.find(" strings: "), std::string::npos) << entry.path();
  }
  EXPECT_GT(files, 0);
}

}  // namespace
}  // namespace minfer::gguf
