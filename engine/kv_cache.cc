// Block pool and per-sequence block tables for the paged KV cache.
#include "engine/kv_cache.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheConfig& config) {
  if (config.num_layers <= 0 || config.kv_heads <= 0 || config.head_dim <= 0 ||
      config.block_tokens <= 0 || config.num_blocks <= 0 || config.num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad KV cache config: layers=", config.num_layers, " kv_heads=", config.kv_heads,
        " head_dim=", config.head_dim, " block_tokens=", config.block_tokens,
        " blocks=", config.num_blocks));
  }
  std::unique_ptr<KvCache> cache(new KvCache(config));
  const size_t bytes = (size_t)config.num_blocks * config.kv_heads * config.block_tokens *
                       config.head_dim * sizeof(fp16_t);
  const size_t rounded = (bytes + 63) / 64 * 64;
  for (int l = 0; l < config.num_layers; ++l) {
    for (auto* list : {&cache->k_, &cache->v_}) {
      void* p = std::aligned_alloc(64, rounded);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", 2 * rounded * config.num_layers / (1 << 20),
            " MiB of KV cache; use fewer blocks"));
      }
      list->push_back(static_cast<fp16_t*>(p));
    }
  }
  cache->free_.reserve(config.num_blocks);
  for (int64_t b = config.num_blocks - 1; b >= 0; --b) cache->free_.push_back((int32_t)b);
  return cache;
}

KvCache::~KvCache() {
  for (fp16_t* p : k_) std::free(p);
  for (fp16_t* p : v_) std::free(p);
}

int64_t KvCache::block_bytes() const {
  return 2 * (int64_t)config_.kv_heads * config_.block_tokens * config_.head_dim *
         (int64_t)sizeof(fp16_t);
}

SeqId KvCache::AddSequence() {
  const SeqId id = next_id_++;
  seqs_[id] = Sequence{};
  return id;
}

void KvCache::RemoveSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.blocks) free_.push_back(b);
  seqs_.erase(it);
}

absl::Status KvCache::Reserve(SeqId seq, int64_t tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  Sequence& s = it->second;
  const int64_t need = (tokens + config_.block_tokens - 1) / config_.block_tokens;
  const int64_t more = need - (int64_t)s.blocks.size();
  if (more <= 0) return absl::OkStatus();
  if (more > num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: ", tokens, " tokens need ", more, " more blocks of ",
        config_.block_tokens, " tokens but only ", num_free_blocks(), " of ",
        config_.num_blocks, " are free"));
  }
  for (int64_t i = 0; i < more; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

int64_t KvCache::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  PDQ_CHECK(it != seqs_.end());
  return it->second.length;
}

void KvCache::SetLength(SeqId seq, int64_t length) {
  auto it = seqs_.find(seq);
  PDQ_CHECK(it != seqs_.end());
  PDQ_CHECK(length >= 0 && length <= (int64_t)it->second.blocks.size() * config_.block_tokens);
  it->second.length = length;
}

const std::vector<int32_t>& KvCache::BlockTable(SeqId seq) const {
  auto it = seqs_.find(seq);
  PDQ_CHECK(it != seqs_.end());
  return it->second.blocks;
}

KvLayerView KvCache::Layer(int layer) const {
  PDQ_CHECK(layer >= 0 && layer < config_.num_layers);
  return KvLayerView{k_[layer], v_[layer], config_.kv_heads, config_.head_dim,
                     config_.block_tokens};
}

}  // namespace pdq
