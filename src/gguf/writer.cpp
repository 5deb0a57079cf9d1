#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <utility>

#include "gguf/format.h"
#include "gguf/gguf.h"
#include "util/error.h"
#include "util/files.h"

namespace minfer::gguf {

namespace {

class Encoder {
 public:
  explicit Encoder(const std::string& file) : file_(file) {}

  template <typename T>
  void put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }

  void put_value(const Value& v, const std::string& key) {
    switch (v.type) {
      case ValueType::UINT8: put(narrow<uint8_t>(v.u, key)); break;
      case ValueType::UINT16: put(narrow<uint16_t>(v.u, key)); break;
      case ValueType::UINT32: put(narrow<uint32_t>(v.u, key)); break;
      case ValueType::UINT64: put<uint64_t>(v.u); break;
      case ValueType::INT8: put(narrow<int8_t>(v.i, key)); break;
      case ValueType::INT16: put(narrow<int16_t>(v.i, key)); break;
      case ValueType::INT32: put(narrow<int32_t>(v.i, key)); break;
      case ValueType::INT64: put<int64_t>(v.i); break;
      case ValueType::FLOAT32: put(float(v.f)); break;
      case ValueType::FLOAT64: put<double>(v.f); break;
      case ValueType::BOOL: put<uint8_t>(v.b ? 1 : 0); break;
      case ValueType::STRING: put_string(v.s); break;
      case ValueType::ARRAY:
        put<uint32_t>(uint32_t(v.array_type));
        put<uint64_t>(v.array.size());
        for (size_t k = 0; k < v.array.size(); ++k) {
          if (v.array[k].type != v.array_type)
            fail(file_, ": metadata key ", key, ": array element ", k, " has type ",
                 value_type_name(v.array[k].type), " but the array holds ", value_type_name(v.array_type));
          put_value(v.array[k], key);
        }
        break;
      default: fail(file_, ": metadata key ", key, ": unknown value type ", uint32_t(v.type));
    }
  }

  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  template <typename T, typename Wide>
  T narrow(Wide v, const std::string& key) {
    if (v < Wide(std::numeric_limits<T>::min()) || v > Wide(std::numeric_limits<T>::max()))
      fail(file_, ": metadata key ", key, ": value ", v, " does not fit in its type (",
           +std::numeric_limits<T>::min(), "..", +std::numeric_limits<T>::max(), ")");
    return T(v);
  }

  const std::string& file_;
  std::vector<uint8_t> bytes_;
};

}  // namespace

struct Writer::Impl {
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    uint64_t offset = 0;  // assigned by layout()
  };
  enum class State { kDeclaring, kWritingData, kFinished };

  std::string path;
  uint64_t alignment = format::kDefaultAlignment;
  std::vector<std::pair<std::string, Value>> kv;
  std::vector<Tensor> tensors;
  std::set<std::string, std::less<>> tensor_names;
  State state = State::kDeclaring;
  std::unique_ptr<OutputFile> out;  // from begin_data() until finish()
  size_t next_tensor = 0;

  uint64_t padded(uint64_t n) const {
    uint64_t r;
    if (!format::align_up(n, alignment, &r)) fail(path, ": size ", n, " overflows when aligned to ", alignment);
    return r;
  }

  // Header, metadata and tensor infos; assigns the tensors' data offsets.
  std::vector<uint8_t> layout() {
    uint64_t offset = 0;
    for (Tensor& t : tensors) {
      t.offset = offset;
      offset = padded(offset + t.nbytes);
    }
    Encoder e(path);
    for (char c : format::kMagic) e.put<char>(c);
    e.put<uint32_t>(format::kVersion);
    e.put<uint64_t>(tensors.size());
    e.put<uint64_t>(kv.size());
    for (const auto& [key, value] : kv) {
      e.put_string(key);
      e.put<uint32_t>(uint32_t(value.type));
      e.put_value(value, key);
    }
    for (const Tensor& t : tensors) {
      e.put_string(t.name);
      e.put<uint32_t>(uint32_t(t.shape.size()));
      for (int64_t d : t.shape) e.put<uint64_t>(uint64_t(d));
      e.put<uint32_t>(uint32_t(t.type));
      e.put<uint64_t>(t.offset);
    }
    e.bytes().resize(padded(e.bytes().size()), 0);
    return std::move(e.bytes());
  }

  uint64_t data_bytes() const {
    uint64_t total = 0;
    for (const Tensor& t : tensors) total = padded(total + t.nbytes);
    return total;
  }

  void pad_to_alignment(uint64_t n) {
    static constexpr uint8_t zeros[64] = {};
    for (uint64_t left = padded(n) - n; left > 0;) {
      const uint64_t chunk = std::min<uint64_t>(left, sizeof zeros);
      out->write(zeros, chunk);
      left -= chunk;
    }
  }

  void require_state(State s, const char* action) const {
    if (state == s) return;
    static constexpr const char* kStateNames[] = {"while declaring metadata and tensors",
                                                  "after begin_data()", "after finish()"};
    fail(path, ": cannot ", action, " ", kStateNames[int(state)]);
  }
};

