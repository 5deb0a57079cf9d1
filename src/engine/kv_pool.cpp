#include "engine/kv_pool.h"

#include "util/error.h"

namespace minfer {

KvPool::KvPool(int n_blocks, int block_size) : block_size_(block_size) {
  if (n_blocks <= 0 || block_size <= 0)
    fail("KV pool: ", n_blocks, " blocks of ", block_size, " positions (both must be positive)");
  ref_.assign(size_t(n_blocks), 0);
  free_.reserve(size_t(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t KvPool::allocate() {
  const int32_t b = free_.back();
  free_.pop_back();
  ref_[size_t(b)] = 1;
  return b;
}

void KvPool::unref(int32_t block) {
  if (--ref_[size_t(block)] == 0) free_.push_back(block);
}

KvPool::Sequence& KvPool::Sequence::operator=(Sequence&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    blocks_ = std::move(o.blocks_);
    n_tokens_ = o.n_tokens_;
    o.blocks_.clear();
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
  if (n_new > 0 && first < int(blocks_.size()) && pool_->ref_count(blocks_[size_t(first)]) > 1) {
    const int32_t shared = blocks_[size_t(first)];
    const int32_t mine = pool_->allocate();
    copies.push_back({shared, mine});
    pool_->unref(shared);
    blocks_[size_t(first)] = mine;
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
  n_tokens_ = n;
}

}  // namespace minfer
