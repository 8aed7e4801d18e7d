// Paged KV cache: fixed-size blocks of FP16 keys and values shared by all
// sequences, a block table per sequence, and an allocator whose free-block
// count is observable. Whole blocks can outlive their sequence as a prefix
// cache: identified by a chained hash of their tokens (common/prefix_hash.h),
// shared by reference count between sequences, and evicted least recently
// used first when a reservation needs the memory. Its layout (engine/kv_layout.h) never depends on the
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
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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
  // Test hook: ANDed into every block hash of the prefix index, so a test
  // can force collisions (0: every block collides). The stored tokens and
  // parent decide a match, never the hash alone.
  uint64_t prefix_hash_mask = ~0ull;
};

// What the prefix cache did, since the cache was made.
struct PrefixCacheStats {
  int64_t cached_blocks = 0;     // blocks in the index now (in use or not)
  int64_t evictable_blocks = 0;  // of those, held by no sequence
  int64_t evictions = 0;
};

// Changes to the set of cached block hashes, for a router that routes by
// them (unmasked hashes, as PrefixBlockHashes computes them): the net
// change since the last report, so `stored` and `removed` never share a
// hash and may be applied in either order.
struct PrefixEvents {
  std::vector<uint64_t> stored, removed;
  // Events were dropped (more than the log holds): start again from
  // CachedHashes().
  bool overflowed = false;
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
  // Blocks a reservation can have: unused ones and cached ones no sequence
  // holds (evicted on demand). After every sequence is removed this equals
  // num_blocks().
  int64_t num_free_blocks() const { return (int64_t)free_.size() + lru_size_; }
  // Bytes of K plus V for one block in one layer.
  int64_t block_bytes() const { return config_.layout.block_bytes(); }
  // "host" or the device memory the blocks live in, and what allocated it.
  std::string memory() const;
  const std::shared_ptr<KvAllocator>& allocator() const { return config_.allocator; }
  bool host_accessible() const;

  // A new empty sequence.
  SeqId AddSequence();
  bool HasSequence(SeqId seq) const { return seqs_.contains(seq); }
  // Drops the sequence's hold on its blocks: unshared blocks return to the
  // pool, cached ones stay cached until evicted. NotFound for an unknown id
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

  // ---- Prefix cache ----
  // The seed of a request's block hashes: this cache's layout and `salt`.
  uint64_t PrefixSeed(std::string_view salt) const;
  // Appends to an empty sequence the longest run of cached whole blocks
  // that hold tokens[0, n), n at most max_tokens, and sets its length to n;
  // returns n (a multiple of block_tokens; 0 on a miss). The blocks are
  // shared, never written again: the sequence continues in blocks of its
  // own. With `writer` set, only blocks that writer wrote count (the run
  // stops at the first another precision wrote). FailedPrecondition for a
  // sequence that is not empty, NotFound for an unknown one.
  absl::StatusOr<int64_t> AttachPrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t seed,
                                       int64_t max_tokens, std::string_view writer = {});
  // Offers the sequence's stored whole blocks holding tokens[0, n) (n at
  // most its length) to the index, so later sequences with the same prefix
  // and seed reuse them. Blocks already cached keep their writer; new ones
  // record `writer` (the precision whose forward pass wrote them: "fp16",
  // "w8a8", "w4a16"). A block whose prefix another block written by the same
  // writer already holds stays private; one written by another precision
  // is cached beside it (a W8A8 prefill's copy of a W4A16-written answer).
  // Returns how many blocks it added.
  absl::StatusOr<int64_t> CachePrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t seed,
                                      std::string_view writer);
  // The writer recorded for a block of a sequence's table ("" if the block
  // was never cached).
  std::string_view BlockWriter(int32_t block) const;
  PrefixCacheStats prefix_stats() const;
  // Turns on the event log (off by default) and returns what changed since
  // the last call.
  PrefixEvents TakePrefixEvents();
  // Every hash in the index now (for a full resynchronisation).
  std::vector<uint64_t> CachedHashes() const;

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
  // sequence with room for `tokens` tokens (0: none yet) and length 0 (ResourceExhausted
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
  // Per block: who holds it and, while it is in the prefix index, what it
  // holds.
  struct BlockMeta {
    int32_t refs = 0;
    bool cached = false;
    uint64_t hash = 0;        // unmasked chain hash
    int32_t parent = -1;      // the previous block of the prefix; -1: first
    uint32_t parent_gen = 0;  // its generation when this block was cached
    uint32_t gen = 0;         // bumps each time the block leaves the index
    uint8_t writer = 0;       // index into writers_
    int32_t lru_prev = -1, lru_next = -1;  // while cached and unreferenced
  };
  explicit KvCache(const KvCacheConfig& config) : config_(config) {}
  // Drops one hold on a block: unreferenced, it goes to the eviction list
  // (cached) or the free stack.
  void Unref(int32_t block);
  // A block for a reservation: a free one, else the least recently used
  // cached one, evicted. Callers have checked num_free_blocks().
  int32_t TakeBlock();
  void LruRemove(int32_t block);
  void LruPushBack(int32_t block);
  void Uncache(int32_t block);
  // The cached block holding `tokens` after `parent` (generation
  // parent_gen), written by `writer` (empty: any), or -1.
  int32_t FindCached(uint64_t hash, int32_t parent, uint32_t parent_gen,
                     std::span<const int32_t> tokens, std::string_view writer) const;
  // Whether a cached block other than `except` has this (unmasked) hash.
  bool HashCached(uint64_t hash, int32_t except) const;
  void LogEvent(bool stored, uint64_t hash);
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
  std::vector<BlockMeta> meta_;
  std::vector<int32_t> block_tokens_;  // the ids a cached block holds
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> index_;  // masked hash -> blocks
  std::vector<std::string> writers_ = {""};
  int32_t lru_head_ = -1, lru_tail_ = -1;  // head: evicted first
  int64_t lru_size_ = 0, cached_ = 0, evictions_ = 0;
  bool log_events_ = false;
  absl::flat_hash_set<uint64_t> stored_since_, removed_since_;  // the net change
  bool events_overflowed_ = false;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 1;
};

}  // namespace pdq
