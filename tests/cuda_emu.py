"""Run a TVM-generated CUDA kernel on the CPU: one OS thread per CUDA thread, warp collectives emulated.

Why: CI has no GPU, and a tensor-core kernel's correctness hangs on fragment layouts that only show
at run time. This executes the very CUDA source TVM generates (compiled as C++ with g++), with
``ldmatrix`` / ``mma.sync`` / shuffles reimplemented from the PTX ISA's fragment definitions and
``__syncthreads`` as a real barrier, so a wrong layout, index or missing barrier shows as wrong
numbers. ``cp.async`` copies complete immediately (an ordering bug among async copies cannot show); so do TMA
tensor copies (``cp.async.bulk.tensor``, from the tensor maps the host function encodes), which then complete
their bytes on an emulated ``mbarrier``: arrivals, expected bytes and phase parity as in the PTX ISA, so a
producer / consumer protocol bug shows as wrong numbers or a deadlock (``run`` fails after ``timeout``).
Slow by design: meant for tiny problems.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define CUDART_INF_F INFINITY
#define uint unsigned int
#define uchar unsigned char
typedef _Float16 half;
static inline half __float2half_rn(float f) { return (half)f; }
struct nv_bfloat16 {  // round-to-nearest-even, like __float2bfloat16
  uint16_t bits;
  nv_bfloat16() = default;
  nv_bfloat16(float f) { uint32_t u; std::memcpy(&u, &f, 4); bits = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); }
  operator float() const { uint32_t u = (uint32_t)bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
struct uint4 { unsigned x, y, z, w; };
struct alignas(8) half4 { half x, y, z, w; };  // defined by TVM's CUDA preamble
struct alignas(4) half2 { half x, y; };  // CUDA's vector types
struct alignas(4) nv_bfloat162 { nv_bfloat16 x, y; };
struct alignas(8) float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline half4 make_half4(half x, half y, half z, half w) { return {x, y, z, w}; }
struct alignas(16) int4 { int x, y, z, w; };
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct Dim3 { int x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx, blockIdx;
static thread_local int emu_tid;  // the thread's linear index in its block: warps are its runs of 32
static char* emu_smem;
static std::barrier<>* emu_block_barrier;
// bar.sync / bar.arrive a, b (ids 1..15; 0 is __syncthreads): an instance completes when b threads arrived
struct EmuNamedBarrier {
  std::mutex m;
  std::condition_variable cv;
  unsigned arrived = 0, generation = 0;
  void arrive(unsigned count, bool wait) {
    std::unique_lock<std::mutex> lock(m);
    unsigned gen = generation;
    if (++arrived == count) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else if (wait) {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};
static EmuNamedBarrier emu_named_barriers[16];
static std::vector<std::barrier<>*> emu_warp_barriers;
static uint32_t emu_slots[1024][16];  // per-thread operand exchange for warp collectives
static inline float max(float a, float b) { return std::fmax(a, b); }
static inline half max(half a, half b) { return a > b ? a : b; }  // as TVM's CUDA preamble defines them
static inline half min(half a, half b) { return a < b ? a : b; }
static inline float min(float a, float b) { return std::fmin(a, b); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }  // int64_t (CUDA declares both)
static inline long min(long a, long b) { return a < b ? a : b; }
static inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
static inline void warp_sync() { emu_warp_barriers[emu_tid / 32]->arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xFFFFFFFF) { warp_sync(); }  // (full warps only)
static inline unsigned __cvta_generic_to_shared(const void* p) { return (unsigned)((const char*)p - emu_smem); }
static inline float __shfl_xor_sync(unsigned, float v, int lane_mask, int width) {
  int t = emu_tid, lane = t % 32;
  std::memcpy(&emu_slots[t][0], &v, 4);
  warp_sync();
  int src = (t - lane) + ((lane ^ lane_mask) % width + lane / width * width);
  float r; std::memcpy(&r, &emu_slots[src][0], 4);
  warp_sync();
  return r;
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src_lane, int width) {
  int t = emu_tid, lane = t % 32;
  std::memcpy(&emu_slots[t][0], &v, sizeof(T));
  warp_sync();
  T r; std::memcpy(&r, &emu_slots[(t - lane) + (src_lane % width + lane / width * width)][0], sizeof(T));
  warp_sync();
  return r;
}
static inline int __all_sync(unsigned, int p) {  // (full warps only)
  int t = emu_tid, all = 1;
  emu_slots[t][0] = p != 0;
  warp_sync();
  for (int l = 0; l < 32; ++l) all &= emu_slots[t - t % 32 + l][0];
  warp_sync();
  return all;
}
// ldmatrix.m8n8.xN.b16: threads 8i..8i+7 give the row addresses of matrix i; lane l gets matrix i's
// elements (l/4, 2(l%4)..+1), or with .trans (2(l%4)..+1, l/4), packed in register i.
static void emu_ldmatrix(bool trans, int num, unsigned addr, unsigned** out) {
  int t = emu_tid, lane = t % 32, w0 = t - lane;
  emu_slots[t][0] = addr;
  warp_sync();
  for (int i = 0; i < num; ++i) {
    uint16_t e[2];
    for (int k = 0; k < 2; ++k) {
      int row = trans ? 2 * (lane % 4) + k : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + k;
      std::memcpy(&e[k], emu_smem + emu_slots[w0 + 8 * i + row][0] + 2 * col, 2);
    }
    *out[i] = e[0] | ((unsigned)e[1] << 16);
  }
  warp_sync();
}
template <typename T> static float emu_elem(uint32_t reg, int k) {
  T v; std::memcpy(&v, (char*)&reg + 2 * k, 2); return (float)v;
}
// The warp's mma.sync: every lane publishes its A (4 regs), B (2 regs) and C (4 floats), then computes its own
// D = A B + C for an m16n8kK tile. fill(lane's regs, g, t, A, B) places one lane's A and B elements
// (g = lane/4, t = lane%4); C/D hold (g, 2t..2t+1) and (g+8, 2t..2t+1) for every shape.
template <int K, typename Fill>
static void emu_mma_warp(float** d, const unsigned* a, const unsigned* b, const float* c, Fill fill) {
  int t = emu_tid, lane = t % 32, w0 = t - lane;
  std::memcpy(&emu_slots[t][0], a, 16); std::memcpy(&emu_slots[t][4], b, 8); std::memcpy(&emu_slots[t][6], c, 16);
  warp_sync();
  float A[16][K], B[K][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    int g = l / 4, q = l % 4;
    fill(emu_slots[w0 + l], g, q, A, B);
    for (int k = 0; k < 2; ++k) {
      std::memcpy(&C[g][2 * q + k], &emu_slots[w0 + l][6 + k], 4); std::memcpy(&C[g + 8][2 * q + k], &emu_slots[w0 + l][8 + k], 4);
    }
  }
  warp_sync();
  int g = lane / 4, q = lane % 4;
  for (int r = 0; r < 4; ++r) {
    int row = g + r / 2 * 8, col = 2 * q + r % 2;
    float acc = C[row][col];
    for (int k = 0; k < K; ++k) acc += A[row][k] * B[k][col];
    *d[r] = acc;
  }
}
// mma.m16n8k16.row.col, fp32 accumulate: A regs hold rows (g, g+8, g, g+8) x cols (2t, 2t, 2t+8, 2t+8)
// (+0, +1); B regs hold k (2t, 2t+8) (+0, +1) of column g. (wgmma's A registers are laid out alike.)
template <typename T> static void emu_fill_a16(const uint32_t* r, int g, int q, float (*A)[16]) {
  for (int k = 0; k < 2; ++k) {
    A[g][2 * q + k] = emu_elem<T>(r[0], k); A[g + 8][2 * q + k] = emu_elem<T>(r[1], k);
    A[g][2 * q + 8 + k] = emu_elem<T>(r[2], k); A[g + 8][2 * q + 8 + k] = emu_elem<T>(r[3], k);
  }
}
template <typename T> static void emu_mma(float** d, const unsigned* a, const unsigned* b, const float* c) {
  emu_mma_warp<16>(d, a, b, c, [](const uint32_t* r, int g, int q, float (*A)[16], float (*B)[8]) {
    emu_fill_a16<T>(r, g, q, A);
    for (int k = 0; k < 2; ++k) {
      B[2 * q + k][g] = emu_elem<T>(r[4], k); B[2 * q + 8 + k][g] = emu_elem<T>(r[5], k);
    }
  });
}
// mma.m16n8k8.row.col.f32.tf32.tf32.f32: A regs hold (g, t), (g+8, t), (g, t+4), (g+8, t+4); B regs k (t, t+4) of
// column g. A tf32 operand is its fp32 register with the low 13 mantissa bits ignored.
static float emu_tf32(uint32_t reg) { reg &= 0xFFFFE000u; float f; std::memcpy(&f, &reg, 4); return f; }
static void emu_mma_tf32(float** d, const unsigned* a, const unsigned* b, const float* c) {
  emu_mma_warp<8>(d, a, b, c, [](const uint32_t* r, int g, int q, float (*A)[8], float (*B)[8]) {
    A[g][q] = emu_tf32(r[0]); A[g + 8][q] = emu_tf32(r[1]); A[g][q + 4] = emu_tf32(r[2]); A[g + 8][q + 4] = emu_tf32(r[3]);
    B[q][g] = emu_tf32(r[4]); B[q + 4][g] = emu_tf32(r[5]);
  });
}
// wgmma (sm_90a) operands in shared memory, named by a matrix descriptor: start address, leading (LBO) and
// stride (SBO) byte offsets, layout (bits 62-63).
// - No swizzle (0): LBO along K and SBO along M/N between 8 x 16-byte core matrices. K-major: a core matrix row
//   is 8 k of one m/n; MN-major (transposed): 8 m/n of one k.
// - 128-byte swizzle (1): 128-byte rows (64 elements) in 8-row groups SBO apart, each 16-byte chunk of a row
//   stored at chunk ^ (address bits 7-9, the row within its 1024 bytes). K-major: a row is an m/n, k runs along
//   it (one wgmma's 16 k stay within the row); MN-major: a row is a k, 64 m/n along it, blocks of 64 m/n LBO apart.
template <typename T> static float emu_desc_elem(uint64_t desc, int mn, int k, bool mn_major) {
  unsigned start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
  unsigned off;
  if (desc >> 62 == 0) {
    off = start + mn / 8 * sbo + k / 8 * lbo + (mn_major ? k % 8 * 16 + mn % 8 * 2 : mn % 8 * 16 + k % 8 * 2);
  } else if (desc >> 62 == 1) {
    off = mn_major ? start + k / 8 * sbo + k % 8 * 128 + mn / 64 * lbo + mn % 64 * 2
                   : start + mn / 8 * sbo + mn % 8 * 128 + k * 2;
    off ^= (off >> 7 & 7) << 4;
  } else {
    std::abort();  // 32- and 64-byte swizzles are not emulated
  }
  T v; std::memcpy(&v, emu_smem + off, 2); return (float)v;
}
// wgmma.mma_async.m64nNk16, f32 accumulator, run to completion at issue: warp w of the warpgroup owns rows
// 16w..16w+15, laid out per 8 columns as mma.m16n8's C; A from the warp's registers (rs, mma.m16n8k16's A
// fragment) or from shared memory (ss, K-major).
template <typename T>
static void emu_wgmma(float** d, int n, const unsigned* a_regs, uint64_t a_desc, uint64_t b_desc, unsigned scale_d, bool trans_b) {
  int t = emu_tid, lane = t % 32, w0 = t - lane, row0 = t % 128 / 32 * 16;
  float A[16][16];
  if (a_regs) {
    std::memcpy(&emu_slots[t][0], a_regs, 16);
    warp_sync();
    for (int l = 0; l < 32; ++l) emu_fill_a16<T>(emu_slots[w0 + l], l / 4, l % 4, A);
    warp_sync();
  } else {
    for (int r = 0; r < 16; ++r) for (int k = 0; k < 16; ++k) A[r][k] = emu_desc_elem<T>(a_desc, row0 + r, k, false);
  }
  int g = lane / 4, q = lane % 4;
  for (int i = 0; i < n / 2; ++i) {
    int row = g + i % 4 / 2 * 8, col = i / 4 * 8 + 2 * q + i % 2;
    float acc = scale_d ? *d[i] : 0.f;
    for (int k = 0; k < 16; ++k) acc += A[row][k] * emu_desc_elem<T>(b_desc, col, k, trans_b);
    *d[i] = acc;
  }
}
static void emu_cp_async(unsigned dst, const void* src, unsigned bytes, unsigned src_bytes) {
  std::memset(emu_smem + dst, 0, bytes);
  std::memcpy(emu_smem + dst, src, src_bytes);
}
// mbarrier (sm_90): a phase completes when its pending arrivals and transaction bytes both reach 0; a wait on
// parity p returns once the phase of that parity has completed (the current phase's parity differs)
struct EmuMbarrier {
  std::mutex m;
  std::condition_variable cv;
  unsigned count = 0, pending = 0, phase = 0;
  long tx = 0;
  void update(int arrivals, long bytes) {
    std::lock_guard<std::mutex> lock(m);
    pending -= arrivals;
    tx += bytes;
    if (pending == 0 && tx == 0) { ++phase; pending = count; cv.notify_all(); }
  }
  void wait(unsigned parity) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return (phase & 1) != parity; });
  }
};
static std::mutex emu_mbarriers_lock;
static std::map<unsigned, EmuMbarrier*> emu_mbarriers;  // by shared-window address, per block
static EmuMbarrier& emu_mbarrier(unsigned addr) {
  std::lock_guard<std::mutex> lock(emu_mbarriers_lock);
  auto*& b = emu_mbarriers[addr];
  if (!b) b = new EmuMbarrier;
  return *b;
}
static void emu_mbarrier_init(unsigned addr, unsigned count) { auto& b = emu_mbarrier(addr); b.count = b.pending = count; }
// setmaxnreg (sm_90a) moves registers between a CTA's warps: each warp starts with the launch's even share (as
// ptxas allocates under __launch_bounds__(threads, 1)); .inc waits until other warps' .dec have freed enough, so
// taking more than the CTA has deadlocks as on the GPU
struct EmuRegisterPool {
  std::mutex m;
  std::condition_variable cv;
  long free = 0;
  std::vector<long> per_warp;
};
static EmuRegisterPool emu_registers;
static void emu_setmaxnreg(long n, bool inc) {
  if (emu_tid % 32 == 0) {
    std::unique_lock<std::mutex> lock(emu_registers.m);
    long& cur = emu_registers.per_warp[emu_tid / 32];
    if (inc ? n < cur : n > cur) std::abort();  // .inc must not lower the count, .dec must not raise it
    emu_registers.cv.wait(lock, [&] { return emu_registers.free >= 32 * (n - cur); });
    emu_registers.free -= 32 * (n - cur);
    cur = n;
    emu_registers.cv.notify_all();
  }
  warp_sync();
}
// The tensor map a kernel receives: filled by the harness from the host's tensormap_encode_tiled (dims and box
// innermost first, byte strides with stride[0] the element size; swizzle 3 = 128 bytes).
struct CUtensorMap { long long base, rank, swizzle, dim[5], stride[5], box[5]; };
// cp.async.bulk.tensor (TMA), completed at issue: the box at coords between global memory and shared memory in the
// map's swizzle (128 bytes: 16-byte chunk ^ address bits 7-9); a load zero-fills the box outside the tensor, a store
// drops those elements, but one at a negative coordinate is an illegal instruction (H100, 2026-12-06: loads take
// them), recorded in ``emu_illegal`` and skipped. Returns the box's bytes.
extern "C" { const char* emu_illegal = nullptr; }
static long long emu_tma_copy(unsigned smem, const void* tmap, const int* coords, bool store) {
  const CUtensorMap& t = *(const CUtensorMap*)tmap;
  for (int d = 0; store && d < t.rank; ++d)
    if (coords[d] < 0) { emu_illegal = "TMA store at a negative coordinate"; return 0; }
  long long n = 1, esize = t.stride[0];
  for (int d = 0; d < t.rank; ++d) n *= t.box[d];
  for (long long i = 0; i < n; ++i) {
    long long rest = i, off = 0;
    bool inside = true;
    for (int d = 0; d < t.rank; ++d) {
      long long c = coords[d] + rest % t.box[d];
      rest /= t.box[d];
      inside = inside && c >= 0 && c < t.dim[d];
      off += c * t.stride[d];
    }
    unsigned addr = smem + (unsigned)(i * esize);
    if (t.swizzle == 3) addr ^= (addr >> 7 & 7) << 4;
    else if (t.swizzle != 0) std::abort();  // 32- and 64-byte swizzles are not emulated
    char* global = (char*)t.base + off;
    if (store) { if (inside) std::memcpy(global, emu_smem + addr, esize); }
    else if (inside) std::memcpy(emu_smem + addr, global, esize);
    else std::memset(emu_smem + addr, 0, esize);
  }
  return n * esize;
}
// the load then completes its bytes on the mbarrier
static void emu_tma_load(unsigned dst, const void* tmap, const int* coords, unsigned mbar) {
  emu_mbarrier(mbar).update(0, -emu_tma_copy(dst, tmap, coords, false));
}
// stmatrix.m8n8.x4.b16: threads 8i..8i+7 give the row addresses of matrix i; lane l holds matrix i's elements
// (l/4, 2(l%4)..+1), here as floats x[2i], x[2i+1], rounded to E
template <typename E> static void emu_stmatrix4(unsigned addr, const float* x) {
  int t = emu_tid, lane = t % 32, w0 = t - lane;
  emu_slots[t][0] = addr;
  warp_sync();
  for (int i = 0; i < 4; ++i) {
    E e[2] = {E(x[2 * i]), E(x[2 * i + 1])};
    std::memcpy(emu_smem + emu_slots[w0 + 8 * i + lane / 4][0] + 4 * (lane % 4), e, 4);
  }
  warp_sync();
}
"""

