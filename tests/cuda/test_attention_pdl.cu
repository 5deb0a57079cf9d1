// Decode kernels that work before their PDL wait, against kernels that make such work visible.
// The decode attention launched with PDL behind the kernel that writes each token's q and its own
// K/V row (in a decode step, the q/k/v launch): with AttnParams::early_reads the split kernel reads
// the position, the block table and the older K/V rows before its PDL wait. Here the writer lets
// the attention launch at once and writes only after a spin, so a read of q or of the own row made
// ahead of the wait would see the stale bytes the buffers start with. And a decode matmul's later
// weight type launched beside its first (MatVecExtra::types_side_by_side), whose successor must
// still find the first type's rows complete after its wait. And a kernel that releases early
// (KernelStream::release_early), whose successor's wait must still cover its predecessor.
// Each test first checks that its PDL launch did overlap its predecessor (else it could not fail),
// which compute-sanitizer's serialized launches never let happen: their suite, GpuPdl, lies outside
// the sanitizer runs' filter in scripts/gpu-check (GpuKernels.*); the kernels themselves are in
// GpuKernels' tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "prefill_test_data.h"
#include "quant/quant.h"
#include "gpu_support.h"
#include "../support.h"
#include "util/half.h"

namespace minfer {
namespace {

using test::DeviceBuffer;

struct LateCopies {
  static constexpr int kMax = 8;
  const uint8_t* src[kMax];
  uint8_t* dst[kMax];
  int bytes[kMax];
  int n = 0;
};

// One CTA: lets the next kernel of the stream launch, spins `ns` nanoseconds by the global timer,
// then makes the copies (and, with `end`, stamps the global timer there once they are done).
__global__ void copy_late(const LateCopies copies, unsigned long long ns, unsigned long long* end) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  while (now - start < ns);
  for (int i = 0; i < copies.n; ++i)
    for (int b = threadIdx.x; b < copies.bytes[i]; b += blockDim.x) copies.dst[i][b] = copies.src[i][b];
  if (end) {  // uniform over the block
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      *end = now;
    }
  }
}

// What a read ahead of the PDL wait sees: word's value before the wait, stored after it.
__global__ void read_before_wait(const uint32_t* word, uint32_t* seen) {
  const uint32_t x = *reinterpret_cast<const volatile uint32_t*>(word);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  *seen = x;
}

constexpr unsigned long long kWriterSpinNs = 200'000;  // far longer than a PDL launch takes to start

