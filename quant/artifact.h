// Quantized weight artifacts written by `pdq quantize`: a self-describing
// header (scheme, its parameters, a fingerprint of the source model) and the
// packed weights of every linear layer, which workers load without
// re-quantizing. The source model still supplies tokenizer, embeddings and
// norms, and must be the one the artifact was made from.
//
// Layout: "PDQQUANT", u32 version, u64 header length, header JSON, payload.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq {

struct ArtifactTensor {
  std::string name;  // "blk.3.qkv", "output", ...
  int64_t out = 0, in = 0;
  uint64_t offset = 0, bytes = 0;  // within the payload
};

struct ArtifactHeader {
  std::string scheme;  // "w8a8" or "w4a16"
  int group_size = 0;  // w4a16 only
  bool symmetric = false;
  std::vector<std::string> fp16_layers;  // patterns of layers kept FP16
  std::vector<std::string> w8_layers;    // patterns of layers stored W8A16 (absent: none)
  float smooth_alpha = 0.0f;             // W8A8 SmoothQuant strength, 0 if off
  std::string w4_method = "rtn";         // w4a16: rtn, awq, gptq or awq+gptq (absent: rtn)
  std::string calibration;               // what the statistics came from; empty: none
  std::string source_name;
  std::string source_fingerprint;  // see SourceFingerprint
  std::vector<ArtifactTensor> tensors;
};

// A fingerprint of a model spec: a 64-bit hash of the GGUF file's bytes (and
// its size), or of the name for "synthetic:" models. Not cryptographic; it
// tells artifacts of different models apart.
absl::StatusOr<std::string> SourceFingerprint(const std::string& spec);

// Writes header and payload. `payloads[i]` holds header.tensors[i]'s bytes;
// offsets and sizes are filled in.
absl::Status WriteArtifact(const std::string& path, ArtifactHeader header,
                           const std::vector<std::string>& payloads);

struct Artifact {
  ArtifactHeader header;
  std::string bytes;           // the whole file
  size_t payload_offset = 0;   // where the payload starts in `bytes`
  std::string_view payload() const { return std::string_view(bytes).substr(payload_offset); }
};
// Reads and validates an artifact: NotFound for a missing file,
// InvalidArgument naming what is corrupt or unknown (magic, version, header,
// scheme, tensor extents).
absl::StatusOr<Artifact> ReadArtifact(const std::string& path);

}  // namespace pdq
