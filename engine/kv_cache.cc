// Block pool, per-sequence block tables, and export/import of a sequence's
// blocks for KV transfer.
#include "engine/kv_cache.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/prefix_hash.h"

namespace pdq {
namespace {

class HostKvAllocator final : public KvAllocator {
 public:
  void* Allocate(size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void Free(void* p) override { std::free(p); }
  std::string name() const override { return "host"; }
  bool host_accessible() const override { return true; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheConfig& config) {
  const KvLayout& l = config.layout;
  if (l.num_layers <= 0 || l.kv_heads <= 0 || l.head_dim <= 0 || l.block_tokens <= 0 ||
      config.num_blocks <= 0 || config.num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad KV cache config: layers=", l.num_layers, " kv_heads=", l.kv_heads,
        " head_dim=", l.head_dim, " block_tokens=", l.block_tokens, " blocks=", config.num_blocks));
  }
  KvCacheConfig with_memory = config;
  if (with_memory.allocator == nullptr) {
    static const auto* host = new std::shared_ptr<KvAllocator>(std::make_shared<HostKvAllocator>());
    with_memory.allocator = *host;
  }
  std::unique_ptr<KvCache> cache(new KvCache(with_memory));
  const size_t bytes = (size_t)config.num_blocks * l.block_elements() * sizeof(fp16_t);
  const size_t rounded = (bytes + 63) / 64 * 64;
  cache->region_bytes_ = (int64_t)bytes;
  for (int i = 0; i < l.num_layers; ++i) {
    for (auto* list : {&cache->k_, &cache->v_}) {
      void* p = cache->config_.allocator->Allocate(rounded);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", 2 * rounded * l.num_layers / (1 << 20), " MiB of KV cache in ",
            cache->config_.allocator->name(), " memory; use fewer blocks"));
      }
      list->push_back(static_cast<fp16_t*>(p));
    }
  }
  cache->meta_.resize(config.num_blocks);
  cache->block_tokens_.resize((size_t)config.num_blocks * l.block_tokens);
  cache->free_.reserve(config.num_blocks);
  for (int64_t b = config.num_blocks - 1; b >= 0; --b) cache->free_.push_back((int32_t)b);
  return cache;
}

KvCache::~KvCache() {
  for (fp16_t* p : k_) config_.allocator->Free(p);
  for (fp16_t* p : v_) config_.allocator->Free(p);
}

std::string KvCache::memory() const { return config_.allocator->name(); }
bool KvCache::host_accessible() const { return config_.allocator->host_accessible(); }

absl::Status KvCache::CheckHostAccessible() const {
  if (host_accessible()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this KV cache lives in ", memory(),
                   " memory, which the host KV transports cannot move (a device transport is "
                   "not built yet)"));
}

SeqId KvCache::AddSequence() {
  const SeqId id = next_id_++;
  seqs_[id] = Sequence{};
  return id;
}

absl::StatusOr<const KvCache::Sequence*> KvCache::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  return &it->second;
}

absl::Status KvCache::RemoveSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  // Last block first, so that a prefix outlives its tails in the eviction
  // order (the tail is the least likely to be shared).
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) Unref(*b);
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::Status KvCache::Reserve(SeqId seq, int64_t tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  Sequence& s = it->second;
  const int64_t bt = config_.layout.block_tokens;
  const int64_t need = (tokens + bt - 1) / bt;
  const int64_t more = need - (int64_t)s.blocks.size();
  if (more <= 0) return absl::OkStatus();
  if (more > num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: ", tokens, " tokens need ", more, " more blocks of ", bt,
        " tokens but only ", num_free_blocks(), " of ", config_.num_blocks, " are free"));
  }
  const size_t first = s.blocks.size();
  for (int64_t i = 0; i < more; ++i) s.blocks.push_back(TakeBlock());
  // New blocks hold nothing yet, so their order is free: ascending ids, so
  // that a run the free stack or the LRU hands back (the LRU returns a freed
  // sequence's blocks last first) is consecutive in the pool again, and a
  // decode row reading the sequence streams it (kernels_bench
  // BM_AttendDecodeFromMemory: 21 GB/s ascending, 7 descending).
  std::sort(s.blocks.begin() + first, s.blocks.end());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCache::Length(SeqId seq) const {
  PDQ_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return s->length;
}