namespace {
// GGUF stores general.alignment as uint32.
bool valid_alignment(uint64_t a) { return a != 0 && (a & (a - 1)) == 0 && a <= std::numeric_limits<uint32_t>::max(); }
}  // namespace

Writer::Writer(std::string path, uint64_t alignment) : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  if (!valid_alignment(alignment))
    fail(impl_->path, ": alignment ", alignment, " must be a non-zero power of two that fits in 32 bits");
  if (alignment != format::kDefaultAlignment) set(std::string(format::kAlignmentKey), Value::from_u32(uint32_t(alignment)));
}

// An unfinished file is never renamed over the target: ~OutputFile removes it.
Writer::~Writer() = default;

void Writer::set(const std::string& key, Value v) {
  impl_->require_state(Impl::State::kDeclaring, str_cat("set metadata key ", key).c_str());
  if (key == format::kAlignmentKey) {
    const uint64_t a = format::is_unsigned(v.type) ? v.u : format::is_signed(v.type) && v.i > 0 ? uint64_t(v.i) : 0;
    if (!valid_alignment(a))
      fail(impl_->path, ": ", key, " must be a non-zero power of two integer that fits in 32 bits");
    impl_->alignment = a;
  }
  for (auto& [k, existing] : impl_->kv) {
    if (k == key) {
      existing = std::move(v);
      return;
    }
  }
  impl_->kv.emplace_back(key, std::move(v));
}

void Writer::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> shape) {
  Impl& m = *impl_;
  m.require_state(Impl::State::kDeclaring, str_cat("add tensor ", quoted(name)).c_str());
  const std::string what = str_cat(m.path, ": tensor ", quoted(name));
  if (m.tensor_names.count(name)) fail(what, ": duplicate tensor name");
  if (!is_known_type(uint32_t(type))) fail(what, ": unknown tensor type id ", uint32_t(type));
  if (shape.empty() || shape.size() > format::kMaxDims)
    fail(what, ": n_dims is ", shape.size(), "; it must be 1..", format::kMaxDims);
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) fail(what, ": dimension ", d, " is ", shape[d], "; it must be positive");
    if (__builtin_mul_overflow(n, shape[d], &n)) fail(what, ": element count overflows int64");
  }
  const TypeTraits tt = type_traits(type);
  if (shape[0] % tt.block_size != 0)
    fail(what, ": row length ", shape[0], " is not a multiple of the ", tt.name, " block size ", tt.block_size);
  uint64_t nbytes;
  if (__builtin_mul_overflow(uint64_t(n / tt.block_size), uint64_t(tt.type_size), &nbytes))
    fail(what, ": byte size overflows 64 bits");
  m.tensor_names.insert(name);
  m.tensors.push_back({name, type, std::move(shape), nbytes});
}

uint64_t Writer::total_bytes() const { return impl_->layout().size() + impl_->data_bytes(); }

void Writer::begin_data() {
  Impl& m = *impl_;
  m.require_state(Impl::State::kDeclaring, "begin_data()");
  const std::vector<uint8_t> head = m.layout();
  m.out = std::make_unique<OutputFile>(m.path);
  m.state = Impl::State::kWritingData;
  m.out->write(head.data(), head.size());
}

void Writer::write_tensor_data(const std::string& name, const void* data, uint64_t nbytes) {
  Impl& m = *impl_;
  m.require_state(Impl::State::kWritingData, str_cat("write data of tensor ", quoted(name)).c_str());
  if (m.next_tensor == m.tensors.size())
    fail(m.path, ": data for tensor ", quoted(name), " but all ", m.tensors.size(), " tensors were already written");
  const Impl::Tensor& t = m.tensors[m.next_tensor];
  if (name != t.name)
    fail(m.path, ": tensor data out of order: expected ", quoted(t.name), " (tensor ", m.next_tensor, " of ",
         m.tensors.size(), "), got ", quoted(name));
  if (nbytes != t.nbytes)
    fail(m.path, ": tensor ", quoted(name), ": got ", nbytes, " bytes of data, its ", type_traits(t.type).name,
         " shape needs ", t.nbytes);
  m.out->write(data, nbytes);
  m.pad_to_alignment(nbytes);
  ++m.next_tensor;
}

void Writer::finish() {
  Impl& m = *impl_;
  if (m.state == Impl::State::kDeclaring) begin_data();  // metadata-only files need no data calls
  m.require_state(Impl::State::kWritingData, "finish()");
  if (m.next_tensor != m.tensors.size())
    fail(m.path, ": finish() after ", m.next_tensor, " of ", m.tensors.size(), " tensors; next expected ",
         quoted(m.tensors[m.next_tensor].name));
  m.out->commit();
  m.out.reset();
  m.state = Impl::State::kFinished;
}

}  // namespace minfer::gguf
