// The AMX tile configuration (palette 1) that ldtilecfg reads, shared by the
// AMX GEMM and the roofline probe. Plain data: no AMX instruction here.
#pragma once

#include <cstdint>

namespace pdq::cpu {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64, "ldtilecfg reads 64 bytes");

// Tiles 0-7 all 16 rows of 64 bytes: C tiles of 16 x 16 int32, A tiles of
// 16 rows x 64 int8, B tiles of 16 x 4-input steps x 16 outputs.
inline AmxTileConfig FullAmxTiles() {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

}  // namespace pdq::cpu