// 7B shapes: a token at depth (16 slices), one whose last slice starts inside a block iteration's
// reach of its own row, and one of a single position (nothing older to read early).
TEST(GpuPdl, DecodeAttentionReadsQAndTheOwnRowAfterThePdlWait) {
  MINFER_REQUIRE_GPU();
  const int hd = 128, n_head = 28, n_kv = 4, splits = 66, block_size = 64;
  const std::vector<int> lens = {1000, 70, 1};
  const int kvw = n_kv * hd, n_tokens = int(lens.size());
  std::vector<int32_t> tables, offsets, positions;
  int n_blocks = 0;
  for (int len : lens) n_blocks += (len + block_size - 1) / block_size;
  std::vector<int32_t> order(static_cast<size_t>(n_blocks));
  for (int b = 0; b < n_blocks; ++b) order[size_t(b)] = b;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(test::seed() + 7));
  std::vector<size_t> own_slots;
  for (int len : lens) {
    offsets.push_back(int32_t(tables.size()));
    positions.push_back(len - 1);
    const size_t first = tables.size();
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) tables.push_back(order[tables.size()]);
    own_slots.push_back(size_t(tables[first + size_t((len - 1) / block_size)]) * block_size + size_t((len - 1) % block_size));
  }
  const size_t pool = size_t(n_blocks) * block_size * kvw, q_floats = size_t(n_tokens) * n_head * hd;
  const auto halves = [](const std::vector<float>& f) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_f16(f[i]);
    return h;
  };
  const auto q = test::random_normal(q_floats, 1.0f, 200), stale_q = test::random_normal(q_floats, 1.0f, 201);
  const auto k = halves(test::random_normal(pool, 1.0f, 202)), v = halves(test::random_normal(pool, 1.0f, 203));
  auto stale_k = k, stale_v = v;  // the own rows hold other values until the writer runs
  const auto noise_k = halves(test::random_normal(pool, 1.0f, 204)), noise_v = halves(test::random_normal(pool, 1.0f, 205));
  for (const size_t slot : own_slots)
    for (size_t i = slot * kvw; i < (slot + 1) * kvw; ++i) stale_k[i] = noise_k[i], stale_v[i] = noise_v[i];

  DeviceBuffer<float> dq(q_floats), fresh_q(q);
  DeviceBuffer<uint16_t> dk(pool), dv(pool), fresh_k(k), fresh_v(v);
  DeviceBuffer<int32_t> dpos(positions), dtables(tables), doffsets(offsets);
  DeviceBuffer<float> part(static_cast<size_t>(cuda::attention_workspace_floats(n_tokens, n_head, hd, splits)));
  DeviceBuffer<float> out(q_floats);
  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // DeviceBuffer's copies do not order themselves with `stream`: each ends in a device-wide sync.
  const auto upload = [&](const std::vector<float>& q_, const std::vector<uint16_t>& k_, const std::vector<uint16_t>& v_) {
    dq.upload(q_);
    dk.upload(k_);
    dv.upload(v_);
    test::cuda_ok(cudaDeviceSynchronize());
  };
  const auto reset = [&] { upload(stale_q, stale_k, stale_v); };
  LateCopies writes;
  const auto add = [&](const void* src, void* dst, size_t bytes) {
    ASSERT_LT(writes.n, LateCopies::kMax);
    writes.src[writes.n] = static_cast<const uint8_t*>(src);
    writes.dst[writes.n] = static_cast<uint8_t*>(dst);
    writes.bytes[writes.n++] = int(bytes);
  };
  add(fresh_q.get(), dq.get(), q_floats * sizeof(float));
  for (const size_t slot : own_slots) {
    add(fresh_k.get() + slot * kvw, dk.get() + slot * kvw, kvw * sizeof(uint16_t));
    add(fresh_v.get() + slot * kvw, dv.get() + slot * kvw, kvw * sizeof(uint16_t));
  }
  const auto attend = [&](bool early_reads, bool behind_writer) {
    cuda::AttnParams p;
    p.q = dq.get();
    p.out = out.get();
    p.kv = {dk.get(), dv.get(), n_kv, hd};
    p.n_head = n_head;
    p.n_tokens = n_tokens;
    p.positions = dpos.get();
    p.tables = dtables.get();
    p.table_offsets = doffsets.get();
    p.block_size = block_size;
    p.n_splits = splits;
    p.part = part.get();
    p.sm_count = 132;
    p.early_reads = early_reads;
    if (behind_writer)
      cuda::launch_kernel("copy_late", copy_late, dim3(1), dim3(256), 0, cuda::KernelStream(stream), writes,
                          kWriterSpinNs, static_cast<unsigned long long*>(nullptr));
    cuda::launch_attention(p, cuda::KernelStream(stream, true));
    test::cuda_ok(cudaStreamSynchronize(stream));
    return out.download();
  };

  // the rows in place before the launch: the result every launch below must give
  upload(q, k, v);
  const auto expected = attend(false, false);
  // the setup can catch a read made too early: a PDL launch behind the writer reads stale q. The
  // driver may start a PDL launch late (one try in 20 did on an H200), so it gets a few tries.
  {
    uint32_t stale_word;
    std::memcpy(&stale_word, stale_q.data(), 4);
    bool caught = false;
    for (int attempt = 0; attempt < 8 && !caught; ++attempt) {
      reset();
      DeviceBuffer<uint32_t> seen(1);
      cuda::launch_kernel("copy_late", copy_late, dim3(1), dim3(256), 0, cuda::KernelStream(stream), writes,
                          kWriterSpinNs, static_cast<unsigned long long*>(nullptr));
      cuda::launch_kernel("read_before_wait", read_before_wait, dim3(1), dim3(1), 0, cuda::KernelStream(stream, true),
                          reinterpret_cast<const uint32_t*>(dq.get()), seen.get());
      test::cuda_ok(cudaStreamSynchronize(stream));
      caught = seen.download()[0] == stale_word;
    }
    ASSERT_TRUE(caught) << "in 8 tries the PDL launch never started while the writer spun";
  }
  for (int attempt = 0; attempt < 4; ++attempt)  // each try catches a too-early read only if it launched early
    for (const bool early_reads : {false, true}) {
      reset();
      const auto got = attend(early_reads, true);
      ASSERT_EQ(std::memcmp(got.data(), expected.data(), expected.size() * 4), 0) << "early reads " << early_reads;
    }
  test::cuda_ok(cudaStreamDestroy(stream));
}

// n floats from src to dst, before or after the kernel's PDL wait (with `start`, block 0 stamps the
// global timer there first).
template <bool kAfterWait>
__global__ void copy_around_wait(const float* src, float* dst, int n, unsigned long long* start) {
  if (start && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    *start = now;
  }
  if constexpr (kAfterWait) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x)) dst[i] = src[i];
  if constexpr (!kAfterWait) asm volatile("griddepcontrol.wait;" ::: "memory");
}

