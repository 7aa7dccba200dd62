// Hash maps for the BPE's hot loop (private to tokenizer/): every word of a text is looked up in
// the word cache (and, with ignore_merges, the vocabulary), and every pair of a new word in the
// merges. std::unordered_map spends most of that time chasing nodes; these keep their slots in one
// array (open addressing, linear probing, at most half full) and string keys in one arena, so a
// lookup is a hash and, usually, one cache line. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace strata::tokenizer {

template <typename Value>
class FlatStringMap {
 public:
  const Value* Find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    const uint64_t hash = XXH3_64bits(key.data(), key.size());
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key_length == kEmpty) return nullptr;
      if (s.hash == hash && s.key_length == key.size() &&
          std::memcmp(keys_.data() + s.key_offset, key.data(), key.size()) == 0) {
        return &s.value;
      }
    }
  }

  // Adds `key`, or gives it the new value if it is there.
  void Insert(std::string_view key, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(slots_.empty() ? 64 : slots_.size() * 2);
    const uint64_t hash = XXH3_64bits(key.data(), key.size());
    size_t i = hash & mask_;
    for (;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key_length == kEmpty) break;
      if (s.hash == hash && s.key_length == key.size() &&
          std::memcmp(keys_.data() + s.key_offset, key.data(), key.size()) == 0) {
        s.value = value;
        return;
      }
    }
    slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size()), value};
    keys_.append(key);
    ++size_;
  }

  size_t size() const { return size_; }
  size_t key_bytes() const { return keys_.size(); }
  void Clear() {
    for (Slot& s : slots_) s.key_length = kEmpty;
    keys_.clear();
    size_ = 0;
  }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t key_length = kEmpty;
    Value value{};
  };

  void Rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.key_length == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].key_length != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string keys_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

// Keys are two 32-bit ids (a merge's pair); 0xFFFFFFFF is never an id.
template <typename Value>
class FlatPairMap {
 public:
  const Value* Find(uint32_t left, uint32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = Key(left, right);
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

  // Adds the pair, or gives it the new value if it is there.
  void Insert(uint32_t left, uint32_t right, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(slots_.empty() ? 64 : slots_.size() * 2);
    const uint64_t key = Key(left, right);
    size_t i = Slot(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == kEmpty) ++size_;
    slots_[i] = {key, value};
  }
  void Reserve(size_t n) {
    size_t capacity = 64;
    while (capacity < 2 * n) capacity *= 2;
    if (capacity > slots_.size()) Rehash(capacity);
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Entry {
    uint64_t key = kEmpty;
    Value value{};
  };
  static uint64_t Key(uint32_t left, uint32_t right) { return (static_cast<uint64_t>(left) << 32) | right; }
  // Fibonacci hashing: the multiply spreads both ids over the high bits, which pick the slot.
  size_t Slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  void Rehash(size_t capacity) {
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(capacity, Entry{});
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
    for (const Entry& e : old) {
      if (e.key == kEmpty) continue;
      size_t i = Slot(e.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = e;
    }
  }

  std::vector<Entry> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
  unsigned shift_ = 64;
};

}  // namespace strata::tokenizer