_HARNESS = r"""
extern "C" void emu_launch(void** args, int gx, int gy, int gz, int tx, int ty, int tz, long smem) {
  int threads = tx * ty * tz;
  std::vector<char> shared(smem + 64);
  emu_smem = shared.data();
  // blocks one at a time, last first: of a split softmax's blocks, which publish partials for one another, every
  // one but a row's first (never empty) then finds some missing and takes its fallback, the first finds all
  for (int bz = gz - 1; bz >= 0; --bz) for (int by = gy - 1; by >= 0; --by) for (int bx = gx - 1; bx >= 0; --bx) {
    std::barrier<> block(threads);
    emu_block_barrier = &block;
    std::vector<std::barrier<>*> warps;
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(new std::barrier<>(std::min(32, threads - 32 * w)));
    emu_warp_barriers = warps;
    for (auto& n : emu_named_barriers) n.arrived = 0;
    for (auto& [addr, b] : emu_mbarriers) delete b;
    emu_mbarriers.clear();
    emu_registers.free = 0;
    emu_registers.per_warp.assign((threads + 31) / 32, 65536 / threads / 8 * 8);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([=] {
        emu_tid = t;
        threadIdx.x = t % tx; threadIdx.y = t / tx % ty; threadIdx.z = t / (tx * ty);
        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
        KERNEL_CALL;
      });
    for (auto& th : pool) th.join();
    for (auto* w : warps) delete w;
  }
}
"""


