#include "convert/quantize.h"

#include "convert/tensor_stream.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/files.h"

namespace minfer::convert {

namespace {
bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
bool is_quantized_ftype(synth::FileType ft) {
  return ft != synth::FileType::F32 && ft != synth::FileType::F16 && ft != synth::FileType::BF16;
}
}  // namespace

uint64_t quantize_file(const QuantizeOptions& opts) {
  refuse_to_overwrite_inputs(opts.out_path, {opts.in_path});
  const gguf::File in = gguf::File::open(opts.in_path);
  const std::string arch = in.get_string("general.architecture");
  const int n_layer = int(in.get_int(arch + ".block_count"));
  const bool has_output = in.find_tensor("output.weight") != nullptr;

  Metadata md;
  for (const auto& [k, v] : in.metadata())
    if (k != "general.alignment") md.emplace_back(k, v);
  set_meta(md, "general.file_type", gguf::Value::from_u32(uint32_t(synth::file_type_gguf_id(opts.ftype))));
  if (is_quantized_ftype(opts.ftype)) set_meta(md, "general.quantization_version", gguf::Value::from_u32(2));

  std::vector<OutTensor> out;
  for (const auto& t : in.tensors()) {
    if (!is_float_type(t.type))
      fail(opts.in_path, ": tensor ", t.name, " is already ", type_traits(t.type).name,
           "; quantize needs an f32, f16 or bf16 model (re-quantizing loses precision twice)");
    const GgmlType type = t.shape.size() < 2 ? GgmlType::F32
                                             : synth::tensor_type_for(opts.ftype, t.name, t.shape[0], n_layer, has_output);
    const size_t in_row_bytes = row_bytes(t.type, t.shape[0]);
    const int64_t row_len = t.shape[0];
    const GgmlType in_type = t.type;
    const uint8_t* data = t.data;
    out.push_back({t.name, type, t.shape, [=](int64_t r0, int64_t n, float* dst) {
                     for (int64_t r = 0; r < n; ++r)
                       dequantize_row(in_type, data + size_t(r0 + r) * in_row_bytes, dst + r * row_len, row_len);
                   }});
  }
  return write_gguf(opts.out_path, md, out, {opts.n_threads, opts.progress});
}

}  // namespace minfer::convert