// A q6_K segment of 256 rows and a q4_K one of 512 (65,536 columns: launches of tens of
// microseconds) in one decode matmul at one token, a launch a type: with types_side_by_side the q6_K
// launch (the fewest row tiles) comes first and the q4_K one (the one-tile weight ring) runs beside
// it, waiting for it only before its CTAs exit, so a kernel launched with PDL after the matmul
// still copies the q6_K rows complete after its wait, and both segments keep the bits of the
// launches one after the other. The setup check: a copy made ahead of its wait behind the q6_K
// launch alone sees rows not yet written.
TEST(GpuPdl, DecodeMatmulTypesSideBySideKeepTheNextKernelsWait) {
  MINFER_REQUIRE_GPU();
  const int cols = 65536;
  const int rows[2] = {256, 512};
  const GgmlType types[2] = {GgmlType::Q6_K, GgmlType::Q4_K};
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> w;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> out;
  cuda::MatSeg segs[2];
  for (int i = 0; i < 2; ++i) {
    w.push_back(std::make_unique<DeviceBuffer<uint8_t>>(
        test::weights_image(types[i], cols, test::random_weight_rows(types[i], rows[i], cols, 300 + uint64_t(i)))));
    out.push_back(std::make_unique<DeviceBuffer<float>>(size_t(rows[i])));
    segs[i].w = {types[i], rows[i], cols, w.back()->get()};
    segs[i].out = out.back()->get();
    segs[i].ld_out = rows[i];
  }
  std::vector<BlockQ8Pad40> act(size_t(cols / 32));
  quantize_row_pad40_grouped(test::random_normal(size_t(cols), 1.0f, 310).data(), act.data(), cols);
  DeviceBuffer<uint8_t> plane_bytes(size_t(cuda::q8_plane_bytes(1, cols)));
  {
    std::vector<uint8_t> host(size_t(cuda::q8_plane_bytes(1, cols)));
    const cuda::Q8Plane h = cuda::q8_plane(host.data(), 1, cols);
    for (int b = 0; b < cols / 32; ++b) {
      std::memcpy(h.block_quants(0, b), act[size_t(b)].qs, 32);
      h.set_sum(0, b, act[size_t(b)].sum);
      if (b % 8 == 0) *h.scale(0, b / 8) = act[size_t(b)].d;
    }
    plane_bytes.upload(host);
  }
  const cuda::Q8Plane plane = cuda::q8_plane(plane_bytes.get(), 1, cols);
  cuda::MatVecExtra one_after_other, side_by_side;
  one_after_other.sm_count = side_by_side.sm_count = cuda::DeviceContext(0).sm_count;
  one_after_other.launch_per_type = side_by_side.launch_per_type = true;
  side_by_side.types_side_by_side = true;
  ASSERT_GT(cuda::matmul_mma_weight_ring_ctas_per_sm(&segs[1], 1, 1, side_by_side), 0) << "the q4_K launch takes the ring";

  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto poison = [&] {
    for (int i = 0; i < 2; ++i) out[size_t(i)]->upload(std::vector<float>(size_t(rows[i]), NAN));
    test::cuda_ok(cudaDeviceSynchronize());
  };
  poison();
  cuda::launch_matmul_mma(segs, 2, plane, 1, one_after_other, cuda::KernelStream(stream));
  test::cuda_ok(cudaStreamSynchronize(stream));
  const auto want_first = out[0]->download(), want_beside = out[1]->download();
  DeviceBuffer<float> copied{static_cast<size_t>(rows[0])};
  const auto has_nan = [](const std::vector<float>& v) { return std::any_of(v.begin(), v.end(), [](float x) { return std::isnan(x); }); };
  {
    bool caught = false;
    for (int attempt = 0; attempt < 8 && !caught; ++attempt) {
      poison();
      cuda::launch_matmul_mma(segs, 1, plane, 1, one_after_other, cuda::KernelStream(stream));
      cuda::launch_kernel("copy_before_wait", copy_around_wait<false>, dim3(64), dim3(256), 0,
                          cuda::KernelStream(stream, true), static_cast<const float*>(out[0]->get()), copied.get(), rows[0],
                          static_cast<unsigned long long*>(nullptr));
      test::cuda_ok(cudaStreamSynchronize(stream));
      caught = has_nan(copied.download());
    }
    ASSERT_TRUE(caught) << "in 8 tries no copy ahead of the wait saw the q6_K rows unwritten";
  }
  for (int attempt = 0; attempt < 8; ++attempt) {
    poison();
    cuda::launch_matmul_mma(segs, 2, plane, 1, side_by_side, cuda::KernelStream(stream, true));
    cuda::launch_kernel("copy_after_wait", copy_around_wait<true>, dim3(64), dim3(256), 0, cuda::KernelStream(stream, true),
                        static_cast<const float*>(out[0]->get()), copied.get(), rows[0],
                        static_cast<unsigned long long*>(nullptr));
    test::cuda_ok(cudaStreamSynchronize(stream));
    const auto got_copy = copied.download(), got_first = out[0]->download(), got_beside = out[1]->download();
    ASSERT_EQ(std::memcmp(got_copy.data(), want_first.data(), want_first.size() * 4), 0) << "attempt " << attempt;
    ASSERT_EQ(std::memcmp(got_first.data(), want_first.data(), want_first.size() * 4), 0) << "attempt " << attempt;
    ASSERT_EQ(std::memcmp(got_beside.data(), want_beside.data(), want_beside.size() * 4), 0) << "attempt " << attempt;
  }
  test::cuda_ok(cudaStreamDestroy(stream));
}

