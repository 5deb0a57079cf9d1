#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "gguf/format.h"
#include "gguf/gguf.h"
#include "util/error.h"
#include "util/mmap.h"

namespace minfer::gguf {

namespace {

// Bounds-checked little-endian cursor over the untrusted bytes. Every read checks what is left
// first, so no count or length from the file is trusted before it is compared with the file size.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& file) : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      fail(file_, ": truncated file: ", what, " needs ", n, " bytes at offset ", pos_, " but only ",
           remaining(), " remain (file size ", size_, ")");
  }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(file_, ": ", what, ": string length ", len, " at offset ", pos_ - 8, " runs past the end of the file (",
           remaining(), " bytes remain, file size ", size_, ")");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

class Parser {
 public:
  Parser(const uint8_t* base, uint64_t size, const std::string& file) : cur_(base, size, file), file_(file) {}

  ValueType read_value_type(const std::string& what) {
    const uint32_t id = cur_.read<uint32_t>(what);
    if (!format::is_value_type(id))
      fail(file_, ": ", what, ": unknown metadata value type ", id, " at offset ", cur_.pos() - 4,
           " (known types are 0..", uint32_t(ValueType::FLOAT64), ")");
    return ValueType(id);
  }

  Value read_value(ValueType type, const std::string& what, int depth) {
    Value v;
    v.type = type;
    switch (type) {
      case ValueType::UINT8: v.u = cur_.read<uint8_t>(what); break;
      case ValueType::UINT16: v.u = cur_.read<uint16_t>(what); break;
      case ValueType::UINT32: v.u = cur_.read<uint32_t>(what); break;
      case ValueType::UINT64: v.u = cur_.read<uint64_t>(what); break;
      case ValueType::INT8: v.i = cur_.read<int8_t>(what); break;
      case ValueType::INT16: v.i = cur_.read<int16_t>(what); break;
      case ValueType::INT32: v.i = cur_.read<int32_t>(what); break;
      case ValueType::INT64: v.i = cur_.read<int64_t>(what); break;
      case ValueType::FLOAT32: v.f = cur_.read<float>(what); break;
      case ValueType::FLOAT64: v.f = cur_.read<double>(what); break;
      case ValueType::BOOL: v.b = cur_.read<uint8_t>(what) != 0; break;
      case ValueType::STRING: v.s = cur_.read_string(what); break;
      case ValueType::ARRAY: read_array(v, what, depth); break;
    }
    return v;
  }

  void read_array(Value& v, const std::string& what, int depth) {
    if (depth >= format::kMaxArrayDepth)
      fail(file_, ": ", what, ": arrays nested deeper than ", format::kMaxArrayDepth, " levels at offset ", cur_.pos());
    v.array_type = read_value_type(what + " (array element type)");
    const uint64_t count = cur_.read<uint64_t>(what + " (array length)");
    const uint64_t min_size = format::min_encoded_size(v.array_type);
    if (count > cur_.remaining() / min_size)
      fail(file_, ": ", what, ": array of ", count, " ", value_type_name(v.array_type), " values at offset ",
           cur_.pos() - 8, " cannot fit in the ", cur_.remaining(), " bytes that remain");
    v.array.reserve(size_t(count));
    for (uint64_t k = 0; k < count; ++k) v.array.push_back(read_value(v.array_type, what, depth + 1));
  }

  Cursor& cursor() { return cur_; }

 private:
  Cursor cur_;
  const std::string& file_;
};

uint64_t alignment_from(const Value& v, const std::string& file) {
  uint64_t a;
  if (format::is_unsigned(v.type)) {
    a = v.u;
  } else if (format::is_signed(v.type) && v.i > 0) {
    a = uint64_t(v.i);
  } else if (format::is_signed(v.type)) {
    fail(file, ": ", format::kAlignmentKey, " is ", v.i, "; it must be a non-zero power of two");
  } else {
    fail(file, ": ", format::kAlignmentKey, " has type ", value_type_name(v.type), "; it must be an integer");
  }
  if (a == 0 || (a & (a - 1)) != 0)
    fail(file, ": ", format::kAlignmentKey, " is ", a, "; it must be a non-zero power of two");
  return a;
}

}  // namespace

