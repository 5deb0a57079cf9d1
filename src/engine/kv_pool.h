// Paged KV cache bookkeeping: a pool of fixed-size blocks of positions with reference counts, and
// per-sequence block tables. Sequences share a prefix by holding the same blocks; the first write
// into a shared block copies it (copy-on-write). Running out of blocks is an ordinary outcome
// (`reserve` returns false and changes nothing): the caller waits, preempts or refuses.
// The KV bytes themselves live in the backend; this class only decides which block is whose.
//
// Prefix cache: a full block whose token ids are known can be offered to the cache under a key
// that hashes its tokens chained with the keys of the blocks before it, so the key names the whole
// prefix. A block nobody holds any more stays cached (and counts as free) until the pool needs it:
// then the least recently released cached block is reused. A new sequence whose first tokens match
// cached blocks takes those blocks instead of computing them again.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace minfer {

class KvPool {
 public:
  KvPool(int n_blocks, int block_size);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int n_blocks() const { return int(ref_.size()); }
  int block_size() const { return block_size_; }
  // Blocks a reserve can take: never used, or cached with no holder (evicted when taken).
  int n_free() const { return int(free_.size() + evictable_.size()); }
  int n_used() const { return n_blocks() - n_free(); }  // held by sequences
  int n_cached() const { return int(evictable_.size()); }  // cached prefixes no sequence holds
  int ref_count(int32_t block) const { return ref_[size_t(block)]; }

  // A sequence's KV: the blocks holding its positions [0, n_tokens). Move-only; it gives its
  // blocks back when destroyed, so it must not outlive its pool.
  class Sequence {
   public:
    Sequence() = default;
    explicit Sequence(KvPool& pool) : pool_(&pool) {}
    Sequence(Sequence&& o) noexcept { *this = std::move(o); }
    Sequence& operator=(Sequence&& o) noexcept;
    Sequence(const Sequence&) = delete;
    Sequence& operator=(const Sequence&) = delete;
    ~Sequence() { release(); }

    int n_tokens() const { return n_tokens_; }
    std::span<const int32_t> blocks() const { return blocks_; }
    // Blocks `reserve(n_new)` would take from the pool (new blocks plus a copy-on-write).
    int blocks_needed(int n_new) const;
    // Makes room for positions [n_tokens, n_tokens + n_new): allocates blocks and, when the block
    // that position n_tokens falls in is shared, gives this sequence a private copy (appended to
    // `copies` for the backend to execute before the step). Returns false, changing nothing, when
    // the pool has too few free blocks.
    bool reserve(int n_new, std::vector<BlockCopy>& copies);
    // The reserved positions now hold KV (called after the step that wrote them).
    void advance(int n) { n_tokens_ += n; }
    // A new sequence sharing this one's first n positions (blocks retained, nothing copied).
    Sequence fork(int n) const;
    // Keeps positions [0, n); blocks past them go back to the pool (or to their other owners).
    void truncate(int n);
    void release() { truncate(0); }

    // Prefix cache. On an empty sequence: takes the cached blocks that hold the longest run of
    // whole blocks starting `tokens`, covering at most max_positions positions; returns the
    // positions now held (a multiple of the block size).
    int attach_cached_prefix(std::span<const int32_t> tokens, int max_positions);
    // Offers this sequence's full blocks among positions [0, tokens.size()) to the cache;
    // tokens[i] is the token at position i (tokens.size() <= n_tokens).
    void cache_full_blocks(std::span<const int32_t> tokens);

   private:
    KvPool* pool_ = nullptr;
    std::vector<int32_t> blocks_;
    int n_tokens_ = 0;
    // Prefix keys of the leading blocks whose tokens are known (taken from or offered to the cache).
    std::vector<uint64_t> keys_;
  };

 private:
  int32_t allocate();
  void retain(int32_t block);
  void unref(int32_t block);
  void uncache(int32_t block);
  static uint64_t prefix_key(uint64_t previous, std::span<const int32_t> block_tokens);

  int block_size_;
  std::vector<int> ref_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::unordered_map<uint64_t, int32_t> cache_;  // prefix key -> the block holding it
  std::vector<uint64_t> key_;                    // per block: its key while cached
  std::vector<uint8_t> cached_;                  // per block: in cache_
  std::list<int32_t> evictable_;                 // cached, no holder; least recently released first
  std::vector<std::list<int32_t>::iterator> evictable_at_;  // per block, valid while evictable
};

}  // namespace minfer