absl::StatusOr<int64_t> KvCache::Capacity(SeqId seq) const {
  PDQ_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return (int64_t)s->blocks.size() * config_.layout.block_tokens;
}

absl::Status KvCache::SetLength(SeqId seq, int64_t length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  const int64_t capacity = (int64_t)it->second.blocks.size() * config_.layout.block_tokens;
  if (length < 0 || length > capacity) {
    return absl::OutOfRangeError(absl::StrCat("length ", length, " of KV sequence ", seq,
                                              " outside its capacity [0, ", capacity, "]"));
  }
  it->second.length = length;
  return absl::OkStatus();
}

absl::StatusOr<std::span<const int32_t>> KvCache::BlockTable(SeqId seq) const {
  PDQ_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return std::span<const int32_t>(s->blocks);
}

KvLayerView KvCache::Layer(int layer) const {
  PDQ_CHECK(layer >= 0 && layer < config_.layout.num_layers);
  const KvLayout& l = config_.layout;
  return KvLayerView{k_[layer],  v_[layer],      l.kv_heads,
                     l.head_dim, l.block_tokens, l.dtype == KvDtype::kBf16};
}

std::vector<KvRegion> KvCache::MemoryRegions() const {
  std::vector<KvRegion> out;
  for (size_t l = 0; l < k_.size(); ++l) {
    out.push_back({reinterpret_cast<std::byte*>(k_[l]), region_bytes_});
    out.push_back({reinterpret_cast<std::byte*>(v_[l]), region_bytes_});
  }
  return out;
}

std::byte* KvCache::SpanData(const KvSpan& span) const {
  PDQ_CHECK(host_accessible());  // spans of device caches are never handed out
  PDQ_CHECK(span.region >= 0 && span.region < 2 * config_.layout.num_layers);
  PDQ_CHECK(span.offset >= 0 && span.offset + span.bytes <= region_bytes_);
  fp16_t* base = span.region % 2 == 0 ? k_[span.region / 2] : v_[span.region / 2];
  return reinterpret_cast<std::byte*>(base) + span.offset;
}

absl::StatusOr<std::vector<KvSpan>> KvCache::Spans(const Sequence& s, int layer,
                                                   int64_t blocks) const {
  PDQ_RETURN_IF_ERROR(CheckHostAccessible());
  if (layer < 0 || layer >= config_.layout.num_layers) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " outside [0, ", config_.layout.num_layers, ")"));
  }
  const int64_t block_half = config_.layout.block_elements() * (int64_t)sizeof(fp16_t);
  std::vector<KvSpan> out;
  out.reserve(2 * blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t offset = (int64_t)s.blocks[i] * block_half;
    out.push_back({2 * layer, offset, block_half});
    out.push_back({2 * layer + 1, offset, block_half});
  }
  return out;
}

absl::StatusOr<std::vector<KvSpan>> KvCache::ExportLayer(SeqId seq, int layer) const {
  PDQ_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  const int64_t bt = config_.layout.block_tokens;
  return Spans(*s, layer, (s->length + bt - 1) / bt);
}

absl::StatusOr<SeqId> KvCache::ImportSequence(const KvLayout& sender, int64_t tokens) {
  PDQ_RETURN_IF_ERROR(CheckKvCompatible(config_.layout, sender));
  PDQ_RETURN_IF_ERROR(CheckHostAccessible());
  if (tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot import ", tokens, " tokens"));
  }
  const SeqId seq = AddSequence();
  if (absl::Status s = Reserve(seq, tokens); !s.ok()) {
    PDQ_CHECK(RemoveSequence(seq).ok());
    return s;
  }
  return seq;
}

absl::StatusOr<std::vector<KvSpan>> KvCache::LayerSpans(SeqId seq, int layer,
                                                         int64_t tokens) const {
  PDQ_RETURN_IF_ERROR(CheckHostAccessible());
  PDQ_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  const int64_t bt = config_.layout.block_tokens;
  const int64_t blocks = (tokens + bt - 1) / bt;
  if (tokens < 0 || blocks > (int64_t)s->blocks.size()) {
    return absl::OutOfRangeError(absl::StrCat("KV sequence ", seq, " has room for ",
                                              s->blocks.size() * bt, " tokens, not ", tokens));
  }
  return Spans(*s, layer, blocks);
}

