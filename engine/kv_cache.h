// Paged KV cache: fixed-size blocks of FP16 keys and values shared by all
// sequences, a block table per sequence, and an allocator whose free-block
// count is observable. Its layout (engine/kv_layout.h) never depends on the
// precision of the weights that write or read it, so a cache written by an
// FP16 or W8A8 prefill worker can be continued by a W4A16 decode worker, in
// this process or, through export and import, in another.
//
// Not thread-safe: one owner (a worker's scheduler thread) at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/kv_layout.h"
#include "kernels/kernels.h"

namespace pdq {

// Where a cache's blocks live: host memory unless a device backend (see
// engine/device.h) supplies device memory. Allocate returns null when the
// memory cannot be had.
class KvAllocator {
 public:
  virtual ~KvAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // "host", "cuda:0", ...: for messages.
  virtual std::string name() const = 0;
  // Whether the CPU can read and write the blocks (the host transports need
  // to).
  virtual bool host_accessible() const = 0;
};

struct KvCacheConfig {
  KvLayout layout;
  int64_t num_blocks = 0;
  std::shared_ptr<KvAllocator> allocator = nullptr;  // null: host memory
};

using SeqId = int64_t;

// One contiguous piece of the cache's memory: a region a transport registers
// once (KvCache::MemoryRegions), and spans inside it that it sends or
// receives without copying.
struct KvRegion {
  std::byte* data = nullptr;
  int64_t bytes = 0;
};
struct KvSpan {
  int32_t region = 0;  // index into MemoryRegions()
  int64_t offset = 0;  // bytes from the region's start
  int64_t bytes = 0;
};

class KvCache {
 public:
  // Allocates num_blocks blocks for every layer. ResourceExhausted when the
  // memory cannot be had; InvalidArgument for a malformed config.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheConfig& config);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return config_.layout; }
  int64_t num_blocks() const { return config_.num_blocks; }
  int64_t num_free_blocks() const { return (int64_t)free_.size(); }
  // Bytes of K plus V for one block in one layer.
  int64_t block_bytes() const { return config_.layout.block_bytes(); }
  // "host" or the device memory the blocks live in, and what allocated it.
  std::string memory() const;
  const std::shared_ptr<KvAllocator>& allocator() const { return config_.allocator; }
  bool host_accessible() const;

  // A new empty sequence.
  SeqId AddSequence();
  bool HasSequence(SeqId seq) const { return seqs_.contains(seq); }
  // Returns the sequence's blocks to the pool. NotFound for an unknown id
  // (nothing changes).
  absl::Status RemoveSequence(SeqId seq);

  // Makes room for `tokens` tokens in total. On ResourceExhausted nothing
  // changed. NotFound for an unknown sequence.
  absl::Status Reserve(SeqId seq, int64_t tokens);
  // Tokens whose K/V are stored. NotFound for an unknown sequence.
  absl::StatusOr<int64_t> Length(SeqId seq) const;
  // Marks `length` tokens as stored. NotFound for an unknown sequence,
  // OutOfRange beyond the reserved capacity.
  absl::Status SetLength(SeqId seq, int64_t length);
  // Tokens the sequence's blocks can hold. NotFound for an unknown sequence.
  absl::StatusOr<int64_t> Capacity(SeqId seq) const;
  // The sequence's block ids in position order; valid until the next call
  // that changes this sequence. NotFound for an unknown sequence.
  absl::StatusOr<std::span<const int32_t>> BlockTable(SeqId seq) const;

  // The storage of one layer, for kernels.
  KvLayerView Layer(int layer) const;

  // ---- Moving a sequence to another cache or process ----
  // Every byte of KV lives in 2 * num_layers regions: layer l's keys are
  // region 2l, its values region 2l + 1. A transport registers them once.
  // The host transports move host memory only: for a cache in device
  // memory, ExportLayer, ImportSequence and LayerSpans fail with
  // FailedPrecondition (a device transport is not built yet).
  // Host addresses only where host_accessible(); a device cache's regions
  // are device pointers, for a device transport.
  std::vector<KvRegion> MemoryRegions() const;
  std::byte* SpanData(const KvSpan& span) const;

  // The spans holding layer `layer` of the sequence's stored tokens: for
  // each block in position order, its K span then its V span (the last
  // block whole, though partly filled). NotFound / OutOfRange for a bad id
  // or layer.
  absl::StatusOr<std::vector<KvSpan>> ExportLayer(SeqId seq, int layer) const;
  // Receiving side: checks that blocks laid out as `sender` can be read
  // here (FailedPrecondition naming the field otherwise), then creates a
  // sequence with room for `tokens` tokens and length 0 (ResourceExhausted
  // when the blocks cannot be had; nothing changes).
  absl::StatusOr<SeqId> ImportSequence(const KvLayout& sender, int64_t tokens);
  // Where layer `layer` of the sequence's first `tokens` tokens lives, in
  // ExportLayer's order, whether or not they are stored yet: the receiver
  // of an imported sequence writes them (and, when every layer has landed,
  // SetLength makes the tokens visible); a sender reads them as soon as a
  // forward pass has written that layer (Context::SetLayerObserver).
  absl::StatusOr<std::vector<KvSpan>> LayerSpans(SeqId seq, int layer, int64_t tokens) const;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t length = 0;
  };
  explicit KvCache(const KvCacheConfig& config) : config_(config) {}
  absl::StatusOr<const Sequence*> Find(SeqId seq) const;
  // FailedPrecondition unless the CPU can read the blocks.
  absl::Status CheckHostAccessible() const;
  // K and V spans of layer `layer` for the first `blocks` blocks of `s`;
  // OutOfRange for a layer the cache does not have.
  absl::StatusOr<std::vector<KvSpan>> Spans(const Sequence& s, int layer, int64_t blocks) const;

  KvCacheConfig config_;
  std::vector<fp16_t*> k_, v_;  // per layer, aligned allocations
  int64_t region_bytes_ = 0;    // bytes of each of them
  std::vector<int32_t> free_;   // free block ids (a stack)
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 1;
};

}  // namespace pdq
