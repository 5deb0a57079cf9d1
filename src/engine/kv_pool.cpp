#include "engine/kv_pool.h"

#include <algorithm>

#include "util/error.h"

namespace minfer {

KvPool::KvPool(int n_blocks, int block_size) : block_size_(block_size) {
  if (n_blocks <= 0 || block_size <= 0)
    fail("KV pool: ", n_blocks, " blocks of ", block_size, " positions (both must be positive)");
  ref_.assign(size_t(n_blocks), 0);
  key_.assign(size_t(n_blocks), 0);
  cached_.assign(size_t(n_blocks), 0);
  evictable_at_.resize(size_t(n_blocks));
  free_.reserve(size_t(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

// 64 bits over the whole prefix: a false match needs a collision, as in vLLM's block hashes.
uint64_t KvPool::prefix_key(uint64_t previous, std::span<const int32_t> block_tokens) {
  uint64_t h = splitmix64(previous);
  for (const int32_t t : block_tokens) h = splitmix64(h ^ uint32_t(t));
  return h;
}

int32_t KvPool::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {  // the least recently released cached block
    b = evictable_.front();
    evictable_.pop_front();
    cache_.erase(key_[size_t(b)]);
    cached_[size_t(b)] = 0;
  }
  ref_[size_t(b)] = 1;
  return b;
}

void KvPool::retain(int32_t block) {
  if (ref_[size_t(block)]++ == 0) evictable_.erase(evictable_at_[size_t(block)]);  // only cached blocks are retained at 0
}

void KvPool::unref(int32_t block) {
  if (--ref_[size_t(block)] > 0) return;
  if (cached_[size_t(block)]) {
    evictable_.push_back(block);
    evictable_at_[size_t(block)] = std::prev(evictable_.end());
  } else {
    free_.push_back(block);
  }
}

// A held block about to be overwritten no longer holds the prefix its key names.
void KvPool::uncache(int32_t block) {
  cache_.erase(key_[size_t(block)]);
  cached_[size_t(block)] = 0;
}

KvPool::Sequence& KvPool::Sequence::operator=(Sequence&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    blocks_ = std::move(o.blocks_);
    keys_ = std::move(o.keys_);
    n_tokens_ = o.n_tokens_;
    o.blocks_.clear();
    o.keys_.clear();
    o.n_tokens_ = 0;
  }
  return *this;
}

int KvPool::Sequence::blocks_needed(int n_new) const {
  const int bs = pool_->block_size_;
  const int have = int(blocks_.size());
  const int want = (n_tokens_ + n_new + bs - 1) / bs;
  int needed = want > have ? want - have : 0;
  // The block position n_tokens falls in gets written: shared, it is copied first.
  const int first = n_tokens_ / bs;
  if (n_new > 0 && first < have && pool_->ref_count(blocks_[size_t(first)]) > 1) ++needed;
  return needed;
}

bool KvPool::Sequence::reserve(int n_new, std::vector<BlockCopy>& copies) {
  if (n_new < 0) fail("KV pool: reserve of ", n_new, " positions");
  if (!pool_) fail("KV pool: a sequence without a pool");
  if (blocks_needed(n_new) > pool_->n_free()) return false;
  const int bs = pool_->block_size_;
  const int first = n_tokens_ / bs;
  if (n_new > 0 && first < int(blocks_.size())) {
    const int32_t written = blocks_[size_t(first)];
    if (pool_->ref_count(written) > 1) {
      const int32_t mine = pool_->allocate();
      copies.push_back({written, mine});
      pool_->unref(written);
      blocks_[size_t(first)] = mine;
    } else if (pool_->cached_[size_t(written)]) {
      pool_->uncache(written);
    }
  }
  while (int(blocks_.size()) * bs < n_tokens_ + n_new) blocks_.push_back(pool_->allocate());
  return true;
}

KvPool::Sequence KvPool::Sequence::fork(int n) const {
  if (n < 0 || n > n_tokens_) fail("KV pool: fork of ", n, " positions from a sequence of ", n_tokens_);
  Sequence s(*pool_);
  const int n_blocks = (n + pool_->block_size_ - 1) / pool_->block_size_;
  for (int i = 0; i < n_blocks; ++i) {
    pool_->retain(blocks_[size_t(i)]);
    s.blocks_.push_back(blocks_[size_t(i)]);
  }
  s.keys_.assign(keys_.begin(), keys_.begin() + std::min<ptrdiff_t>(ptrdiff_t(keys_.size()), n / pool_->block_size_));
  s.n_tokens_ = n;
  return s;
}

void KvPool::Sequence::truncate(int n) {
  if (n < 0 || n > n_tokens_) fail("KV pool: truncate to ", n, " positions of a sequence of ", n_tokens_);
  if (!pool_) return;
  const size_t keep = size_t((n + pool_->block_size_ - 1) / pool_->block_size_);
  while (blocks_.size() > keep) {
    pool_->unref(blocks_.back());
    blocks_.pop_back();
  }
  keys_.resize(std::min(keys_.size(), size_t(n / pool_->block_size_)));
  n_tokens_ = n;
}

int KvPool::Sequence::attach_cached_prefix(std::span<const int32_t> tokens, int max_positions) {
  if (!pool_) fail("KV pool: a sequence without a pool");
  if (n_tokens_ != 0 || !blocks_.empty()) fail("KV pool: a cached prefix is attached to an empty sequence only");
  const size_t bs = size_t(pool_->block_size_);
  const size_t limit = std::min(tokens.size(), size_t(std::max(max_positions, 0)));
  uint64_t key = 0;
  while ((blocks_.size() + 1) * bs <= limit) {
    key = prefix_key(key, tokens.subspan(blocks_.size() * bs, bs));
    const auto it = pool_->cache_.find(key);
    if (it == pool_->cache_.end()) break;
    pool_->retain(it->second);
    blocks_.push_back(it->second);
    keys_.push_back(key);
  }
  n_tokens_ = int(blocks_.size() * bs);
  return n_tokens_;
}

void KvPool::Sequence::cache_full_blocks(std::span<const int32_t> tokens) {
  if (int64_t(tokens.size()) > n_tokens_)
    fail("KV pool: ", tokens.size(), " tokens offered to the cache by a sequence of ", n_tokens_);
  const size_t bs = size_t(pool_->block_size_);
  uint64_t key = keys_.empty() ? 0 : keys_.back();
  for (size_t b = keys_.size(); (b + 1) * bs <= tokens.size(); ++b) {
    key = prefix_key(key, tokens.subspan(b * bs, bs));
    keys_.push_back(key);
    const int32_t block = blocks_[b];
    if (!pool_->cached_[size_t(block)] && pool_->cache_.emplace(key, block).second) {
      pool_->key_[size_t(block)] = key;
      pool_->cached_[size_t(block)] = 1;
    }
  }
}

}  // namespace minfer