// ---- Prefix cache -------------------------------------------------------------

void KvCache::Unref(int32_t block) {
  BlockMeta& m = meta_[block];
  PDQ_CHECK(m.refs > 0);
  if (--m.refs > 0) return;
  if (m.cached) {
    LruPushBack(block);
  } else {
    free_.push_back(block);
  }
}

int32_t KvCache::TakeBlock() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    PDQ_CHECK(lru_head_ >= 0);
    b = lru_head_;
    LruRemove(b);
    Uncache(b);
    ++evictions_;
  }
  meta_[b].refs = 1;
  return b;
}

void KvCache::LruRemove(int32_t block) {
  BlockMeta& m = meta_[block];
  (m.lru_prev >= 0 ? meta_[m.lru_prev].lru_next : lru_head_) = m.lru_next;
  (m.lru_next >= 0 ? meta_[m.lru_next].lru_prev : lru_tail_) = m.lru_prev;
  m.lru_prev = m.lru_next = -1;
  --lru_size_;
}

void KvCache::LruPushBack(int32_t block) {
  BlockMeta& m = meta_[block];
  m.lru_prev = lru_tail_;
  m.lru_next = -1;
  (lru_tail_ >= 0 ? meta_[lru_tail_].lru_next : lru_head_) = block;
  lru_tail_ = block;
  ++lru_size_;
}

void KvCache::Uncache(int32_t block) {
  BlockMeta& m = meta_[block];
  PDQ_CHECK(m.cached);
  auto it = index_.find(m.hash & config_.prefix_hash_mask);
  PDQ_CHECK(it != index_.end());
  std::erase(it->second, block);
  if (it->second.empty()) index_.erase(it);
  if (!HashCached(m.hash, block)) LogEvent(false, m.hash);
  m.cached = false;
  m.writer = 0;
  ++m.gen;
  --cached_;
}

void KvCache::LogEvent(bool stored, uint64_t hash) {
  if (!log_events_ || events_overflowed_) return;
  // A hash stored and removed again (or the reverse) since the last report
  // is no change.
  absl::flat_hash_set<uint64_t>& add = stored ? stored_since_ : removed_since_;
  absl::flat_hash_set<uint64_t>& cancel = stored ? removed_since_ : stored_since_;
  if (cancel.erase(hash) > 0) return;
  constexpr size_t kMaxEvents = 1 << 16;
  if (add.size() >= kMaxEvents) {
    events_overflowed_ = true;
    stored_since_.clear();
    removed_since_.clear();
    return;
  }
  add.insert(hash);
}

bool KvCache::HashCached(uint64_t hash, int32_t except) const {
  auto it = index_.find(hash & config_.prefix_hash_mask);
  if (it == index_.end()) return false;
  for (int32_t b : it->second) {
    if (b != except && meta_[b].hash == hash) return true;
  }
  return false;
}

uint64_t KvCache::PrefixSeed(std::string_view salt) const {
  return pdq::PrefixSeed(config_.layout.Serialize(), salt);
}

int32_t KvCache::FindCached(uint64_t hash, int32_t parent, uint32_t parent_gen,
                            std::span<const int32_t> tokens, std::string_view writer) const {
  auto it = index_.find(hash & config_.prefix_hash_mask);
  if (it == index_.end()) return -1;
  const int64_t bt = config_.layout.block_tokens;
  for (int32_t b : it->second) {
    const BlockMeta& m = meta_[b];
    if (m.hash != hash || m.parent != parent || (parent >= 0 && m.parent_gen != parent_gen) ||
        (!writer.empty() && writers_[m.writer] != writer)) {
      continue;
    }
    if (std::equal(tokens.begin(), tokens.end(), block_tokens_.begin() + (int64_t)b * bt)) return b;
  }
  return -1;
}

