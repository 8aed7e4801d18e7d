// Host-side repacking of 4-bit weights into the GPU layout of w4a16.h.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/w4a16.h"

namespace pdq::cuda {
namespace {

// Byte offset and nibble (0 low, 1 high) of weight (row, input).
struct NibbleAt {
  int64_t byte;
  int shift;
};
NibbleAt Locate(int64_t k, int64_t row, int64_t input) {
  const int64_t tile = row / kW4TileRows, chunk = input / kW4ChunkInputs;
  const int in_tile = (int)(row % kW4TileRows);
  const int step = (int)(input % kW4ChunkInputs) / 16, o = (int)(input % 16);
  const int g = in_tile % 8, t = (o % 8) / 2, e = o % 2;
  const int i = (in_tile / 8) | ((o / 8) << 1);
  const int p = i + 4 * e;
  const int lane = 4 * g + t;
  const int64_t byte = ((tile * GpuW4Chunks(k) + chunk) * 32 + lane) * 16 + step * 4 + p / 2;
  return {byte, (p % 2) * 4};
}

}  // namespace

absl::Status RepackW4ForGpu(const PackedW4& w, uint8_t* q, uint32_t* scale_min) {
  if (w.n <= 0 || w.k <= 0 || w.k % 16 != 0 || w.group <= 0 || w.group % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU W4 weights need k and the group size to be multiples of 16; got ", w.n,
                     "x", w.k, " in groups of ", w.group));
  }
  std::memset(q, 0, GpuW4QBytes(w.n, w.k));
  std::memset(scale_min, 0, GpuW4ScaleMinBytes(w.n, w.k, w.group));
  const int64_t groups = PackedW4Groups(w.k, w.group);
  for (int64_t row = 0; row < w.n; ++row) {
    const int64_t panel = row / kPanelRows;
    const int j = (int)(row % kPanelRows);
    const uint8_t* panel_q = w.q + panel * (w.k / 2) * kPanelRows;
    for (int64_t input = 0; input < w.k; ++input) {
      const NibbleAt at = Locate(w.k, row, input);
      q[at.byte] |= (uint8_t)(PackedW4Code(panel_q, input, j) << at.shift);
    }
    // Both layouts keep [16-row tile][group][row in tile].
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t idx = (panel * groups + g) * kPanelRows + j;
      scale_min[idx] = (uint32_t)w.scale[idx] | ((uint32_t)w.min[idx] << 16);
    }
  }
  return absl::OkStatus();
}

int GpuW4Code(const uint8_t* q, int64_t k, int64_t row, int64_t input) {
  const NibbleAt at = Locate(k, row, input);
  return (q[at.byte] >> at.shift) & 0xf;
}

}  // namespace pdq::cuda
