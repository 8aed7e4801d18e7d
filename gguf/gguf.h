// GGUF (v2/v3) reader: header, metadata, tensor table, and tensor data mapped
// from the file. Every malformed input is an absl::Status naming the problem.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace pdq {

// ggml tensor types, numbered as in the GGUF specification.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

// Name as llama.cpp prints it ("Q4_K"), or "type(N)" for unknown numbers.
std::string GgmlTypeName(GgmlType type);

// Elements per block and bytes per block; false for types pdq cannot read.
bool GgmlTypeBlockInfo(GgmlType type, int64_t* block_elems, int64_t* block_bytes);

struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;  // dims[0] is the contiguous (row) dimension
  uint64_t offset = 0;        // relative to the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // points into the mapped file

  int64_t num_elements() const;
  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t num_rows() const { return num_elements() / row_length(); }
};

// A metadata value: scalars widen to int64/uint64/double; arrays hold
// homogeneous elements.
struct GgufArray;
using GgufValue = std::variant<uint64_t, int64_t, double, bool, std::string,
                               std::shared_ptr<GgufArray>>;
struct GgufArray {
  uint32_t elem_type = 0;  // GGUF value type id of the elements
  std::vector<GgufValue> items;
};

class GgufFile {
 public:
  // Maps and parses the file. Fails with NotFound, or InvalidArgument naming
  // what is malformed (bad magic, truncated table, tensor past end, ...).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image (copied); for tests and fuzzing.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(std::string_view bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }

  bool Has(std::string_view key) const;
  const GgufValue* Find(std::string_view key) const;
  // Typed accessors: NotFound when absent, InvalidArgument on a type mismatch.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;  // any integer type
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // float or integer
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;
  // Keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;
  // The tensor has been read: hands back the whole pages of the mapping that
  // hold only its bytes, so a model's file does not stay resident while it
  // loads (they are read from the file again if touched). A no-op for an
  // in-memory image.
  void DropPages(const GgufTensor& t) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  // mmap'ed region, or nullptr
  std::string owned_;        // buffer for FromBuffer
  uint32_t version_ = 0;
  std::vector<std::string> keys_;
  absl::flat_hash_map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace pdq
