// CPUID/XGETBV probing; the OS must enable the register state (XCR0) for a
// vector ISA to count as available.
#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
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
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vnni = c & (1u << 11);
  }
  // AMX: the CPU has the tiles and int8 products, XCR0 enables their state
  // (bits 17 and 18), and Linux grants this process the tile data
  // (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18).
  const bool amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25), amx_bf16 = d & (1u << 22);
  if (amx_tile && (amx_int8 || amx_bf16) && (xcr0 & 0x60000) == 0x60000) {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    f.amx_int8 = granted && amx_int8;
    f.amx_bf16 = granted && amx_bf16;
  }
  unsigned a1, b1, c1, d1;
  if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
    f.avxvnni = ymm_ok && (a1 & (1u << 4));
    f.avx512bf16 = zmm_ok && (a1 & (1u << 5));
  }
  if (const char* force = std::getenv("PDQ_ISA")) {
    if (std::strcmp(force, "scalar") == 0) f = CpuFeatures{};
    // The table names ("avx2+vnni", "avx512+amx") are accepted as well.
    if (std::strcmp(force, "avx2+vnni") == 0) force = "avxvnni";
    if (std::strcmp(force, "avx2") == 0 || std::strcmp(force, "avxvnni") == 0) {
      f.avx512f = f.avx512dq = f.avx512bw = f.avx512vl = f.avx512vnni = f.avx512bf16 = false;
      f.amx_int8 = f.amx_bf16 = false;
      if (std::strcmp(force, "avx2") == 0) f.avxvnni = false;
    }
    if (std::strcmp(force, "avx512") == 0) f.amx_int8 = f.amx_bf16 = false;
    const bool known = std::strcmp(force, "scalar") == 0 || std::strcmp(force, "avx2") == 0 ||
                       std::strcmp(force, "avxvnni") == 0 || std::strcmp(force, "avx512") == 0 ||
                       std::strcmp(force, "amx") == 0 ||
                       std::strcmp(force, "avx512+amx") == 0 || *force == '\0';
    if (!known) {
      std::fprintf(stderr,
                   "pdq: PDQ_ISA=%s is not one of scalar, avx2, avxvnni, avx512, amx; using every "
                   "path the CPU has\n",
                   force);
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
  if (f.avx2 && f.avx512_kernels()) return f.amx_kernels() ? "avx512+amx" : "avx512";
  if (f.avx2 && f.avxvnni) return "avx2+vnni";
  if (f.avx2) return "avx2";
  return "scalar";
}

std::string MissingCpuFlags(const std::string& isa) {
  const CpuFeatures& f = GetCpuFeatures();
  std::string missing;
  auto need = [&](bool have, const char* flag) {
    if (!have) missing += (missing.empty() ? "" : " ") + std::string(flag);
  };
  if (isa == "avx2" || isa == "avx2+vnni" || isa == "avx512" || isa == "avx512+amx") {
    need(f.avx2, "avx2/fma/f16c");
  }
  if (isa == "avx2+vnni") need(f.avxvnni, "avx_vnni");
  if (isa == "avx512" || isa == "avx512+amx") {
    need(f.avx512f, "avx512f");
    need(f.avx512dq, "avx512dq");
    need(f.avx512bw, "avx512bw");
    need(f.avx512vl, "avx512vl");
    need(f.avx512vnni, "avx512_vnni");
  }
  if (isa == "avx512+amx") {
    need(f.amx_int8, "amx_int8 (with the OS's tile permission)");
    need(f.amx_bf16, "amx_bf16 (with the OS's tile permission)");
    need(f.avx512bf16, "avx512_bf16");
  }
  return missing;
}

}  // namespace pdq