_ELEM_TYPES = {"f16": "half", "bf16": "nv_bfloat16"}  # PTX operand types -> the emulation's C++ types


def _balanced(src: str, start: int, pair: str = "()") -> int:
    """Index just past the bracket group opening at ``start`` (string literals skipped)."""
    depth, i = 0, start
    while True:
        ch = src[i]
        if ch == '"':
            i = src.index('"', i + 1)
        elif ch == pair[0]:
            depth += 1
        elif ch == pair[1]:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur, in_str = [], 0, "", False
    for ch in text:
        in_str = in_str != (ch == '"')
        depth += 0 if in_str else (ch == "(") - (ch == ")")
        if ch == sep and depth == 0 and not in_str:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _operands(text: str) -> list[str]:
    """``"=r"(expr), "r"(expr)`` -> [expr, expr]."""
    return [op[op.index("(") + 1 : op.rindex(")")] for op in _split_top(text, ",") if op.strip()]


def _rewrite_asm(body: str) -> str:
    out, pos = [], 0
    for m in re.finditer(r"__asm__ __volatile__\(", body):
        if m.start() < pos:
            continue
        end = _balanced(body, m.end() - 1)
        template, outs, ins = (_split_top(body[m.end() : end - 1], ":") + ["", ""])[:3]
        insn = "".join(re.findall(r'"([^"]*)"', template))
        outs, ins = _operands(outs), _operands(ins)
        if insn.startswith("ldmatrix"):
            num = int(re.search(r"\.x(\d)", insn).group(1))
            regs = ", ".join(f"(unsigned*)&({o})" for o in outs)
            call = f"{{ unsigned* r_[] = {{{regs}}}; emu_ldmatrix({str('.trans' in insn).lower()}, {num}, {ins[0]}, r_); }}"
        elif insn.startswith(("mma.sync.aligned.m16n8k16.row.col.f32.", "mma.sync.aligned.m16n8k8.row.col.f32.tf32")):
            elem = insn.split(".")[7]
            fn = "emu_mma_tf32" if elem == "tf32" else f"emu_mma<{_ELEM_TYPES[elem]}>"
            ds = ", ".join(f"(float*)&({o})" for o in outs)
            call = (f"{{ float* d_[] = {{{ds}}}; unsigned a_[] = {{{', '.join(ins[:4])}}}; "
                    f"unsigned b_[] = {{{', '.join(ins[4:6])}}}; float c_[] = {{{', '.join(ins[6:10])}}}; "
                    f"{fn}(d_, a_, b_, c_); }}")
        else:
            raise NotImplementedError(f"no emulation for PTX '{insn}'")
        out += [body[pos : m.start()], call]
        pos = end + 1  # past the closing ';'
    return "".join(out) + body[pos:]


