// The decode attention launched with PDL behind the kernel that writes each token's q and its own
// K/V row (in a decode step, the q/k/v launch): with AttnParams::early_reads the split kernel reads
// the position, the block table and the older K/V rows before its PDL wait. Here the writer lets
// the attention launch at once and writes only after a spin, so a read of q or of the own row made
// ahead of the wait would see the stale bytes the buffers start with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
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
// then makes the copies.
__global__ void copy_late(const LateCopies copies, unsigned long long ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  while (now - start < ns);
  for (int i = 0; i < copies.n; ++i)
    for (int b = threadIdx.x; b < copies.bytes[i]; b += blockDim.x) copies.dst[i][b] = copies.src[i][b];
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
TEST(GpuKernels, DecodeAttentionReadsQAndTheOwnRowAfterThePdlWait) {
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
                          kWriterSpinNs);
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
                          kWriterSpinNs);
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

}  // namespace
}  // namespace minfer