absl::StatusOr<int64_t> KvCache::AttachPrefix(SeqId seq, std::span<const int32_t> tokens,
                                              uint64_t seed, int64_t max_tokens,
                                              std::string_view writer) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  Sequence& s = it->second;
  if (!s.blocks.empty() || s.length != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV sequence ", seq, " is not empty; a prefix attaches only to a new one"));
  }
  const int64_t bt = config_.layout.block_tokens;
  const int64_t limit = std::min<int64_t>(max_tokens, (int64_t)tokens.size()) / bt;
  uint64_t h = seed;
  int32_t parent = -1;
  for (int64_t i = 0; i < limit; ++i) {
    std::span<const int32_t> block = tokens.subspan(i * bt, bt);
    h = ChainBlockHash(h, block);
    const int32_t b = FindCached(h, parent, parent >= 0 ? meta_[parent].gen : 0, block, writer);
    if (b < 0) break;
    if (meta_[b].refs++ == 0) LruRemove(b);
    s.blocks.push_back(b);
    parent = b;
  }
  s.length = (int64_t)s.blocks.size() * bt;
  return s.length;
}

absl::StatusOr<int64_t> KvCache::CachePrefix(SeqId seq, std::span<const int32_t> tokens,
                                             uint64_t seed, std::string_view writer) {
  PDQ_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  const int64_t bt = config_.layout.block_tokens;
  const int64_t n = std::min<int64_t>(s->length, (int64_t)tokens.size()) / bt;
  uint8_t writer_id = 0;
  for (; writer_id < writers_.size() && writers_[writer_id] != writer; ++writer_id) {
  }
  if (writer_id == writers_.size()) {
    if (writers_.size() == 255) return absl::ResourceExhaustedError("too many KV writer names");
    writers_.emplace_back(writer);
  }
  uint64_t h = seed;
  int32_t parent = -1;
  int64_t added = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::span<const int32_t> block = tokens.subspan(i * bt, bt);
    h = ChainBlockHash(h, block);
    const int32_t mine = s->blocks[i];
    const uint32_t parent_gen = parent >= 0 ? meta_[parent].gen : 0;
    BlockMeta& m = meta_[mine];
    if (m.cached) {
      if (m.hash == h && m.parent == parent && m.parent_gen == parent_gen) {
        parent = mine;  // cached already, as this prefix
        continue;
      }
      // Cached behind a block that has since left the index (or another
      // copy of its parent): file it again behind this chain.
      Uncache(mine);
    }
    const int32_t other = FindCached(h, parent, parent_gen, block, writer);
    if (other >= 0) {
      // Another sequence cached this prefix first: the chain continues
      // through its block, and later blocks of this sequence can only be
      // found behind it.
      parent = other;
      continue;
    }
    const bool first_copy = !HashCached(h, mine);
    m.cached = true;
    m.hash = h;
    m.parent = parent;
    m.parent_gen = parent_gen;
    m.writer = writer_id;
    std::copy(block.begin(), block.end(), block_tokens_.begin() + (int64_t)mine * bt);
    index_[h & config_.prefix_hash_mask].push_back(mine);
    if (first_copy) LogEvent(true, h);  // the router tracks hashes, not copies
    ++cached_;
    ++added;
    parent = mine;
  }
  return added;
}

std::string_view KvCache::BlockWriter(int32_t block) const {
  PDQ_CHECK(block >= 0 && block < (int32_t)meta_.size());
  return writers_[meta_[block].writer];
}

PrefixCacheStats KvCache::prefix_stats() const {
  return PrefixCacheStats{cached_, lru_size_, evictions_};
}

PrefixEvents KvCache::TakePrefixEvents() {
  log_events_ = true;
  PrefixEvents out;
  out.stored.assign(stored_since_.begin(), stored_since_.end());
  out.removed.assign(removed_since_.begin(), removed_since_.end());
  out.overflowed = events_overflowed_;
  stored_since_.clear();
  removed_since_.clear();
  events_overflowed_ = false;
  return out;
}

std::vector<uint64_t> KvCache::CachedHashes() const {
  std::vector<uint64_t> out;
  out.reserve(cached_);
  for (const BlockMeta& m : meta_) {
    if (m.cached) out.push_back(m.hash);
  }
  std::sort(out.begin(), out.end());  // a hash once, however many copies hold it
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace pdq
