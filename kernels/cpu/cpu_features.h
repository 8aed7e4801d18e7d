// Run-time x86 feature detection for kernel dispatch.
#pragma once

#include <string>

namespace pdq {

struct CpuFeatures {
  bool avx2 = false;  // with FMA and F16C, as every AVX2 CPU pdq targets has
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;
};

// Detected once; honours PDQ_ISA=scalar|avx2|avx512 to force a lower path.
const CpuFeatures& GetCpuFeatures();

// The instruction set the kernels dispatch to: "avx512", "avx2" or "scalar".
std::string KernelIsaName();

}  // namespace pdq
