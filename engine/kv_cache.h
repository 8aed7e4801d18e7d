// Paged KV cache: fixed-size blocks of FP16 keys and values shared by all
// sequences, a block table per sequence, and an allocator whose free-block
// count is observable. Its layout and dtype never depend on the precision of
// the weights that write or read it, so a cache written by an FP16 or W8A8
// prefill worker can be continued by a W4A16 decode worker.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace pdq {

struct KvCacheConfig {
  int num_layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;
  int64_t num_blocks = 0;
};

using SeqId = int64_t;

class KvCache {
 public:
  // Allocates num_blocks blocks for every layer. ResourceExhausted when the
  // memory cannot be had; InvalidArgument for a malformed config.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheConfig& config);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return config_; }
  int64_t num_free_blocks() const { return (int64_t)free_.size(); }
  // Bytes of K plus V for one block in one layer.
  int64_t block_bytes() const;

  // A new empty sequence.
  SeqId AddSequence();
  bool HasSequence(SeqId seq) const { return seqs_.contains(seq); }
  // Returns the sequence's blocks to the pool. Unknown ids are ignored.
  void RemoveSequence(SeqId seq);

  // Makes room for `tokens` tokens in total. On ResourceExhausted nothing
  // changed. NotFound for an unknown sequence.
  absl::Status Reserve(SeqId seq, int64_t tokens);
  // Tokens whose K/V are stored.
  int64_t Length(SeqId seq) const;
  // Marks `length` tokens as stored (at most the reserved capacity).
  void SetLength(SeqId seq, int64_t length);
  const std::vector<int32_t>& BlockTable(SeqId seq) const;

  // The storage of one layer, for kernels and for KV transfer.
  KvLayerView Layer(int layer) const;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t length = 0;
  };
  explicit KvCache(const KvCacheConfig& config) : config_(config) {}

  KvCacheConfig config_;
  std::vector<fp16_t*> k_, v_;  // per layer, aligned allocations
  std::vector<int32_t> free_;   // free block ids (a stack)
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 1;
};

}  // namespace pdq