File File::open(const std::string& path) {
  Mapping m = map_file(path);
  File f;
  f.path_ = path;
  f.storage_ = std::move(m.keep_alive);
  f.base_ = m.data;
  f.size_ = m.size;
  f.load();
  return f;
}

File File::parse(std::shared_ptr<const std::vector<uint8_t>> bytes, const std::string& name) {
  File f;
  f.path_ = name;
  f.base_ = bytes->data();
  f.size_ = bytes->size();
  f.storage_ = std::move(bytes);
  f.load();
  return f;
}

void File::load() {
  Parser p(base_, size_, path_);
  Cursor& cur = p.cursor();

  cur.need(4, "header (magic)");
  if (std::memcmp(base_, format::kMagic, 4) != 0)
    fail(path_, ": not a GGUF file: magic bytes are ", quoted(std::string_view(reinterpret_cast<const char*>(base_), 4)),
         ", expected \"GGUF\"");
  cur.read<uint32_t>("header (magic)");
  version_ = cur.read<uint32_t>("header (version)");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1) fail(path_, ": GGUF version 1 is not supported (only versions 2 and 3)");
    if (version_ == 0x03000000u || version_ == 0x02000000u)
      fail(path_, ": big-endian GGUF files are not supported (version field reads ", version_, ")");
    fail(path_, ": unsupported GGUF version ", version_, " (only versions 2 and 3)");
  }
  const uint64_t n_tensors = cur.read<uint64_t>("header (tensor count)");
  const uint64_t n_kv = cur.read<uint64_t>("header (metadata count)");
  // Smallest possible entries: key length + type + 1-byte value; name length + 1 dim + type + offset.
  constexpr uint64_t kMinKvBytes = 8 + 4 + 1, kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
  if (n_kv > cur.remaining() / kMinKvBytes)
    fail(path_, ": header claims ", n_kv, " metadata entries but only ", cur.remaining(),
         " bytes follow (each entry needs at least ", kMinKvBytes, ")");
  if (n_tensors > cur.remaining() / kMinTensorInfoBytes)
    fail(path_, ": header claims ", n_tensors, " tensors but only ", cur.remaining(),
         " bytes follow (each tensor info needs at least ", kMinTensorInfoBytes, ")");

  kv_.reserve(size_t(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = cur.read_string(str_cat("metadata entry ", k, " (key)"));
    const std::string what = str_cat("metadata key ", quoted(key));
    if (kv_index_.count(key)) fail(path_, ": duplicate ", what, " (entry ", k, ")");
    const ValueType type = p.read_value_type(what);
    Value v = p.read_value(type, what, 0);
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const Value* a = find(format::kAlignmentKey)) alignment_ = alignment_from(*a, path_);
  else alignment_ = format::kDefaultAlignment;

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    t.name = cur.read_string(str_cat("tensor info ", k, " (name)"));
    const std::string what = str_cat("tensor ", quoted(t.name));
    if (tensor_index_.count(t.name)) fail(path_, ": duplicate ", what, " (tensor info ", k, ")");
    const uint32_t n_dims = cur.read<uint32_t>(what + " (n_dims)");
    if (n_dims == 0 || n_dims > format::kMaxDims)
      fail(path_, ": ", what, ": n_dims is ", n_dims, "; it must be 1..", format::kMaxDims);
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = cur.read<uint64_t>(what + " (shape)");
      if (dim == 0 || dim > uint64_t(std::numeric_limits<int64_t>::max()))
        fail(path_, ": ", what, ": dimension ", d, " is ", dim, "; it must be 1..2^63-1");
      if (__builtin_mul_overflow(n_elements, int64_t(dim), &n_elements))
        fail(path_, ": ", what, ": element count overflows int64 at dimension ", d, " (", dim, ")");
      t.shape.push_back(int64_t(dim));
    }
    const uint32_t type_id = cur.read<uint32_t>(what + " (type)");
    if (!is_known_type(type_id)) fail(path_, ": ", what, ": unknown tensor type id ", type_id);
    t.type = GgmlType(type_id);
    const TypeTraits tt = type_traits(t.type);
    if (t.shape[0] % tt.block_size != 0)
      fail(path_, ": ", what, ": row length ", t.shape[0], " is not a multiple of the ", tt.name, " block size ",
           tt.block_size);
    const uint64_t blocks = uint64_t(n_elements / tt.block_size);
    if (__builtin_mul_overflow(blocks, uint64_t(tt.type_size), &t.nbytes))
      fail(path_, ": ", what, ": byte size of ", n_elements, " ", tt.name, " elements overflows 64 bits");
    t.offset = cur.read<uint64_t>(what + " (offset)");
    if (t.offset % alignment_ != 0)
      fail(path_, ": ", what, ": data offset ", t.offset, " is not a multiple of the alignment ", alignment_);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  const bool aligned = format::align_up(cur.pos(), alignment_, &data_offset_);
  if (tensors_.empty()) {
    // Files without tensors (vocabularies) may end right after the metadata, unpadded.
    if (!aligned || data_offset_ > size_) data_offset_ = size_;
    return;
  }
  if (!aligned || data_offset_ > size_)
    fail(path_, ": data section would start at offset ", cur.pos(), " rounded up to alignment ", alignment_,
         ", past the end of the file (size ", size_, ")");
  const uint64_t data_size = size_ - data_offset_;
  for (TensorInfo& t : tensors_) {
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.nbytes, &end) || end > data_size)
      fail(path_, ": tensor ", quoted(t.name), ": data at offset ", t.offset, " with ", t.nbytes,
           " bytes runs past the end of the data section (", data_size, " bytes starting at file offset ",
           data_offset_, ")");
    t.data = base_ + data_offset_ + t.offset;
  }
  std::vector<size_t> by_offset(tensors_.size());
  std::iota(by_offset.begin(), by_offset.end(), size_t(0));
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = tensors_[by_offset[k - 1]];
    const TensorInfo& next = tensors_[by_offset[k]];
    if (next.offset < prev.offset + prev.nbytes)
      fail(path_, ": tensor ", quoted(next.name), " data [", next.offset, ", ", next.offset + next.nbytes,
           ") overlaps tensor ", quoted(prev.name), " data [", prev.offset, ", ", prev.offset + prev.nbytes, ")");
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const Value& File::get(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  fail(path_, ": missing metadata key ", key);
}

namespace {
// Optional lookup with a default, converting with `convert`; conversion errors name file and key.
template <typename T, typename Convert>
T lookup(const File& f, std::string_view key, const std::optional<T>& def, Convert convert) {
  const Value* v = f.find(key);
  if (!v) {
    if (def) return *def;
    return convert(f.get(key));  // get() throws the "missing key" error
  }
  try {
    return convert(*v);
  } catch (const Error& e) {
    fail(f.path(), ": metadata key ", key, ": ", e.what());
  }
}
}  // namespace

int64_t File::get_int(std::string_view key, std::optional<int64_t> def) const {
  return lookup(*this, key, def, [](const Value& v) { return v.as_int(); });
}
double File::get_float(std::string_view key, std::optional<double> def) const {
  return lookup(*this, key, def, [](const Value& v) { return v.as_float(); });
}
std::string File::get_string(std::string_view key, std::optional<std::string> def) const {
  return lookup(*this, key, def, [](const Value& v) { return v.as_string(); });
}

}  // namespace minfer::gguf