def _helpers(preamble: str) -> str:
    """Emulations of the ``tvm_builtin_*`` helpers TVM defines around inline PTX."""
    defs, seen = [], set()
    for name, params in re.findall(r"__device__ [\w ]+? ((?:tvm_builtin|tvmpipe)_\w+)\(([^)]*)\)", preamble):
        if name in seen:  # (a helper's source is repeated for every helper it defines, behind an include guard)
            continue
        seen.add(name)
        if "cp_async" in name and "shared_global" in name:
            nbytes = int(name.rsplit("_", 1)[1])
            src_size = "__src_size" if "src_size" in params else str(nbytes)
            defs.append(f"static inline void {name}({params}) {{ emu_cp_async(__dst_mem, __src_mem, {nbytes}, {src_size}); }}")
        elif name.startswith("tvm_builtin_ptx_wgmma_wait_group"):
            # wgmma runs to completion when issued here, but each lane at its own pace: the warp-wide wait (.aligned)
            # is where every lane's wgmma has read its operands, so no lane passes it before all have (else a lane
            # ahead could release a stage that a lane behind still reads)
            defs.append(f"static inline void {name}() {{ warp_sync(); }}")
        elif "commit_group" in name or "wait_group" in name:  # (copies and wgmma complete at issue here)
            defs.append(f"static inline void {name}() {{}}")
        elif name.startswith(("tvm_builtin_ptx_bar_sync_count", "tvm_builtin_ptx_bar_arrive")):
            defs.append(f"static inline void {name}(uint32_t a, uint32_t b) {{ "
                        f"emu_named_barriers[a].arrive(b, {str('sync' in name).lower()}); }}")
        elif m := re.fullmatch(r"tvm_builtin_ptx_wgmma_(b?f16)_(ss|rs)_mma_async_sync_aligned_m64n(\d+)k16_f32_\w+?_1_1_(\w+)", name):
            elem, form, n, trans = m.group(1), m.group(2), int(m.group(3)), m.group(4).split("_")
            if form == "ss" and trans[0] != "0":
                raise NotImplementedError(f"no emulation for a transposed A in {name}")
            ds = ", ".join(f"&__d{i}" for i in range(n // 2))
            a = ("nullptr, __a_desc" if form == "ss" else "a_, 0")
            defs.append(f"static inline void {name}({params}) {{ float* d_[] = {{{ds}}}; "
                        + ("unsigned a_[] = {__a0, __a1, __a2, __a3}; " if form == "rs" else "")
                        + f"emu_wgmma<{_ELEM_TYPES[elem]}>(d_, {n}, {a}, __b_desc, __scale_d, "
                        f"{str(trans[-1] == '1').lower()}); }}")
        elif name == "tvmpipe_ex2":  # ex2.approx.ftz.f32: results below 2^-126 flush to 0
            defs.append("static inline float tvmpipe_ex2(float x) { float y = std::exp2(x); return y < 0x1p-126f ? 0.f : y; }")
        elif name in ("tvmpipe_all", "tvmpipe_copy16"):  # plain C++ (a warp vote, a 16-byte copy): the kernel's own
            head = re.search(rf"__device__ [\w ]+? {name}\(", preamble)
            defs.append("static " + preamble[head.start() : _balanced(preamble, preamble.index("{", head.end()), "{}")])
        elif m := re.fullmatch(r"tvmpipe_split_(\w+)_(tag|arrive|publish|take)", name):  # a split's rendezvous
            # (tagged slots and a launch counter in static memory); blocks run one after another here, so what is
            # not there yet never comes
            kernel, fn = m.groups()
            blocks = int(re.search(rf"tvmpipe_split_{kernel}_slots\[2 \* (\d+)\]", preamble).group(1))
            pre = f"tvmpipe_split_{kernel}"
            # (the tag is plain arithmetic: its body is the kernel's own)
            tag = re.search(rf"{pre}_tag\((unsigned long long epoch, const void\* x)\) \{{(.*?)\n\}}", preamble, re.S)
            defs.append({
                "tag": f"static uint64_t {pre}_count, {pre}_slots[2 * {blocks}];\n"
                       f"static inline uint64_t {name}({tag.group(1)}) {{{tag.group(2)}\n}}",
                "arrive": f"static std::mutex {pre}_lock;\n"
                          f"static inline uint64_t {name}() {{ std::lock_guard<std::mutex> g({pre}_lock); return {pre}_count++ / {blocks}; }}",
                "publish": f"static inline void {name}(int b, uint64_t e, const void* x, float m, float s) {{ "
                           f"float ms[2] = {{m, s}}; std::memcpy(&{pre}_slots[2 * b], ms, 8); "
                           f"{pre}_slots[2 * b + 1] = {pre}_tag(e, x); }}",
                "take": f"static inline int {name}(int b, uint64_t e, const void* x, float* m, float* s) {{ "
                        f"if ({pre}_slots[2 * b + 1] != {pre}_tag(e, x)) return 0; float ms[2]; "
                        f"std::memcpy(ms, &{pre}_slots[2 * b], 8); *m = ms[0]; *s = ms[1]; return 1; }}",
            }[fn])
        elif name.startswith("tvm_builtin_ptx_mbarrier_init"):
            defs.append(f"static inline void {name}({params}) {{ emu_mbarrier_init(__addr, __count); }}")
        elif name.startswith("tvm_builtin_ptx_mbarrier_arrive"):  # (expect_tx: the bytes, before they land)
            tx = "__tx_count" if "expect_tx" in name else "0"
            defs.append(f"static inline void {name}({params}) {{ emu_mbarrier(__addr).update(1, {tx}); }}")
        elif name.startswith("tvm_builtin_ptx_mbarrier_try_wait_parity"):  # (blocks until it would succeed)
            defs.append(f"static inline void {name}({params}) {{ emu_mbarrier(__addr).wait(__phase); __wait_complete = 1; }}")
        elif m := re.fullmatch(r"tvm_builtin_ptx_cp_async_bulk_tensor_g2s_\w+_(\d)d_shared__cluster_global_mbarrier__complete_tx__bytes", name):
            coords = ", ".join(f"__coords{i}" for i in range(int(m.group(1))))
            defs.append(f"static inline void {name}({params}) {{ int c_[] = {{{coords}}}; emu_tma_load(__dst_mem, __tmap, c_, __mbar); }}")
        elif m := re.fullmatch(r"tvm_builtin_ptx_setmaxnreg_(inc|dec)_sync_aligned_u32_(\d+)", name):
            defs.append(f"static inline void {name}() {{ emu_setmaxnreg({m.group(2)}, {str(m.group(1) == 'inc').lower()}); }}")
        elif name.startswith("tvm_builtin_ptx_fence_mbarrier_init"):  # (the emulated mbarriers are mutex-guarded)
            defs.append(f"static inline void {name}() {{}}")
        elif m := re.fullmatch(r"tvmpipe_stmatrix_(b?f16)", name):
            defs.append(f"static inline void {name}({params}) {{ float x_[] = {{x0, x1, x2, x3, x4, x5, x6, x7}}; "
                        f"emu_stmatrix4<{_ELEM_TYPES[m.group(1)]}>(a, x_); }}")
        elif name == "tvmpipe_tma_store":
            defs.append(f"static inline void {name}({params}) {{ int c_[] = {{c0, c1, c2, c3}}; emu_tma_copy(src, map, c_, true); }}")
        elif name in ("tvmpipe_tma_store_commit", "tvmpipe_tma_store_wait"):  # (the stores complete at issue)
            defs.append(f"static inline void {name}() {{}}")
        elif name.startswith("tvmpipe_pin_"):  # a compiler barrier: nothing to do when run in order
            defs.append(f"static inline void {name}({params}) {{}}")
        elif re.fullmatch(r"tvm_builtin_ptx_(wgmma_fence|fence_proxy)_\w+", name):
            # (wgmma complete at issue: its fences have nothing to order)
            defs.append(f"static inline void {name}() {{}}")
        elif name == "tvm_builtin_cluster_ctaid_x":  # (%cluster_ctarank of a cluster along x)
            defs.append(f"static int emu_cluster_x = 1;\n"
                        f'extern "C" void emu_set_cluster(int x) {{ emu_cluster_x = x; }}\n'
                        f"static inline unsigned {name}() {{ return blockIdx.x % emu_cluster_x; }}")
        elif name == "tvm_builtin_cuda_cvta_generic_to_shared":
            defs.append(f"static inline unsigned {name}(void* p) {{ return __cvta_generic_to_shared(p); }}")
        else:
            raise NotImplementedError(f"no emulation for helper {name}")
    return "\n".join(defs)


def compile_kernel(source: str, name: str, workdir: Path) -> tuple[ctypes.CDLL, list[str]]:
    """Compile kernel ``name`` of a TVM CUDA module source; return the library and its parameter names."""
    start = source.index('extern "C" __global__')
    head = re.search(rf'extern "C" __global__ void __launch_bounds__\([\d, ]+\) {name}\(([^)]*)\) \{{', source)
    params = [p.strip().rsplit(" ", 1) for p in head.group(1).split(",")]
    kernel = source[head.start() : _balanced(source, head.end() - 1, "{}")].replace('extern "C" ', "").replace("__align__(64)", "alignas(64)")
    kernel = re.sub(r"extern __shared__ alignas\(\d+\) (\w+) (\w+)\[\];", r"\1* \2 = (\1*)emu_smem;", kernel)
    # static shared arrays: one for all threads (the blocks run one at a time)
    kernel = re.sub(r"__shared__ (alignas\(\d+\)) (\w+ \w+\[\d+\];)", r"\1 static \2", kernel)
    # a thread's local arrays (registers on the GPU) start as garbage, not as the zeros a fresh C++ stack often holds,
    # so a kernel that reads one before writing it fails here too
    kernel = re.sub(r"^(\s*)(alignas\(\d+\) \w+ (\w+)\[\d+\];)", r"\1\2 std::memset(\3, 0xA5, sizeof(\3));", kernel,
                    flags=re.M)
    call = f"{name}(" + ", ".join(f"*(CUtensorMap*)args[{j}]" if "CUtensorMap" in t else f"({t.replace('__restrict__', '')})args[{j}]"
                                  for j, (t, _) in enumerate(params)) + ")"
    cpp = PRELUDE + _helpers(source[:start]) + "\n" + _rewrite_asm(kernel) + _HARNESS.replace("KERNEL_CALL", call)
    (workdir / "emu.cc").write_text(cpp)
    lib = workdir / "emu.so"
    r = subprocess.run(["g++", "-std=c++20", "-O0", "-fPIC", "-shared", "-pthread", "-o", str(lib), str(workdir / "emu.cc")],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"g++ failed on the emulated kernel:\n{r.stderr[-4000:]}")
    return ctypes.CDLL(str(lib)), [p.removesuffix("_ptr") for _, p in params]


def launch_config(host_script: str, name: str) -> tuple[tuple[int, int, int], tuple[int, int, int], int, int]:
    """(grid, block, dynamic shared bytes, blocks per cluster along x) of ``name`` from the printed lowered host
    function."""
    m = re.search(rf'T\.call_ffi_kernel\("{name}", (.*?), launch_params=\[(.*?)\]', host_script)
    tags = [t.strip().strip('"') for t in m.group(2).split(",")]
    values = [int(re.sub(r"T\.int\d+\((\d+)\)", r"\1", v)) for v in _split_top(m.group(1), ",")[-len(tags):]]
    dims = dict(zip(tags, values))
    grid = tuple(dims.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(dims.get(f"threadIdx.{a}", 1) for a in "xyz")
    return grid, block, dims.get("tirx.use_dyn_shared_memory", 0), dims.get("clusterCtaIdx.x", 1)


def tensor_maps(host_script: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The emulation's ``CUtensorMap`` (int64 fields, see PRELUDE) of each ``tensormap_encode_tiled`` in the printed
    host function, by descriptor name, over the named arrays (static shapes)."""
    maps = {}
    for m in re.finditer(r"T\.tensormap_encode_tiled\((\w+), (\w+?)(?:_\d+)?\.data, ([\d, ]+), descriptor_dtype=\"(\w+)\", "
                         r"rank=(\d), interleave=0, swizzle=(\d)", host_script):
        name, buf, nums, dtype, rank, swizzle = m.groups()
        rank, nums = int(rank), [int(x) for x in nums.strip(", ").split(",")]
        dims, strides, box = nums[:rank], [np.dtype(dtype).itemsize, *nums[rank : 2 * rank - 1]], nums[2 * rank - 1 : 3 * rank - 1]
        assert nums[3 * rank - 1 :] == [1] * rank, "element strides other than 1 are not emulated"
        pad = lambda xs: xs + [0] * (5 - rank)  # noqa: E731
        maps[name] = np.array([arrays[buf].ctypes.data, rank, int(swizzle), *pad(dims), *pad(strides), *pad(box)], np.int64)
    return maps


def cuda_source(func, target, symbol: str = "main") -> str:
    """The CUDA C++ that TVM generates for PrimFunc ``func`` (its kernels named ``<symbol>_kernel``...)."""
    import tvm

    exe = tvm.compile(tvm.IRModule({symbol: func.with_attr("global_symbol", symbol)}), target=target)
    return [m for m in exe.mod._collect_from_import_tree(lambda m: m.kind == "cuda")][0].inspect_source("cuda")


def host_script(func, target) -> str:
    """The printed host function of PrimFunc ``func`` lowered for CUDA ``target`` as ``emu`` (its kernels' launches)."""
    import tvm
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    mod = tvm.IRModule({"emu": func.with_attr("global_symbol", "emu").with_attr("target", target)})
    with target:
        return default_s_tir_pipeline()[0](mod)["emu"].script()


def run(func, target, arrays: dict[str, np.ndarray], timeout: float = 600) -> None:
    """Build PrimFunc ``func`` for CUDA ``target`` and run it on the CPU on ``arrays`` (outputs written in place),
    each kernel it launches (one per output of a Split) in turn; arrays are named by kernel parameter."""
    host = host_script(func, target)
    source = cuda_source(func, target, "emu")
    # global scratch the host function allocates for its kernels (e.g. partial results one kernel leaves the next),
    # filled with garbage as device memory is
    scratch = {name: np.frombuffer(np.full(int(n) * np.dtype(dtype or "float32").itemsize, 0xA5, np.uint8), dtype or "float32").copy()
               for name, n, dtype in re.findall(r'(\w+) = T\.alloc_buffer\(\((\d+),\)(?:, "(\w+)")?\)', host)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in re.findall(r'T\.call_ffi_kernel\("(emu_kernel\w*)"', host):
            grid, block, smem, cluster = launch_config(host, name)
            # (as CUDA's launch requires; the blocks of a cluster still run one at a time here, not side by side)
            assert grid[0] % cluster == 0, f"{name}: {grid[0]} blocks in clusters of {cluster}"
            (Path(tmp) / name).mkdir()
            lib, names = compile_kernel(source, name, Path(tmp) / name)
            args = {**scratch, **arrays, **tensor_maps(host, arrays)}
            ptrs = (ctypes.c_void_p * len(names))(*[args[n].ctypes.data for n in names])
            if hasattr(lib, "emu_set_cluster"):  # (a kernel that reads its cluster rank)
                lib.emu_set_cluster(cluster)
            # a barrier protocol bug deadlocks the emulated threads: fail the test instead of hanging it
            launch = threading.Thread(target=lib.emu_launch, args=(ptrs, *grid, *block, smem), daemon=True)
            launch.start()
            launch.join(timeout)
            if launch.is_alive():
                raise TimeoutError(f"emulated kernel still running after {timeout} s: deadlocked barriers?")
            illegal = ctypes.c_char_p.in_dll(lib, "emu_illegal").value
            assert illegal is None, f"{name}: illegal instruction: {illegal.decode()}"
