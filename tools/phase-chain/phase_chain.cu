// Does a persistent decode kernel whose producer streams the weights ahead across its phase
// barriers beat a chain of PDL launches? A synthetic of the 14B's decode step (docs/13 §2 and §4,
// perf.md, sixty-seventh session): its 337 phases (48 x norm, q/k/v, attention, o, norm, gate/up,
// down; then the head) with Qwen2.5-14B Q4_K_M's weight bytes, no arithmetic of minfer's own.
// Each weight phase's bytes are dealt over the CTAs in 16 KB chunks, bulk-copied into a
// shared-memory ring (L2 evict-first) and "consumed" by `work` x 4 dp4a a 16-byte word a thread;
// phase p's consumption starts only when every CTA has finished phase p-1 (the data dependency of
// a decode step; the weights themselves depend on nothing).
//   chain:      one launch a phase (3 CTAs an SM, 8 consumer warps and a copying warp, 4 stages),
//               with PDL: the first stages copied before griddepcontrol.wait, launch_dependents
//               right after it, as minfer's weight rings do; the weightless phases are launches of
//               their own; the whole step one CUDA graph.
//   persistent: one launch, a CTA an SM, 13 stages; one lane copies the SM's chunks of every phase
//               in order, stopped only by a full ring; the consumer warps (16 or 8) wait on a
//               device-wide counter before each phase (barriers=0: no counters, the bytes alone).
// The barriers, copies and L2 policy are the backend's own (prefill_mma.cuh).
// Build (from the repository root): nvcc -O3 -std=c++20 --expt-relaxed-constexpr -I src
//        -gencode arch=compute_90a,code=sm_90a -o phase_chain tools/phase-chain/phase_chain.cu
// Usage: phase_chain [layers=48]; prints ms a step (median of 7), µs a layer, GB/s and t/s for each
// work level, with and without the copies.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "backend/cuda/prefill_mma.cuh"

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

constexpr int kChunk = 16384;
constexpr int kMaxPhases = 48 * 7 + 1;

struct Phase {
  const uint8_t* w;
  int64_t bytes;  // 0: a dependency-only phase
};
struct Step {
  Phase phases[kMaxPhases];
  int n;
};

__device__ __forceinline__ int64_t n_chunks(int64_t bytes) { return (bytes + kChunk - 1) / kChunk; }
__device__ __forceinline__ uint32_t chunk_bytes(int64_t bytes, int64_t c) {
  return uint32_t(std::min<int64_t>(kChunk, bytes - c * kChunk));
}

using minfer::cuda::prefill_detail::bulk_copy_to_shared;
using minfer::cuda::prefill_detail::l2_policy_evict_first;
using minfer::cuda::prefill_detail::lds128;
using minfer::cuda::prefill_detail::mbarrier_arrive;
using minfer::cuda::prefill_detail::mbarrier_expect_tx;
using minfer::cuda::prefill_detail::mbarrier_init;
using minfer::cuda::prefill_detail::mbarrier_wait;
using minfer::cuda::prefill_detail::shared_address;

// Stage `stage` of a ring takes chunk c of a phase's bytes at w (copies: a bulk copy counted on the
// stage's full barrier; otherwise the barrier completes on the arrival alone and the stage keeps its
// stale bytes).
__device__ __forceinline__ void fill_stage(uint8_t* smem, uint64_t* full, int stage, const uint8_t* w, int64_t bytes,
                                           int64_t c, bool copies, uint64_t policy) {
  const uint32_t bar = shared_address(&full[stage]);
  const uint32_t b = chunk_bytes(bytes, c);
  if (copies) mbarrier_expect_tx(bar, b);
  mbarrier_arrive(bar);
  if (copies) bulk_copy_to_shared(shared_address(smem + stage * kChunk), w + c * kChunk, b, bar, policy);
}

// The consumer's work on one chunk: thread t of n reads its 16-byte words and multiplies each
// W times (4 independent dp4a chains).
__device__ __forceinline__ void consume(uint32_t base, uint32_t bytes, int t, int n, int work, int (&acc)[4]) {
  for (uint32_t o = uint32_t(t) * 16; o < bytes; o += uint32_t(n) * 16) {
    const uint4 v = lds128(base + o);
    for (int i = 0; i < work; ++i) {
      acc[0] = __dp4a(int(v.x), acc[3] | 1, acc[0]);
      acc[1] = __dp4a(int(v.y), acc[0] | 1, acc[1]);
      acc[2] = __dp4a(int(v.z), acc[1] | 1, acc[2]);
      acc[3] = __dp4a(int(v.w), acc[2] | 1, acc[3]);
    }
  }
}

