// Prototype (experiment, not shipped): float16 softmax of 128 x 131072, each block holding two half rows of two
// different rows (A: rows 0-63, B: rows 64-127), a cluster of 2 blocks sharing both rows, exchanging half-row
// (max, sum) through distributed shared memory. A is written while B's loads are still in flight.
// B_AFTER: how many of A's two steps are in before B's loads are issued (0: all issued at once). The runs:
// halves.cubin -DB_AFTER=0, halves3.cubin -DB_AFTER=1, halves2.cubin -DB_AFTER=2.
#ifndef B_AFTER
#define B_AFTER 0
#endif
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define COLS 131072
#define HALF 65536
#define NT 1024
#define LOG2E 1.4426950408889634f
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ void cp16(void* s, const void* g) {
  unsigned sa = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_groups() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ float nz(float m) { return m == NEG_INF ? 0.f : m; }
__device__ __forceinline__ void comb(float& m, float& s, float m2, float s2) {
  float M = fmaxf(m, m2), z = nz(M);
  s = s * ex2((m - z) * LOG2E) + s2 * ex2((m2 - z) * LOG2E);
  m = M;
}
__device__ __forceinline__ void block_merge(float& m, float& s, float* red) {
  for (int o = 1; o < 32; o <<= 1) comb(m, s, __shfl_xor_sync(~0u, m, o), __shfl_xor_sync(~0u, s, o));
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) { red[w] = m; red[32 + w] = s; }
  __syncthreads();
  m = red[l]; s = red[32 + l];
  for (int o = 1; o < 32; o <<= 1) comb(m, s, __shfl_xor_sync(~0u, m, o), __shfl_xor_sync(~0u, s, o));
}
// one step (4 vectors of 8 halves) into the running (m, s); r <- exp(x - new m) in half; returns the new m
__device__ __forceinline__ float absorb(uint4* r, float& m, float& s) {
  float mx = m;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const __half* h = reinterpret_cast<const __half*>(&r[u]);
#pragma unroll
    for (int k = 0; k < 8; ++k) mx = fmaxf(mx, __half2float(h[k]));
  }
  float z = nz(mx);
  s *= ex2((m - z) * LOG2E);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    __half* h = reinterpret_cast<__half*>(&r[u]);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float e = ex2((__half2float(h[k]) - z) * LOG2E);
      s += e;
      h[k] = __float2half_rn(e);
    }
  }
  m = mx;
  return mx;
}
__device__ __forceinline__ void scale_store(uint4* r, float ms, float M, float inv, __half* dst) {
  float sc = (ms == NEG_INF ? 0.f : ex2((ms - nz(M)) * LOG2E)) * inv;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    __half* h = reinterpret_cast<__half*>(&r[u]);
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = __float2half_rn(__half2float(h[k]) * sc);
    *reinterpret_cast<uint4*>(dst + (size_t)(u * NT) * 8) = r[u];
  }
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT, 1)
halves(const __half* __restrict__ x, __half* __restrict__ y, unsigned long long* __restrict__ stamps) {
  extern __shared__ uint4 sm[];  // A: steps 0, 1 (2 x 4 x NT vectors); B: step 0 (4 x NT)
  __shared__ float red[64];
  __shared__ float2 peer[2];
  cg::cluster_group cl = cg::this_cluster();
  unsigned long long t[5];
  t[0] = gtimer();
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");  // (partner started: waited before DSMEM)
  const int tid = threadIdx.x, rank = cl.block_rank(), k = blockIdx.x >> 1;
  const __half* xa = x + (size_t)k * COLS + rank * HALF + tid * 8;
  const __half* xb = x + (size_t)(64 + k) * COLS + rank * HALF + tid * 8;
  __half* ya = y + (size_t)k * COLS + rank * HALF + tid * 8;
  __half* yb = y + (size_t)(64 + k) * COLS + rank * HALF + tid * 8;
  // A's two steps, then B's (its first step to shared memory, its second to registers) after B_AFTER of A's
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int u = 0; u < 4; ++u) cp16(&sm[(st * 4 + u) * NT + tid], xa + (size_t)(st * 4 + u) * NT * 8);
    commit();
  }
#if B_AFTER == 1
  wait_groups<1>();
#elif B_AFTER == 2
  wait_groups<0>();
#endif
#pragma unroll
  for (int u = 0; u < 4; ++u) cp16(&sm[(8 + u) * NT + tid], xb + (size_t)u * NT * 8);
  commit();
  uint4 rb[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) rb[u] = *reinterpret_cast<const uint4*>(xb + (size_t)(4 + u) * NT * 8);
  // A
  float m = NEG_INF, s = 0.f, ms[2];
  uint4 r[4];
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#if B_AFTER == 0
    if (st == 0) wait_groups<2>(); else wait_groups<1>();
#elif B_AFTER == 1
    if (st == 1) wait_groups<1>();
#endif
#pragma unroll
    for (int u = 0; u < 4; ++u) r[u] = sm[(st * 4 + u) * NT + tid];
    ms[st] = absorb(r, m, s);
#pragma unroll
    for (int u = 0; u < 4; ++u) sm[(st * 4 + u) * NT + tid] = r[u];
  }
  float M = m, S = s;
  block_merge(M, S, red);
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (tid == 0) *cl.map_shared_rank(&peer[0], rank ^ 1) = make_float2(M, S);
  cl.sync();
  { float2 p = peer[0]; comb(M, S, p.x, p.y); }
  t[1] = gtimer();
  float inv = 1.f / S;
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int u = 0; u < 4; ++u) r[u] = sm[(st * 4 + u) * NT + tid];
    scale_store(r, ms[st], M, inv, ya + (size_t)st * 4 * NT * 8);
  }
  t[2] = gtimer();
  // B
  m = NEG_INF; s = 0.f;
  wait_groups<0>();
#pragma unroll
  for (int u = 0; u < 4; ++u) r[u] = sm[(8 + u) * NT + tid];
  ms[0] = absorb(r, m, s);
#pragma unroll
  for (int u = 0; u < 4; ++u) sm[(8 + u) * NT + tid] = r[u];
  ms[1] = absorb(rb, m, s);
  M = m; S = s;
  block_merge(M, S, red);
  if (tid == 0) *cl.map_shared_rank(&peer[1], rank ^ 1) = make_float2(M, S);
  cl.sync();
  { float2 p = peer[1]; comb(M, S, p.x, p.y); }
  t[3] = gtimer();
  inv = 1.f / S;
#pragma unroll
  for (int u = 0; u < 4; ++u) r[u] = sm[(8 + u) * NT + tid];
  scale_store(r, ms[0], M, inv, yb);
  scale_store(rb, ms[1], M, inv, yb + (size_t)4 * NT * 8);
  __syncthreads();
  t[4] = gtimer();
  if (tid == 0) {
    unsigned smid; asm("mov.u32 %0, %%smid;" : "=r"(smid));
    for (int i = 0; i < 5; ++i) stamps[blockIdx.x * 6 + i] = t[i];
    stamps[blockIdx.x * 6 + 5] = smid;
  }
}
