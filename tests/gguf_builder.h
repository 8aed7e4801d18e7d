// Builds GGUF images in memory for tests and the fuzzer's seed corpus.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace pdq::testing {

class GgufBuilder {
 public:
  void AddString(const std::string& key, const std::string& value) {
    Key(key, 8);
    Str(value);
    ++kv_count_;
  }
  void AddU32(const std::string& key, uint32_t value) {
    Key(key, 4);
    Pod(kv_, value);
    ++kv_count_;
  }
  void AddF32(const std::string& key, float value) {
    Key(key, 6);
    Pod(kv_, value);
    ++kv_count_;
  }
  void AddBool(const std::string& key, bool value) {
    Key(key, 7);
    Pod(kv_, (uint8_t)value);
    ++kv_count_;
  }
  void AddStringArray(const std::string& key, const std::vector<std::string>& values) {
    Key(key, 9);
    Pod(kv_, (uint32_t)8);
    Pod(kv_, (uint64_t)values.size());
    for (const auto& v : values) Str(v);
    ++kv_count_;
  }
  void AddI32Array(const std::string& key, const std::vector<int32_t>& values) {
    Key(key, 9);
    Pod(kv_, (uint32_t)5);
    Pod(kv_, (uint64_t)values.size());
    for (int32_t v : values) Pod(kv_, v);
    ++kv_count_;
  }
  void AddF32Array(const std::string& key, const std::vector<float>& values) {
    Key(key, 9);
    Pod(kv_, (uint32_t)6);
    Pod(kv_, (uint64_t)values.size());
    for (float v : values) Pod(kv_, v);
    ++kv_count_;
  }
  // `data` holds the tensor's bytes in its ggml type; dims[0] is contiguous.
  void AddTensor(const std::string& name, uint32_t type, const std::vector<uint64_t>& dims,
                 const std::string& data) {
    PodStr(tensors_, name);
    Pod(tensors_, (uint32_t)dims.size());
    for (uint64_t d : dims) Pod(tensors_, d);
    Pod(tensors_, type);
    while (data_.size() % 32 != 0) data_.push_back(0);
    Pod(tensors_, (uint64_t)data_.size());
    data_ += data;
    ++tensor_count_;
  }

  std::string Build(uint32_t version = 3) const {
    std::string out;
    Pod(out, (uint32_t)0x46554747);
    Pod(out, version);
    Pod(out, tensor_count_);
    Pod(out, kv_count_);
    out += kv_;
    out += tensors_;
    while (out.size() % 32 != 0) out.push_back(0);
    out += data_;
    return out;
  }

 private:
  template <typename T>
  static void Pod(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void PodStr(std::string& s, const std::string& v) {
    Pod(s, (uint64_t)v.size());
    s += v;
  }
  void Key(const std::string& key, uint32_t type) {
    PodStr(kv_, key);
    Pod(kv_, type);
  }
  void Str(const std::string& v) { PodStr(kv_, v); }

  std::string kv_, tensors_, data_;
  uint64_t kv_count_ = 0, tensor_count_ = 0;
};

}  // namespace pdq::testing
