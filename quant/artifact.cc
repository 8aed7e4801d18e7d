// Artifact I/O with every field checked before it is trusted.
#include "quant/artifact.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/hash.h"
#include "gguf/gguf.h"
#include "nlohmann/json.hpp"

namespace pdq {
namespace {

constexpr char kMagic[8] = {'P', 'D', 'Q', 'Q', 'U', 'A', 'N', 'T'};
constexpr uint32_t kVersion = 2;  // 2: W4 nibbles paired for vpmaddwd

}  // namespace

absl::StatusOr<std::string> SourceFingerprint(const std::string& spec) {
  if (spec.rfind("synthetic:", 0) == 0) {
    return absl::StrFormat("name:%016x", Hash64(spec));
  }
  std::ifstream in(spec, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read model file '", spec, "'"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return absl::StrFormat("gguf:%d:%016x", bytes.size(), Hash64(bytes));
}

absl::Status WriteArtifact(const std::string& path, ArtifactHeader header,
                           const std::vector<std::string>& payloads) {
  PDQ_CHECK(payloads.size() == header.tensors.size());
  nlohmann::json j;
  j["scheme"] = header.scheme;
  j["group_size"] = header.group_size;
  j["symmetric"] = header.symmetric;
  j["fp16_layers"] = header.fp16_layers;
  j["w8_layers"] = header.w8_layers;
  j["smooth_alpha"] = header.smooth_alpha;
  j["w4_method"] = header.w4_method;
  j["calibration"] = header.calibration;
  j["source_name"] = header.source_name;
  j["source_fingerprint"] = header.source_fingerprint;
  uint64_t offset = 0;
  for (size_t i = 0; i < payloads.size(); ++i) {
    ArtifactTensor& t = header.tensors[i];
    t.offset = offset;
    t.bytes = payloads[i].size();
    offset += t.bytes;
    j["tensors"].push_back(
        {{"name", t.name}, {"out", t.out}, {"in", t.in}, {"offset", t.offset}, {"bytes", t.bytes}});
  }
  const std::string text = j.dump();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "'"));
  const uint64_t len = text.size();
  out.write(kMagic, 8);
  out.write(reinterpret_cast<const char*>(&kVersion), 4);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), (std::streamsize)text.size());
  for (const std::string& p : payloads) out.write(p.data(), (std::streamsize)p.size());
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

absl::StatusOr<Artifact> ReadArtifact(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read artifact '", path, "'"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto corrupt = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a valid pdq artifact: ", why));
  };
  if (bytes.size() < 20 || std::memcmp(bytes.data(), kMagic, 8) != 0) return corrupt("bad magic");
  uint32_t version;
  uint64_t len;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&len, bytes.data() + 12, 8);
  if (version != kVersion) return corrupt(absl::StrCat("format version ", version, ", this pdq reads version ", kVersion,
                                 " (run pdq quantize again)"));
  if (len > bytes.size() - 20) return corrupt("header runs past the end of the file");
  Artifact a;
  nlohmann::json j = nlohmann::json::parse(bytes.begin() + 20, bytes.begin() + 20 + (int64_t)len,
                                           nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt("header is not a JSON object");
  try {
    ArtifactHeader& h = a.header;
    h.scheme = j.at("scheme").get<std::string>();
    h.group_size = j.at("group_size").get<int>();
    h.symmetric = j.at("symmetric").get<bool>();
    h.fp16_layers = j.at("fp16_layers").get<std::vector<std::string>>();
    h.w8_layers = j.value("w8_layers", std::vector<std::string>());  // older artifacts: none
    h.smooth_alpha = j.at("smooth_alpha").get<float>();
    h.w4_method = j.value("w4_method", std::string("rtn"));  // older artifacts: RTN
    h.calibration = j.value("calibration", std::string());
    h.source_name = j.at("source_name").get<std::string>();
    h.source_fingerprint = j.at("source_fingerprint").get<std::string>();
    for (const auto& t : j.at("tensors")) {
      h.tensors.push_back({t.at("name").get<std::string>(), t.at("out").get<int64_t>(),
                           t.at("in").get<int64_t>(), t.at("offset").get<uint64_t>(),
                           t.at("bytes").get<uint64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(absl::StrCat("header field missing or mistyped (", e.what(), ")"));
  }
  if (a.header.scheme != "w8a8" && a.header.scheme != "w4a16") {
    return corrupt(absl::StrCat("unknown scheme '", a.header.scheme, "'"));
  }
  a.payload_offset = 20 + len;
  a.bytes = std::move(bytes);
  const size_t payload_size = a.payload().size();
  for (const ArtifactTensor& t : a.header.tensors) {
    if (t.offset > payload_size || t.bytes > payload_size - t.offset) {
      return corrupt(absl::StrCat("tensor '", t.name, "' runs past the end of the file"));
    }
  }
  return a;
}

}  // namespace pdq