// ---- persistent: one launch ----
constexpr int kPersistentStages = 13;
// REQUIRES: one CTA an SM (13 stages of 16 KB), counters zeroed, blockDim.x == 32 × (kConsumerWarps
// + 1). The producer warp leaves early: the consumers' named barrier 1 counts only them.
template <int kConsumerWarps>
__global__ void __launch_bounds__(32 * (kConsumerWarps + 1), 1)
    persistent_kernel(const Step* step, unsigned* counters, int work, int barriers, int copies, int* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kPersistentStages], empty[kPersistentStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kPersistentStages; ++s)
      mbarrier_init(shared_address(&full[s]), 1), mbarrier_init(shared_address(&empty[s]), kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int n = step->n;
  if (warp == kConsumerWarps) {  // the producer
    if (lane != 0) return;
    const uint64_t pol = l2_policy_evict_first();
    int64_t k = 0;
    for (int p = 0; p < n; ++p) {
      const Phase ph = step->phases[p];
      for (int64_t c = blockIdx.x; c < n_chunks(ph.bytes); c += G, ++k) {
        const int s = int(k % kPersistentStages);
        if (k >= kPersistentStages) mbarrier_wait(shared_address(&empty[s]), uint32_t((k / kPersistentStages - 1) & 1));
        fill_stage(smem, full, s, ph.w, ph.bytes, c, copies, pol);
      }
    }
    return;
  }
  int acc[4] = {warp, lane, 1, 2};
  const int t = threadIdx.x, nt = 32 * kConsumerWarps;
  int64_t k = 0;
  for (int p = 0; p < n; ++p) {
    if (barriers && p > 0) {
      if (t == 0) {
        unsigned v;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counters + p - 1) : "memory");
        while (v < unsigned(G));
      }
      asm volatile("bar.sync 1, %0;" ::"r"(nt) : "memory");
    }
    const Phase ph = step->phases[p];
    for (int64_t c = blockIdx.x; c < n_chunks(ph.bytes); c += G, ++k) {
      const int s = int(k % kPersistentStages);
      mbarrier_wait(shared_address(&full[s]), uint32_t((k / kPersistentStages) & 1));
      consume(shared_address(smem + s * kChunk), chunk_bytes(ph.bytes, c), t, nt, work, acc);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(shared_address(&empty[s]));
    }
    if (barriers) {
      asm volatile("bar.sync 1, %0;" ::"r"(nt) : "memory");
      if (t == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counters + p) : "memory");
    }
  }
  if (acc[0] + acc[1] + acc[2] + acc[3] == 0x7fffffff) sink[t] = 1;
}

