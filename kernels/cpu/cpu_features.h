// Run-time x86 feature detection for kernel dispatch.
#pragma once

#include <string>

namespace pdq {

struct CpuFeatures {
  bool avx2 = false;  // with FMA and F16C, as every AVX2 CPU pdq targets has
  bool avx512f = false;
  bool avx512dq = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;
  // AMX tiles with int8 dot products, enabled by the OS for this process
  // (Linux grants the tile state on request: arch_prctl ARCH_REQ_XCOMP_PERM).
  bool amx_int8 = false;
  bool amx_bf16 = false;  // and bf16 products (every AMX CPU so far has both)
  // The AVX-512 kernel table's requirements: F, DQ, BW, VL and VNNI (Ice
  // Lake, Zen 4 and later). Skylake-X, which lacks VNNI, runs the AVX2 path.
  bool avx512_kernels() const {
    return avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  }
  // The AMX table's: int8 and bf16 tiles, and AVX-512 BF16 conversions.
  bool amx_kernels() const { return avx512_kernels() && amx_int8 && amx_bf16 && avx512bf16; }
};

// Detected once; honours PDQ_ISA=scalar|avx2|avxvnni|avx512|amx to force a
// lower path ("avx2": without AVX-VNNI either; "avxvnni": AVX2 with AVX-VNNI's
// 256-bit integer products; "avx512": the AVX-512 kernels without AMX tiles;
// "amx": everything the CPU has, the default).
const CpuFeatures& GetCpuFeatures();

// The kernel table dispatch uses: "avx512+amx", "avx512", "avx2+vnni",
// "avx2" or "scalar".
std::string KernelIsaName();

// What a forced or missing path lacks, for messages: the CPU flags (as
// /proc/cpuinfo names them) that `isa` needs and this process does not have;
// empty when it has them all.
std::string MissingCpuFlags(const std::string& isa);

}  // namespace pdq
