// CPUID/XGETBV probing; the OS must enable the register state (XCR0) for a
// vector ISA to count as available.
#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pdq {
namespace {

uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12);
  const bool f16c = c & (1u << 29);
  const bool avx = c & (1u << 28);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool ymm_ok = (xcr0 & 0x6) == 0x6;
  const bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = ymm_ok && fma && f16c && (b & (1u << 5));
  if (zmm_ok) {
    f.avx512f = b & (1u << 16);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vnni = c & (1u << 11);
  }
  unsigned a1, b1, c1, d1;
  if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
    f.avxvnni = ymm_ok && (a1 & (1u << 4));
    f.avx512bf16 = zmm_ok && (a1 & (1u << 5));
  }
  if (const char* force = std::getenv("PDQ_ISA")) {
    if (std::strcmp(force, "scalar") == 0) f = CpuFeatures{};
    if (std::strcmp(force, "avx2") == 0) {
      f.avx512f = f.avx512bw = f.avx512vl = f.avx512vnni = f.avx512bf16 = false;
    }
  }
  return f;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

std::string KernelIsaName() {
  const CpuFeatures& f = GetCpuFeatures();
  // The AVX-512 kernels are not written yet (this project's machines so far
  // have had AVX2 only), so AVX-512 CPUs run the AVX2 path.
  if (f.avx2) return "avx2";
  return "scalar";
}

}  // namespace pdq