// ---- chain: one launch a phase ----
constexpr int kChainStages = 4, kChainWarps = 8, kChainCtasPerSm = 3;
// REQUIRES: blockDim.x == 32 × (kChainWarps + 1); the copying warp leaves early, as above.
__global__ void __launch_bounds__(32 * (kChainWarps + 1), kChainCtasPerSm)
    launch_chain_kernel(const uint8_t* w, int64_t bytes, int work, int copies, int* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kChainStages], empty[kChainStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = gridDim.x;
  const int64_t mine = bytes > 0 ? (n_chunks(bytes) - blockIdx.x + G - 1) / G : 0;
  const uint64_t pol = l2_policy_evict_first();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kChainStages; ++s)
      mbarrier_init(shared_address(&full[s]), 1), mbarrier_init(shared_address(&empty[s]), kChainWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int64_t k = 0; k < std::min<int64_t>(mine, kChainStages); ++k)  // before the wait: weights only
      fill_stage(smem, full, int(k), w, bytes, blockIdx.x + k * G, copies, pol);
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (warp == kChainWarps) {
    if (lane != 0) return;
    for (int64_t k = kChainStages; k < mine; ++k) {
      const int s = int(k % kChainStages);
      mbarrier_wait(shared_address(&empty[s]), uint32_t((k / kChainStages - 1) & 1));
      fill_stage(smem, full, s, w, bytes, blockIdx.x + k * G, copies, pol);
    }
    return;
  }
  int acc[4] = {warp, lane, 1, 2};
  const int t = threadIdx.x, nt = 32 * kChainWarps;
  for (int64_t k = 0; k < mine; ++k) {
    const int s = int(k % kChainStages);
    mbarrier_wait(shared_address(&full[s]), uint32_t((k / kChainStages) & 1));
    consume(shared_address(smem + s * kChunk), chunk_bytes(bytes, blockIdx.x + k * G), t, nt, work, acc);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(shared_address(&empty[s]));
  }
  asm volatile("bar.sync 1, %0;" ::"r"(nt) : "memory");  // the phase's result, as a join would
  if (acc[0] + acc[1] + acc[2] + acc[3] == 0x7fffffff) sink[t] = 1;
}

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 48;
  if (layers < 1 || 7 * layers + 1 > kMaxPhases) {
    std::fprintf(stderr, "phase_chain: layers must be 1..%d\n", (kMaxPhases - 1) / 7);
    return 1;
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  // The 14B's phases a layer (Qwen2.5-14B Q4_K_M: q/k/v q4_K 7,168 x 5,120; o q4_K 5,120 x 5,120;
  // gate/up q4_K 2 x 13,824 x 5,120; down q4_K and q6_K in turn 5,120 x 13,824), then the q6_K head.
  const int64_t row_q4 = 20 * 144, down_q4 = 5120LL * 54 * 144, down_q6 = 5120LL * 54 * 210;
  std::vector<int64_t> sizes;
  for (int l = 0; l < layers; ++l) {
    sizes.push_back(0);                     // rms_norm
    sizes.push_back(7168 * row_q4);         // q/k/v
    sizes.push_back(0);                     // attention
    sizes.push_back(5120 * row_q4);         // o
    sizes.push_back(0);                     // rms_norm
    sizes.push_back(2 * 13824 * row_q4);    // gate/up
    sizes.push_back(l % 2 ? down_q6 : down_q4);
  }
  sizes.push_back(152064LL * 20 * 210);  // head
  int64_t total = 0;
  for (int64_t s : sizes) total += (s + 255) / 256 * 256;
  uint8_t* w = nullptr;
  CK(cudaMalloc(&w, total));
  CK(cudaMemset(w, 1, total));
  Step h{};
  h.n = int(sizes.size());
  int64_t off = 0;
  for (int i = 0; i < h.n; ++i) h.phases[i] = {w + off, sizes[i]}, off += (sizes[i] + 255) / 256 * 256;
  Step* d_step;
  unsigned* counters;
  int* sink;
  CK(cudaMalloc(&d_step, sizeof(Step)));
  CK(cudaMemcpy(d_step, &h, sizeof(Step), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&counters, sizeof(unsigned) * kMaxPhases));
  CK(cudaMalloc(&sink, 4096 * sizeof(int)));
  std::printf("%s, %d SMs; %d layers, %.3f GB a step\n", prop.name, sms, layers, total / 1e9);

  const size_t persistent_smem = size_t(kPersistentStages) * kChunk, chain_smem = size_t(kChainStages) * kChunk;
  CK(cudaFuncSetAttribute(persistent_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(persistent_smem)));
  CK(cudaFuncSetAttribute(persistent_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(persistent_smem)));
  CK(cudaFuncSetAttribute(launch_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(chain_smem)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  auto chain_graph = [&](int work, int copies) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < h.n; ++i) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(sizes[i] > 0 ? kChainCtasPerSm * sms : sms);
      cfg.blockDim = dim3(32 * (kChainWarps + 1));
      cfg.dynamicSmemBytes = chain_smem;
      cfg.stream = st;
      cudaLaunchAttribute pdl{};
      pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      pdl.val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = &pdl;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, launch_chain_kernel, (const uint8_t*)h.phases[i].w, h.phases[i].bytes, work, copies,
                            sink));
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
  };
  auto time_it = [&](auto&& launch) {
    std::vector<float> ms;
    for (int r = 0; r < 8; ++r) {
      CK(cudaMemsetAsync(counters, 0, sizeof(unsigned) * kMaxPhases, st));
      CK(cudaEventRecord(e0, st));
      launch();
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  auto report = [&](const char* name, float ms) {
    std::printf("%-46s %8.3f ms  %7.2f us/layer  %6.0f GB/s  %6.1f t/s\n", name, ms, 1000.0 * ms / layers,
                total / (ms * 1e6), 1000.0 / ms);
  };
  // warps: std::integral_constant of the consumer warps (a template argument of the kernel).
  const auto persistent = [&](auto warps, int work, int copies, int barriers) {
    constexpr int kWarps = decltype(warps)::value;
    char name[96];
    std::snprintf(name, sizeof name, "persistent%-2d work=%d copies=%d barriers=%d", kWarps, work, copies, barriers);
    report(name, time_it([&] {
      persistent_kernel<kWarps><<<sms, 32 * (kWarps + 1), persistent_smem, st>>>(d_step, counters, work, barriers,
                                                                                  copies, sink);
    }));
  };
  for (int work : {0, 4, 8, 16}) {
    for (int copies : {1, 0}) {
      for (int barriers : {1, 0}) persistent(std::integral_constant<int, 16>{}, work, copies, barriers);
      persistent(std::integral_constant<int, 8>{}, work, copies, 1);
      char name[96];
      cudaGraphExec_t ge = chain_graph(work, copies);
      std::snprintf(name, sizeof name, "chain        work=%d copies=%d", work, copies);
      report(name, time_it([&] { CK(cudaGraphLaunch(ge, st)); }));
      CK(cudaGraphExecDestroy(ge));
    }
  }
  CK(cudaGetLastError());
  return 0;
}