// The row rms_norm behind a writer that lets it launch at once and writes its input only after a
// spin, and a PDL kernel behind the norm. With release_early that kernel starts before the writer
// has ended (the norm let it launch at its own start; without release_early it starts only after:
// the check that the flag does what it says), and after its wait it still copies the norm's
// output complete: the bits of the norm launched plainly.
TEST(GpuPdl, RmsNormReleasingEarlyKeepsTheNextKernelsWaitBehindItsPredecessor) {
  MINFER_REQUIRE_GPU();
  const int width = 5120;
  const auto x = test::random_normal(size_t(width), 1.0f, 320), w = test::random_normal(size_t(width), 1.0f, 321);
  DeviceBuffer<float> fresh_x(x), dw(w), dx{size_t(width)}, dy{size_t(width)}, copied{size_t(width)};
  DeviceBuffer<unsigned long long> stamps{size_t(2)};
  dx.upload(x);
  cuda::launch_rms_norm(dx.get(), width, dw.get(), dy.get(), width, 1, width, 0, 1e-6f, {}, 0, cuda::KernelStream());
  test::cuda_ok(cudaDeviceSynchronize());
  const auto want = dy.download();
  LateCopies write_x;
  write_x.src[0] = reinterpret_cast<const uint8_t*>(fresh_x.get());
  write_x.dst[0] = reinterpret_cast<uint8_t*>(dx.get());
  write_x.bytes[0] = width * int(sizeof(float));
  write_x.n = 1;
  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Writer, norm and copier; the writer's end and the copier's start by the global timer.
  const auto run = [&](bool early) {
    dx.upload(std::vector<float>(size_t(width), NAN));
    dy.upload(std::vector<float>(size_t(width), NAN));
    copied.upload(std::vector<float>(size_t(width), NAN));
    test::cuda_ok(cudaDeviceSynchronize());
    cuda::KernelStream pdl(stream, true);
    pdl.release_early = early;
    cuda::launch_kernel("copy_late", copy_late, dim3(1), dim3(256), 0, cuda::KernelStream(stream), write_x,
                        kWriterSpinNs, stamps.get());
    cuda::launch_rms_norm(dx.get(), width, dw.get(), dy.get(), width, 1, width, 0, 1e-6f, {}, 0, pdl);
    cuda::launch_kernel("copy_after_wait", copy_around_wait<true>, dim3(20), dim3(256), 0,
                        cuda::KernelStream(stream, true), static_cast<const float*>(dy.get()), copied.get(), width,
                        stamps.get() + 1);
    test::cuda_ok(cudaStreamSynchronize(stream));
    return stamps.download();
  };
  run(true);  // the kernels' first launches load their code (the first early start came 106 us late)
  for (const bool early : {true, false})
    for (int attempt = 0; attempt < 4; ++attempt) {
      const auto t = run(early);
      const std::string arm = std::string(early ? "early" : "after the wait") + ", attempt " + std::to_string(attempt);
      // The writer spins 200 us: an early start leads its end by most of that.
      if (early) EXPECT_LT(t[1] + kWriterSpinNs / 2, t[0]) << arm << ": the kernel behind the norm started late";
      else EXPECT_GE(t[1], t[0]) << arm << ": the kernel behind the norm started before the writer ended";
      const auto got = copied.download();
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << arm;
    }
  test::cuda_ok(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace minfer
