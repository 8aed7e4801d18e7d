// Machine rooflines measured in the same run as the figures they scale:
// sustained read bandwidth and register-only fp32 FMA throughput.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"

namespace pdq {

// Each peak probes the instructions of the kernel path dispatch chose
// (KernelIsaName: AVX2, AVX-512, AMX tiles for int8 where present).

// GB/s reading a buffer much larger than the last-level cache with every
// thread of the pool (best of several passes).
double MeasureReadBandwidthGBps(ThreadPool& pool, int64_t buffer_bytes = 512ll << 20);

// GFLOP/s of independent fp32 FMA chains in registers on every thread, using
// the widest vector ISA the kernels dispatch to.
double MeasureFmaPeakGflops(ThreadPool& pool);

// GOP/s (2 per product) of independent integer multiply-add chains on every
// thread: int16 pairs (`int8` false) or u8 x s8 quads: vpmaddwd and
// vpmaddubsw on AVX2 (and vpdpbusd for int8 on "avx2+vnni"), vpdpwssd and
// vpdpbusd on AVX-512, and for int8 AMX's
// tdpbssd on the "avx512+amx" path. 0 without AVX2.
double MeasureIntPeakGops(ThreadPool& pool, bool int8);

}  // namespace pdq
