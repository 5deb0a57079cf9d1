// How the launchers of kernels.h start their kernels: with Programmatic Dependent Launch (PDL)
// when the KernelStream allows it. A PDL kernel may be scheduled while the kernel before it in the
// stream is still running (its launch and its CTAs' start overlap that kernel's tail); its first
// dependent statement is await_predecessor(), which waits until everything before it in the stream
// has finished and its writes are visible. Without PDL await_predecessor() returns at once, so a
// kernel behaves the same launched either way.
#pragma once
#include <utility>

#include "backend/cuda/kernels.h"
#include "backend/cuda/timeline.cuh"
#include "util/error.h"

namespace minfer::cuda {

// REQUIRES: called by every thread before the kernel's first read of data an earlier kernel of
// the stream writes and before its first global write (only reads of what no kernel of the stream
// writes may come before: weights, and with AttnParams::early_reads the decode attention's rows,
// block tables and older K/V rows). It then lets the next kernel of the stream launch.
__device__ __forceinline__ void await_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  timeline_waited();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// For a kernel that reads and writes nothing its predecessor in the stream writes, only what was
// complete before every CTA of that predecessor passed its own await_predecessor() (which is when a
// PDL kernel can launch behind it): release_dependents() where await_predecessor() would stand lets
// the next kernel launch, and await_predecessor_before_exit() keeps every CTA from finishing before
// the predecessor has, so that the next kernel's wait still covers both. Such a kernel must not
// follow one that releases early (below).
//
// Early release (KernelStream::release_early): a kernel that reads nothing ahead of its wait that
// the next kernel could be waiting behind (the row rms_norm, the decode attention's split and
// combine) calls release_dependents() at its start, so that the next kernel launches while this
// one's predecessor still runs and its CTAs, where an SM has room, issue their reads of what no
// kernel writes (a matmul's first weight rounds) two launches ahead. Every kernel still sees all
// before it: the next one's wait returns only once this kernel has completed, after its own wait.
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void await_predecessor_before_exit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  timeline_waited();
#endif
}

template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   const KernelStream& s, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s.stream;
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &pdl;
  config.numAttrs = s.pdl ? 1 : 0;
#ifdef MINFER_TIMELINE
  timeline_note_launch(name, int64_t(grid.x) * grid.y * grid.z);
#endif
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) fail("CUDA kernel ", name, ": ", cudaGetErrorString(e));
}

}  // namespace minfer::cuda
