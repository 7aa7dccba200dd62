// Tests of ShardStore against a real RocksDB in a fresh temporary directory per test: round
// trips, key order, commit semantics, validation, reopen, damaged records (bytes edited through
// the raw RocksDB API) and a writer SIGKILLed mid-checkpoint in a real child process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "storage/data_files.h"
#include "storage/shard_store.h"
#include "storage/wal_tail.h"

extern char** environ;

namespace strata::storage {
namespace {

// ---- helpers ----------------------------------------------------------------------------------

// Deterministic pseudo-random bytes (splitmix64), so a child process can write what the parent
// expects to read back.
std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x += 0x9e3779b97f4a7c15ULL;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      x ^= z ^ (z >> 31);
    }
    out[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
  }
  return out;
}

struct TestTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  TensorView View() const { return TensorView{dtype, shape, bytes}; }
};

TestTensor MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  std::vector<uint8_t> bytes = Pattern(numel * DTypeSize(dtype), seed);
  return TestTensor{std::move(name), dtype, std::move(shape), std::move(bytes)};
}

std::vector<int64_t> Steps(const std::vector<CheckpointInfo>& infos) {
  std::vector<int64_t> steps;
  for (const CheckpointInfo& info : infos) steps.push_back(info.step);
  return steps;
}

// The raw RocksDB under a closed store, with the column families of the documented layout.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const char* name : {"default", "checkpoints", "activations", "metadata"}) {
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    }
    rocksdb::DB* db = nullptr;
    status_ = rocksdb::DB::Open(rocksdb::DBOptions(), path, families, &handles_, &db);
    db_.reset(db);
  }
  ~RawDb() {
    if (!db_) return;
    for (auto* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
    (void)db_->Close();
  }
  const rocksdb::Status& status() const { return status_; }
  rocksdb::DB* db() { return db_.get(); }
  rocksdb::ColumnFamilyHandle* checkpoints() { return handles_[1]; }

  std::string Get(const std::string& key) {
    std::string value;
    EXPECT_TRUE(db_->Get(rocksdb::ReadOptions(), checkpoints(), key, &value).ok()) << "no raw key";
    return value;
  }
  void Put(const std::string& key, const std::string& value) {
    ASSERT_TRUE(db_->Put(rocksdb::WriteOptions(), checkpoints(), key, value).ok());
  }
  int CountWithPrefix(const std::string& prefix) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints()));
    int n = 0;
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) ++n;
    return n;
  }

 private:
  rocksdb::Status status_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

// Raw keys, spelled out from the layout in shard_store.h rather than taken from the store.
std::string RawTensorKey(const std::string& run, int64_t step, const std::string& name) {
  return "t" + EncodeKeyString(run) + EncodeKeyU64(step) + EncodeKeyString(name);
}
std::string RawManifestKey(const std::string& run, int64_t step) {
  return "m" + EncodeKeyString(run) + EncodeKeyU64(step);
}

class ShardStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/strata_storage_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr) << std::strerror(errno);
    dir_ = dir;
    path_ = dir_ + "/store";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Null (and a recorded failure) if the store does not open.
  std::unique_ptr<ShardStore> OpenStore(const StoreOptions& options = {}) {
    Result<std::unique_ptr<ShardStore>> store = ShardStore::Open(path_, options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  void PutAll(ShardStore& store, const std::string& run, int64_t step, const std::vector<TestTensor>& tensors) {
    for (const TestTensor& t : tensors) {
      Status s = store.PutCheckpointTensor(run, step, t.name, t.View());
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  void ExpectReadsBack(ShardStore& store, const std::string& run, int64_t step, const TestTensor& t) {
    Result<Tensor> read = store.ReadCheckpointTensor(run, step, t.name);
    ASSERT_TRUE(read.ok()) << t.name << ": " << read.status().ToString();
    EXPECT_EQ(read->dtype, t.dtype) << t.name;
    EXPECT_EQ(read->shape, t.shape) << t.name;
    EXPECT_EQ(read->bytes, t.bytes) << t.name;
    EXPECT_EQ(read->checksum, Checksum(t.bytes)) << t.name;
  }

  void ExpectCode(const Status& s, StatusCode code, const std::string& mentions = "") {
    EXPECT_EQ(s.code(), code) << s.ToString();
    if (!mentions.empty()) {
      EXPECT_NE(s.message().find(mentions), std::string::npos) << s.ToString();
    }
  }

  // The store's checkpoint data files (STORE/checkpoints/<run>/*.bin).
  std::vector<std::string> DataFiles() const {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path_ + "/checkpoints", ec)) {
      if (entry.path().extension() == ".bin") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  std::string dir_;
  std::string path_;
};

// ---- tests ------------------------------------------------------------------------------------

TEST(KeysTest, EncodingIsLengthPrefixedAndBigEndian) {
  EXPECT_EQ(EncodeKeyString("ab"), std::string("\0\0\0\2ab", 6));
  EXPECT_EQ(EncodeKeyString(""), std::string("\0\0\0\0", 4));
  EXPECT_EQ(EncodeKeyU64(0x0102030405060708ULL), "\x01\x02\x03\x04\x05\x06\x07\x08");
  EXPECT_LT(EncodeKeyU64(2), EncodeKeyU64(10));
  EXPECT_LT(EncodeKeyU64(255), EncodeKeyU64(256));
  // "a" + anything never starts with the encoding of "ab", and vice versa.
  EXPECT_NE(EncodeKeyString("ab").rfind(EncodeKeyString("a"), 0), 0u);
}

TEST_F(ShardStoreTest, RoundTripsDtypesAndShapesBitIdentical) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<TestTensor> tensors = {
      MakeTensor("attn.wq", DType::kF32, {2, 3}, 1),
      MakeTensor("attn.wk", DType::kBF16, {4, 1, 8}, 2),
      MakeTensor("embed", DType::kF16, {300, 128}, 3),  // 76.8 KB: a data file
      MakeTensor("lr", DType::kF64, {}, 4),             // scalar
      MakeTensor("step", DType::kI64, {5}, 5),
      MakeTensor("ids", DType::kI32, {7, 9}, 6),
      MakeTensor("mask", DType::kU8, {0, 4}, 7),  // zero elements
      MakeTensor("hist", DType::kU16, {33}, 8),
  };
  PutAll(*store, "run-1", 100, tensors);
  ASSERT_TRUE(store->CommitCheckpoint("run-1", 100).ok());

  Result<std::vector<CheckpointInfo>> list = store->ListCheckpoints("run-1");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 1u);
  const CheckpointInfo& info = (*list)[0];
  EXPECT_EQ(info.run, "run-1");
  EXPECT_EQ(info.step, 100);
  ASSERT_EQ(info.tensors.size(), tensors.size());
  for (size_t i = 1; i < info.tensors.size(); ++i) EXPECT_LT(info.tensors[i - 1].name, info.tensors[i].name);
  for (const TestTensor& t : tensors) {
    auto entry = std::find_if(info.tensors.begin(), info.tensors.end(),
                              [&](const CheckpointTensorInfo& e) { return e.name == t.name; });
    ASSERT_NE(entry, info.tensors.end()) << t.name;
    EXPECT_EQ(entry->dtype, t.dtype);
    EXPECT_EQ(entry->shape, t.shape);
    EXPECT_EQ(entry->checksum, Checksum(t.bytes));
    EXPECT_EQ(entry->size_bytes, t.bytes.size());
    ExpectReadsBack(*store, "run-1", 100, t);
  }
  ExpectCode(store->ReadCheckpointTensor("run-1", 100, "absent").status(), StatusCode::kNotFound, "absent");
}

TEST_F(ShardStoreTest, StepsSortNumericallyAndRunPrefixesDoNotBleed) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (int64_t step : {10, 2, 1, 256}) {
    PutAll(*store, "a", step, {MakeTensor("w", DType::kF32, {4}, step)});
    ASSERT_TRUE(store->CommitCheckpoint("a", step).ok());
  }
  // Same step in run "ab": staged before "a" step 3 commits, must not join it.
  PutAll(*store, "ab", 3, {MakeTensor("x", DType::kF32, {4}, 30)});
  PutAll(*store, "a", 3, {MakeTensor("y", DType::kF32, {4}, 31)});
  ASSERT_TRUE(store->CommitCheckpoint("a", 3).ok());
  ASSERT_TRUE(store->CommitCheckpoint("ab", 3).ok());

  Result<std::vector<CheckpointInfo>> a = store->ListCheckpoints("a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(Steps(*a), (std::vector<int64_t>{1, 2, 3, 10, 256}));
  ASSERT_EQ((*a)[2].tensors.size(), 1u);
  EXPECT_EQ((*a)[2].tensors[0].name, "y");

  Result<std::vector<CheckpointInfo>> ab = store->ListCheckpoints("ab");
  ASSERT_TRUE(ab.ok()) << ab.status().ToString();
  EXPECT_EQ(Steps(*ab), (std::vector<int64_t>{3}));
  ASSERT_EQ((*ab)[0].tensors.size(), 1u);
  EXPECT_EQ((*ab)[0].tensors[0].name, "x");

  Result<std::vector<CheckpointInfo>> none = store->ListCheckpoints("b");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  ExpectCode(store->ReadCheckpointTensor("ab", 10, "w").status(), StatusCode::kNotFound);
  ExpectCode(store->ReadCheckpointTensor("a", 3, "x").status(), StatusCode::kNotFound);
  ExpectReadsBack(*store, "ab", 3, MakeTensor("x", DType::kF32, {4}, 30));
  ExpectReadsBack(*store, "a", 10, MakeTensor("w", DType::kF32, {4}, 10));
}

TEST_F(ShardStoreTest, StagedCheckpointIsInvisibleUntilCommitted) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const TestTensor t = MakeTensor("w", DType::kF32, {8, 8}, 1);
  PutAll(*store, "r", 5, {t});

  Result<std::vector<CheckpointInfo>> list = store->ListCheckpoints("r");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  Result<std::optional<CheckpointInfo>> one = store->GetCheckpoint("r", 5);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_FALSE(one->has_value());
  ExpectCode(store->ReadCheckpointTensor("r", 5, "w").status(), StatusCode::kNotFound);

  ASSERT_TRUE(store->CommitCheckpoint("r", 5).ok());
  list = store->ListCheckpoints("r");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(Steps(*list), (std::vector<int64_t>{5}));
  one = store->GetCheckpoint("r", 5);
  ASSERT_TRUE(one.ok() && one->has_value()) << one.status().ToString();
  EXPECT_EQ((*one)->step, 5);
  ASSERT_EQ((*one)->tensors.size(), 1u);
  EXPECT_EQ((*one)->tensors[0].name, "w");
  EXPECT_EQ((*one)->tensors[0].checksum, Checksum(t.bytes));
  one = store->GetCheckpoint("r", 6);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->has_value());
  ExpectReadsBack(*store, "r", 5, t);
}

TEST_F(ShardStoreTest, CommitTwiceIsAlreadyExistsAndCommittedIsImmutable) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectCode(store->CommitCheckpoint("r", 1), StatusCode::kInvalidArgument, "no tensors are staged");
  const TestTensor t = MakeTensor("w", DType::kF32, {4}, 1);
  PutAll(*store, "r", 1, {t});
  ASSERT_TRUE(store->CommitCheckpoint("r", 1).ok());
  ExpectCode(store->CommitCheckpoint("r", 1), StatusCode::kAlreadyExists, "already committed");
  ExpectCode(store->PutCheckpointTensor("r", 1, "w", MakeTensor("w", DType::kF32, {4}, 2).View()),
             StatusCode::kAlreadyExists, "'w'");
  ExpectReadsBack(*store, "r", 1, t);
  ExpectCode(store->PutCheckpointTensor("r", -1, "w", t.View()), StatusCode::kInvalidArgument, "negative");
  ExpectCode(store->PutCheckpointTensor("", 1, "w", t.View()), StatusCode::kInvalidArgument);
}

TEST_F(ShardStoreTest, RejectsMalformedTensorsNamingThem) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> bytes(10);
  Status short_bytes = store->PutCheckpointTensor("r", 1, "layers.0.w", {DType::kF32, {2, 2}, bytes});
  ExpectCode(short_bytes, StatusCode::kInvalidArgument, "'layers.0.w'");
  EXPECT_NE(short_bytes.message().find("needs 16 bytes but 10"), std::string::npos) << short_bytes.ToString();
  ExpectCode(store->PutCheckpointTensor("r", 1, "layers.1.w", {DType::kU8, {-2, -5}, bytes}),
             StatusCode::kInvalidArgument, "'layers.1.w'");
  ExpectCode(store->PutCheckpointTensor("r", 1, "layers.2.w", {static_cast<DType>(99), {10}, bytes}),
             StatusCode::kInvalidArgument, "'layers.2.w'");
  // Nothing was staged.
  ExpectCode(store->CommitCheckpoint("r", 1), StatusCode::kInvalidArgument);
}

TEST_F(ShardStoreTest, ReopenKeepsEverything) {
  const std::vector<TestTensor> step1 = {MakeTensor("big", DType::kF32, {200, 200}, 1),  // 160 KB: a data file
                                         MakeTensor("small", DType::kBF16, {16}, 2)};
  const TestTensor staged = MakeTensor("later", DType::kI64, {3}, 3);
  const std::vector<uint8_t> meta = {1, 2, 3};
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    PutAll(*store, "r", 1, step1);
    ASSERT_TRUE(store->CommitCheckpoint("r", 1).ok());
    PutAll(*store, "r", 2, {staged});
    ASSERT_TRUE(store->PutMetadata("runs/r", meta).ok());
  }
  auto store = OpenStore({.create_if_missing = false});
  ASSERT_NE(store, nullptr);
  Result<std::vector<CheckpointInfo>> list = store->ListCheckpoints("r");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(Steps(*list), (std::vector<int64_t>{1}));
  for (const TestTensor& t : step1) ExpectReadsBack(*store, "r", 1, t);
  Result<std::optional<std::vector<uint8_t>>> got = store->GetMetadata("runs/r");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, meta);
  // Staged tensors survive a reopen and can still be committed.
  ASSERT_TRUE(store->CommitCheckpoint("r", 2).ok());
  ExpectReadsBack(*store, "r", 2, staged);

  // The big tensor's bytes are in a checkpoint data file, not in RocksDB.
  EXPECT_EQ(DataFiles().size(), 1u);
}

TEST_F(ShardStoreTest, OpenFailuresNameThePathAndTheFix) {
  ExpectCode(ShardStore::Open(path_, {.create_if_missing = false}).status(), StatusCode::kNotFound, path_);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  Result<std::unique_ptr<ShardStore>> second = ShardStore::Open(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(path_), std::string::npos) << second.status().ToString();
  EXPECT_NE(second.status().message().find("strata down"), std::string::npos) << second.status().ToString();
}

TEST_F(ShardStoreTest, FlippedPayloadByteIsCorruptionNotData) {
  const std::vector<TestTensor> tensors = {MakeTensor("small", DType::kF32, {256}, 1),
                                           MakeTensor("big", DType::kF32, {256, 128}, 2),  // 128 KiB: a data file
                                           MakeTensor("intact", DType::kF32, {64}, 3)};
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    PutAll(*store, "r", 7, tensors);
    ASSERT_TRUE(store->CommitCheckpoint("r", 7).ok());
  }
  {
    // "small" is an inline record: one bit of its raw bytes in RocksDB.
    RawDb raw(path_);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    std::string value = raw.Get(RawTensorKey("r", 7, "small"));
    uint32_t header_length = 0;
    std::memcpy(&header_length, value.data(), 4);  // little-endian host
    size_t payload = 4 + header_length;
    ASSERT_GT(value.size(), payload + 100);
    value[payload + 100] ^= 0x10;
    raw.Put(RawTensorKey("r", 7, "small"), value);
  }
  {
    // "big" is in the data file (its only tensor, at offset 0): one bit of it there.
    ASSERT_EQ(DataFiles().size(), 1u);
    std::fstream file(DataFiles()[0], std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(100);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x10;
    file.seekp(100);
    file.write(&byte, 1);
    ASSERT_TRUE(file.good());
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (const char* name : {"small", "big"}) {
    Result<Tensor> read = store->ReadCheckpointTensor("r", 7, name);
    ASSERT_FALSE(read.ok()) << name << " returned data";
    ExpectCode(read.status(), StatusCode::kCorruption, std::string("'") + name + "'");
    EXPECT_NE(read.status().message().find("checksum"), std::string::npos) << read.status().ToString();
    EXPECT_NE(read.status().message().find(path_), std::string::npos) << read.status().ToString();
  }
  ExpectReadsBack(*store, "r", 7, tensors[2]);
}

// A data file cut short or gone, and references that are damaged or point outside the run's
// directory: Corruption naming the tensor, never data or a crash; the other tensors still read.
TEST_F(ShardStoreTest, DamagedDataFilesAndReferencesAreCorruptionNotData) {
  const std::vector<TestTensor> tensors = {MakeTensor("a", DType::kF32, {128, 128}, 1),
                                           MakeTensor("b", DType::kF32, {128, 128}, 2),
                                           MakeTensor("c", DType::kF32, {128, 128}, 3)};
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    PutAll(*store, "r", 1, tensors);
    ASSERT_TRUE(store->CommitCheckpoint("r", 1).ok());
    PutAll(*store, "r", 2, {tensors[0]});
    ASSERT_TRUE(store->CommitCheckpoint("r", 2).ok());
  }
  const std::vector<std::string> files = DataFiles();
  ASSERT_EQ(files.size(), 2u);
  const std::string step1 = files[0].find("/1-") != std::string::npos ? files[0] : files[1];
  const std::string step2 = step1 == files[0] ? files[1] : files[0];
  std::filesystem::resize_file(step1, 2 * 64 * 1024 + 10);  // "c" (the third 64 KiB) cut short
  std::filesystem::remove(step2);
  {
    RawDb raw(path_);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    std::string ref = raw.Get(RawTensorKey("r", 1, "b"));
    const std::string file_name = std::filesystem::path(step1).filename().string();
    const size_t at = ref.find(file_name);
    ASSERT_NE(at, std::string::npos);
    // The same reference, naming a file outside the run's directory (same name length).
    std::string escaped = ref;
    escaped.replace(at, 3, "../");
    raw.Put(RawTensorKey("r", 1, "b"), escaped);
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectReadsBack(*store, "r", 1, tensors[0]);
  ExpectCode(store->ReadCheckpointTensor("r", 1, "b").status(), StatusCode::kCorruption,
             "reference of checkpoint tensor 'b'");
  ExpectCode(store->ReadCheckpointTensor("r", 1, "c").status(), StatusCode::kCorruption, "shorter");
  ExpectCode(store->ReadCheckpointTensor("r", 2, "a").status(), StatusCode::kCorruption, "cannot be opened");
  std::vector<uint8_t> into(tensors[2].bytes.size());
  ExpectCode(store->ReadCheckpointTensorInto("r", 1, "c", DType::kF32, into), StatusCode::kCorruption, path_);
}

TEST_F(ShardStoreTest, GarbageRecordsAreCorruptionNotCrash) {
  // Tensors t0..t199 of one committed checkpoint, each then overwritten with some damage.
  constexpr int kTensors = 200;
  std::vector<std::string> garbage;  // t[i] for i < garbage.size(): must read as Corruption
  std::vector<std::string> flipped;  // the rest: header bytes flipped; Corruption or the exact data
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < kTensors; ++i) {
      PutAll(*store, "r", 1, {MakeTensor("t" + std::to_string(i), DType::kF32, {16}, i)});
    }
    ASSERT_TRUE(store->CommitCheckpoint("r", 1).ok());
  }
  {
    RawDb raw(path_);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    std::vector<std::string> originals;
    for (int i = 0; i < kTensors; ++i) originals.push_back(raw.Get(RawTensorKey("r", 1, "t" + std::to_string(i))));
    const std::string& original = originals[0];
    uint32_t header_length = 0;
    std::memcpy(&header_length, original.data(), 4);
    const std::string payload = original.substr(4 + header_length);
    auto with_length = [](uint32_t length, std::string rest) {
      std::string out(4, '\0');
      std::memcpy(out.data(), &length, 4);
      return out + rest;
    };
    garbage = {
        "",                                              // empty
        "\x01\x02",                                      // shorter than the length prefix
        with_length(0, std::string(64, '\0')),           // empty header
        with_length(0xfffffff0u, std::string(64, 'x')),  // length past the end
        with_length(12, std::string(80, 'x')),           // not whole words
        with_length(64, std::string(128, '\xff')),       // all ones: absurd segment table
        with_length(16, std::string("\0\0\0\0\x01\0\0\0", 8) + std::string("\xfc\xff\xff\x7f\x01\0\x01\0", 8) +
                            payload),             // struct pointer far out of bounds
        original.substr(0, original.size() - 1),  // payload one byte short
        original + "z",                           // payload one byte long
        originals[1],                             // a valid record, not the manifest's
    };
    for (uint64_t seed = 0; garbage.size() < 100; ++seed) {
      // A valid one-segment table followed by random words, so Cap'n Proto decodes pointers.
      const uint32_t words = 1 + seed % 12;
      std::vector<uint8_t> noise = Pattern(8 * words, 1000 + seed);
      std::string header = std::string(4, '\0') + std::string(reinterpret_cast<const char*>(&words), 4) +
                           std::string(noise.begin(), noise.end());
      garbage.push_back(with_length(header.size(), header + payload));
    }
    for (size_t i = garbage.size(); i < kTensors; ++i) {
      // One to three random bytes of the real header flipped (padding flips may go unnoticed).
      std::string value = originals[i];
      std::vector<uint8_t> r = Pattern(8, 5000 + i);
      for (int k = 0; k <= r[0] % 3; ++k)
        value[4 + r[1 + 2 * k] % header_length] ^= static_cast<char>(r[2 + 2 * k] | 1);
      flipped.push_back(value);
    }
    for (size_t i = 0; i < kTensors; ++i) {
      raw.Put(RawTensorKey("r", 1, "t" + std::to_string(i)),
              i < garbage.size() ? garbage[i] : flipped[i - garbage.size()]);
    }
  }
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    int undetected = 0;
    for (int i = 0; i < kTensors; ++i) {
      const std::string name = "t" + std::to_string(i);
      Result<Tensor> read = store->ReadCheckpointTensor("r", 1, name);
      if (i < static_cast<int>(garbage.size()) || !read.ok()) {
        ExpectCode(read.status(), StatusCode::kCorruption, "'" + name + "'");
      } else {
        ++undetected;  // a flip that changed nothing this build reads: the data must be exact
        EXPECT_EQ(read->bytes, MakeTensor(name, DType::kF32, {16}, i).bytes) << name;
      }
    }
    EXPECT_LT(undetected, kTensors - static_cast<int>(garbage.size())) << "no header flip was detected";
  }
  // A garbage manifest: listing and reading report Corruption too.
  {
    RawDb raw(path_);
    ASSERT_TRUE(raw.status().ok());
    raw.Put(RawManifestKey("r", 1), std::string(64, '\xff'));
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectCode(store->ListCheckpoints("r").status(), StatusCode::kCorruption, path_);
  ExpectCode(store->ReadCheckpointTensor("r", 1, "t0").status(), StatusCode::kCorruption);
}

TEST_F(ShardStoreTest, ConcurrentStagingAndRacingCommits) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 25; ++i) {
        const TestTensor t =
            MakeTensor("w" + std::to_string(w) + "." + std::to_string(i), DType::kF32, {32}, w * 100 + i);
        if (!store->PutCheckpointTensor("r", 1, t.name, t.View()).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  ASSERT_EQ(failures.load(), 0);

  std::atomic<int> committed{0}, already{0};
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&] {
      Status s = store->CommitCheckpoint("r", 1);
      if (s.ok()) ++committed;
      if (s.code() == StatusCode::kAlreadyExists) ++already;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(committed.load(), 1);
  EXPECT_EQ(already.load(), 3);
  Result<std::vector<CheckpointInfo>> list = store->ListCheckpoints("r");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].tensors.size(), 100u);
}

TEST_F(ShardStoreTest, MetadataPutGetScanDelete) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  const std::vector<std::pair<std::string, std::string>> records = {
      {"other", "o"}, {"run/a/2", "a2"}, {"run/ab/1", "ab1"}, {"run/a/1", "a1"}, {"runx", ""}};
  for (const auto& [key, value] : records) ASSERT_TRUE(store->PutMetadata(key, bytes(value)).ok());
  ASSERT_TRUE(store->PutMetadata("run/a/2", bytes("a2-new"), /*sync=*/false).ok());

  Result<std::optional<std::vector<uint8_t>>> got = store->GetMetadata("run/a/2");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, bytes("a2-new"));
  got = store->GetMetadata("runx");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_TRUE((*got)->empty());
  got = store->GetMetadata("run/a");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());

  using Pairs = std::vector<std::pair<std::string, std::vector<uint8_t>>>;
  Result<Pairs> scan = store->ScanMetadata("run/a/");
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(*scan, (Pairs{{"run/a/1", bytes("a1")}, {"run/a/2", bytes("a2-new")}}));
  scan = store->ScanMetadata("");
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->size(), 5u);
  EXPECT_EQ((*scan)[0].first, "other");
  EXPECT_EQ((*scan)[4].first, "runx");

  ASSERT_TRUE(store->DeleteMetadata("run/a/1").ok());
  ASSERT_TRUE(store->DeleteMetadata("never-written").ok());
  got = store->GetMetadata("run/a/1");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  scan = store->ScanMetadata("run/a");
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(*scan, (Pairs{{"run/a/2", bytes("a2-new")}, {"run/ab/1", bytes("ab1")}}));

  // Metadata does not leak into checkpoints.
  Result<std::vector<CheckpointInfo>> list = store->ListCheckpoints("a");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

// ---- crash test -------------------------------------------------------------------------------
//
// The writer is a real child process. fork() happens before this test opens any store, and the
// child then exec()s this same binary, which runs CrashChildMain from a gtest environment hook.
// The exec matters: earlier tests in this process started RocksDB's global background threads,
// which a bare fork() would leave behind (copied state, no threads), so flushes in the child
// would never run.

constexpr const char* kCrashDirEnv = "STRATA_STORAGE_TEST_CRASH_DIR";
constexpr const char* kCrashFdEnv = "STRATA_STORAGE_TEST_CRASH_FD";
constexpr const char* kCrashRun = "crash";

std::vector<TestTensor> CrashStep1Tensors() {
  return {MakeTensor("embed", DType::kF32, {256, 128}, 11),  // 128 KiB: in a data file
          MakeTensor("norm", DType::kBF16, {128}, 12), MakeTensor("step", DType::kI64, {}, 13)};
}

// Commits step 1, then stages step-2 tensors until killed; signals on `fd` once step 2 is underway.
int CrashChildMain(const std::string& path, int fd) {
  Result<std::unique_ptr<ShardStore>> store = ShardStore::Open(path);
  if (!store.ok()) return 2;
  for (const TestTensor& t : CrashStep1Tensors()) {
    if (!(*store)->PutCheckpointTensor(kCrashRun, 1, t.name, t.View()).ok()) return 3;
  }
  if (!(*store)->CommitCheckpoint(kCrashRun, 1).ok()) return 4;
  for (int i = 0; i < 5000; ++i) {  // sizes alternate between inline records and data files
    const TestTensor t = MakeTensor("layer." + std::to_string(i), DType::kF32, {1024 * (1 + i % 40)}, 100 + i);
    if (!(*store)->PutCheckpointTensor(kCrashRun, 2, t.name, t.View()).ok()) return 5;
    if (i == 0 && write(fd, "c", 1) != 1) return 6;
  }
  for (;;) pause();  // the parent kills us; never commit step 2
}

class CrashChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* dir = std::getenv(kCrashDirEnv);
    const char* fd = std::getenv(kCrashFdEnv);
    if (dir != nullptr && fd != nullptr) _exit(CrashChildMain(dir, std::atoi(fd)));
  }
};
[[maybe_unused]] ::testing::Environment* const kCrashChildEnvironment =
    ::testing::AddGlobalTestEnvironment(new CrashChildEnvironment);

TEST_F(ShardStoreTest, WriterKilledMidCheckpointLeavesLastCommitIntact) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  // Everything the child needs is built before fork(): after it, the child only calls exec.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kCrashDirEnv) + "=" + path_);
  env_strings.push_back(std::string(kCrashFdEnv) + "=" + std::to_string(pipe_fds[1]));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string filter =
      "--gtest_filter=" + std::string(::testing::UnitTest::GetInstance()->current_test_suite()->name()) + "." +
      ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string argv0 = "storage_test";
  char* argv[] = {argv0.data(), filter.data(), nullptr};

  pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    close(pipe_fds[0]);
    int devnull = open("/dev/null", O_WRONLY);  // keep gtest's banner out of our output
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  close(pipe_fds[1]);

  pollfd ready{pipe_fds[0], POLLIN, 0};
  char signal_byte = 0;
  ssize_t got = poll(&ready, 1, 60'000) == 1 ? read(pipe_fds[0], &signal_byte, 1) : -1;
  close(pipe_fds[0]);
  if (got == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(child, SIGKILL);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_EQ(got, 1) << "the child did not reach step 2; exit status "
                    << (WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1);
  ASSERT_TRUE(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL) << "the child was not killed mid-write";

  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    Result<std::vector<CheckpointInfo>> list = store->ListCheckpoints(kCrashRun);
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    EXPECT_EQ(Steps(*list), (std::vector<int64_t>{1}));
    for (const TestTensor& t : CrashStep1Tensors()) ExpectReadsBack(*store, kCrashRun, 1, t);
    ExpectCode(store->ReadCheckpointTensor(kCrashRun, 2, "layer.0").status(), StatusCode::kNotFound);
  }
  // The kill really landed mid-checkpoint: step-2 records are on disk, just not visible.
  {
    RawDb raw(path_);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    EXPECT_GE(raw.CountWithPrefix("t" + EncodeKeyString(kCrashRun) + EncodeKeyU64(2)), 2);
  }
  // A new attempt stages step 2 again and commits: what the killed attempt staged (in its own
  // data file) is part of it and reads back, and so does the new attempt's.
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const TestTensor again = MakeTensor("layer.0", DType::kF32, {1024}, 100);
  PutAll(*store, kCrashRun, 2, {again, MakeTensor("extra", DType::kF32, {64, 1024}, 7)});
  ASSERT_TRUE(store->CommitCheckpoint(kCrashRun, 2).ok());
  ExpectReadsBack(*store, kCrashRun, 2, again);
  ExpectReadsBack(*store, kCrashRun, 2, MakeTensor("layer.1", DType::kF32, {2048}, 101));
  ExpectReadsBack(*store, kCrashRun, 2, MakeTensor("extra", DType::kF32, {64, 1024}, 7));
}

// Issue #20: 8 flipped bytes in the write-ahead log used to open without a word, minus every
// commit after them (RocksDB's point-in-time recovery). Now the open refuses, naming the store and
// --salvage, and changes nothing; a salvage keeps the damaged files and what is intact.
// What a writer killed mid-write(2) leaves: the log's last record cut short. The store opens
// without --salvage, with every commit before the cut; a flipped length field (the test below)
// still refuses to open.
TEST_F(ShardStoreTest, LogCutByAKilledWriterOpensWithTheCommitsBeforeIt) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    for (int64_t step : {1, 2}) {
      PutAll(*store, "run", step, {MakeTensor("w", DType::kF32, {64}, step)});
      ASSERT_TRUE(store->CommitCheckpoint("run", step).ok());
    }
    // The last record: a tensor of 2,000 floats, larger than a page, as a killed write leaves it.
    PutAll(*store, "run", 3, {MakeTensor("w", DType::kF32, {2000}, 3)});
  }
  const std::string log = NewestLog(path_);
  ASSERT_FALSE(log.empty());
  auto whole = LogEndsInCutRecord(log);
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE(*whole) << "a log of whole records reads as cut";
  std::filesystem::resize_file(log, std::filesystem::file_size(log) - 3000);
  auto cut = LogEndsInCutRecord(log);
  ASSERT_TRUE(cut.ok());
  EXPECT_TRUE(*cut);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr) << "a log cut by a killed writer needed --salvage";
  auto list = store->ListCheckpoints("run");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(Steps(*list), (std::vector<int64_t>{1, 2}));
  for (int64_t step : {1, 2}) ExpectReadsBack(*store, "run", step, MakeTensor("w", DType::kF32, {64}, step));
}

TEST_F(ShardStoreTest, DamagedWriteAheadLogRefusesToOpenAndSalvageKeepsWhatIsIntact) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    for (int64_t step : {1, 2, 3, 4}) {
      PutAll(*store, "run", step,
             {MakeTensor("w", DType::kF32, {64}, step), MakeTensor("b", DType::kF32, {16}, 10 + step)});
      ASSERT_TRUE(store->CommitCheckpoint("run", step).ok());
    }
  }  // closed without a flush: the commits are in the log only
  std::string log;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    if (entry.path().extension() == ".log" && entry.file_size() > (log.empty() ? 0 : std::filesystem::file_size(log))) {
      log = entry.path().string();
    }
  }
  ASSERT_FALSE(log.empty());
  const auto size = std::filesystem::file_size(log);
  ASSERT_GT(size, 1000u);
  {
    std::fstream file(log, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size / 2));
    const char flipped[8] = {'\x5a', '\x5a', '\x5a', '\x5a', '\x5a', '\x5a', '\x5a', '\x5a'};
    file.write(flipped, 8);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {  // refusing changed nothing: it refuses again
    auto damaged = ShardStore::Open(path_);
    ASSERT_FALSE(damaged.ok()) << "a store with a damaged log opened";
    ExpectCode(damaged.status(), StatusCode::kCorruption, path_);
    EXPECT_NE(damaged.status().message().find("--salvage"), std::string::npos) << damaged.status().message();
  }
  StoreOptions salvage;
  salvage.salvage = true;
  auto store = OpenStore(salvage);
  ASSERT_NE(store, nullptr);
  auto list = store->ListCheckpoints("run");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_LT(list->size(), 4u) << "the damage dropped nothing: the test did not damage the log";
  for (const CheckpointInfo& info : *list) {
    ExpectReadsBack(*store, "run", info.step, MakeTensor("w", DType::kF32, {64}, info.step));
  }
  int kept_logs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    if (entry.path().filename().string().rfind("damaged-", 0) != 0) continue;
    for (const auto& kept : std::filesystem::directory_iterator(entry.path()))
      kept_logs += kept.path().extension() == ".log";
  }
  EXPECT_GE(kept_logs, 1) << "the damaged log was not kept beside the store";
}

TEST_F(ShardStoreTest, DeletedCheckpointIsGoneWithItsDataFilesAndOthersStay) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (int64_t step : {1, 2}) {
    PutAll(*store, "run", step,
           {MakeTensor("embed", DType::kF32, {256, 128}, step), MakeTensor("norm", DType::kF32, {8}, step)});
    ASSERT_TRUE(store->CommitCheckpoint("run", step).ok());
  }
  ASSERT_EQ(DataFiles().size(), 2u);
  ASSERT_TRUE(store->DeleteCheckpoint("run", 1).ok());
  auto list = store->ListCheckpoints("run");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(Steps(*list), (std::vector<int64_t>{2}));
  ExpectCode(store->ReadCheckpointTensor("run", 1, "embed").status(), StatusCode::kNotFound);
  ASSERT_EQ(DataFiles().size(), 1u);
  EXPECT_EQ(std::filesystem::path(DataFiles()[0]).filename().string().rfind("2-", 0), 0u) << DataFiles()[0];
  ExpectReadsBack(*store, "run", 2, MakeTensor("embed", DType::kF32, {256, 128}, 2));
  ExpectCode(store->DeleteCheckpoint("run", 1), StatusCode::kNotFound);
  auto all = store->ListAllCheckpoints();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<StoredCheckpoint>{{"run", 2}}));
}

// Attempts that died before committing left data files and staged records forever. A step older
// than the run's last commit can never commit: the next open collects it. A newer one may still
// (a new attempt commits what the dead one staged): it stays.
TEST_F(ShardStoreTest, OpenCollectsWhatDeadAttemptsLeftButKeepsAStepThatMayStillCommit) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    PutAll(*store, "run", 3,
           {MakeTensor("embed", DType::kF32, {256, 128}, 3), MakeTensor("norm", DType::kF32, {8}, 3)});
    PutAll(*store, "run", 5, {MakeTensor("embed", DType::kF32, {256, 128}, 5)});
    ASSERT_TRUE(store->CommitCheckpoint("run", 5).ok());
    PutAll(*store, "run", 7, {MakeTensor("embed", DType::kF32, {256, 128}, 7)});
  }
  ASSERT_EQ(DataFiles().size(), 3u);
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    std::vector<std::string> steps;
    for (const auto& file : DataFiles()) steps.push_back(std::filesystem::path(file).filename().string().substr(0, 2));
    EXPECT_EQ(steps, (std::vector<std::string>{"5-", "7-"}));
    ExpectReadsBack(*store, "run", 5, MakeTensor("embed", DType::kF32, {256, 128}, 5));
    PutAll(*store, "run", 7, {MakeTensor("norm", DType::kF32, {8}, 7)});
    ASSERT_TRUE(store->CommitCheckpoint("run", 7).ok());
    ExpectReadsBack(*store, "run", 7, MakeTensor("embed", DType::kF32, {256, 128}, 7));
  }
  RawDb raw(path_);
  ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
  EXPECT_EQ(raw.CountWithPrefix("t" + EncodeKeyString("run") + EncodeKeyU64(3)), 0);
}

TEST_F(ShardStoreTest, ActivationChunksRoundTripAndAreInvisibleUntilTheirCursor) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const TestTensor a = MakeTensor("a", DType::kBF16, {64, 96}, 11);
  const TestTensor b = MakeTensor("b", DType::kF32, {64, 96}, 12);       // 24 KiB
  const TestTensor big = MakeTensor("big", DType::kF32, {256, 96}, 13);  // 96 KiB: a blob value
  const std::vector<ActivationRecordView> records = {{3, "resid_post", a.View()}, {3, "mlp_out", b.View()}};
  ASSERT_TRUE(store->PutActivationChunk("run", {0, 0, 64, a.bytes.size() + b.bytes.size()}, records).ok());
  ASSERT_TRUE(store
                  ->PutActivationChunk("run", {2, 320, 256, big.bytes.size()},
                                       std::vector<ActivationRecordView>{{3, "resid_post", big.View()}})
                  .ok());

  auto chunks = store->ListActivationChunks("run");
  ASSERT_TRUE(chunks.ok());
  ASSERT_EQ(chunks->size(), 2u);
  EXPECT_EQ((*chunks)[0].chunk, 0u);
  EXPECT_EQ((*chunks)[1].row_begin, 320u);
  auto missing = store->GetActivationChunk("run", 1);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());

  auto read = store->ReadActivation("run", 3, "mlp_out", 0);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->bytes, b.bytes);
  EXPECT_EQ(read->shape, b.shape);
  auto read_big = store->ReadActivation("run", 3, "resid_post", 320);
  ASSERT_TRUE(read_big.ok());
  EXPECT_EQ(read_big->bytes, big.bytes);
  ExpectCode(store->ReadActivation("run", 4, "mlp_out", 0).status(), StatusCode::kNotFound, "layer 4");
  // A record whose first dimension is not the chunk's rows is refused, naming it.
  ExpectCode(store->PutActivationChunk("run", {5, 0, 10, 0}, records), StatusCode::kInvalidArgument,
             "resid_post of layer 3");

  // Survives a reopen (records were flushed around the WAL, the cursor went through it).
  store.reset();
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto again = store->ReadActivation("run", 3, "resid_post", 0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->bytes, a.bytes);
  ASSERT_TRUE(store->GetActivationChunk("run", 2).ok());
  EXPECT_TRUE(store->GetActivationChunk("run", 2)->has_value());

  // A flipped byte in a chunk file is Corruption, never data.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path_ + "/activations")) {
    if (entry.path().filename() != "2.bin") continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put(static_cast<char>(big.bytes[100] ^ 0x40));
  }
  ExpectCode(store->ReadActivation("run", 3, "resid_post", 320).status(), StatusCode::kCorruption, "checksum");
}

// ReadActivationInto: a cold record comes in one O_DIRECT read of its aligned cover (and stays out
// of the page cache) or, asked, through the page cache; a warm one from the page cache; records at
// unaligned offsets, a reused buffer, and a damaged record is Corruption naming it on both paths.
TEST_F(ShardStoreTest, ActivationRecordsReadIntoABufferColdAndWarm) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const TestTensor odd = MakeTensor("odd", DType::kI64, {7, 3}, 21);  // 168 bytes
  const TestTensor a = MakeTensor("a", DType::kBF16, {300, 96}, 22);  // 57,600 bytes: b starts unaligned
  const TestTensor b = MakeTensor("b", DType::kF32, {300, 96}, 23);   // 115,200 bytes
  const std::vector<ActivationRecordView> records = {
      {0, "#odd", odd.View()}, {3, "resid_post", a.View()}, {3, "mlp_out", b.View()}};
  ASSERT_TRUE(
      store->PutActivationChunk("run", {0, 0, 300, 0}, std::vector<ActivationRecordView>{records[1], records[2]}).ok());
  ASSERT_TRUE(store->PutActivationChunk("run", {1, 300, 7, 0}, std::vector<ActivationRecordView>{records[0]}).ok());
  auto where = store->LocateActivation("run", 3, "mlp_out", 0);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  EXPECT_EQ(where->offset, a.bytes.size());
  EXPECT_EQ(where->size, b.bytes.size());
  EXPECT_EQ(where->checksum, Checksum(b.bytes));
  ExpectCode(store->LocateActivation("run", 4, "mlp_out", 0).status(), StatusCode::kNotFound, "layer 4");

  auto drop = [&](const std::string& file) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  auto cached = [&](const ActivationLocation& l) {
    const int fd = ::open(l.file.c_str(), O_RDONLY);
    const bool in = RangeInPageCache(fd, l.offset, l.size);
    ::close(fd);
    return in;
  };
  drop(where->file);
  // Where the file system keeps files in memory (tmpfs), nothing is cold: the warm path is tested alone.
  const bool can_be_cold = !cached(*where);
  RecordBuffer buffer;
  auto cold = store->ReadActivationInto("run", 3, "mlp_out", 0, buffer, ColdRead::kDirect);
  ASSERT_TRUE(cold.ok()) << cold.status().ToString();
  EXPECT_TRUE(std::equal(cold->begin(), cold->end(), b.bytes.begin(), b.bytes.end()));
  if (can_be_cold) {
    EXPECT_FALSE(cached(*where)) << "a cold record is read around the page cache";
  }
  auto first =
      store->ReadActivationInto("run", 3, "resid_post", 0, buffer, ColdRead::kDirect);  // the same buffer again
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(std::equal(first->begin(), first->end(), a.bytes.begin(), a.bytes.end()));
  // Through the page cache: the record is cached after, and later reads copy it from there.
  auto through = store->ReadActivationInto("run", 3, "mlp_out", 0, buffer, ColdRead::kThroughPageCache);
  ASSERT_TRUE(through.ok()) << through.status().ToString();
  EXPECT_TRUE(std::equal(through->begin(), through->end(), b.bytes.begin(), b.bytes.end()));
  EXPECT_TRUE(cached(*where));
  auto warm = store->ReadActivationInto("run", 3, "mlp_out", 0, buffer, ColdRead::kDirect);
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();
  EXPECT_TRUE(std::equal(warm->begin(), warm->end(), b.bytes.begin(), b.bytes.end()));
  auto tiny = store->ReadActivationInto("run", 0, "#odd", 300, buffer, ColdRead::kDirect);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_TRUE(std::equal(tiny->begin(), tiny->end(), odd.bytes.begin(), odd.bytes.end()));

  // A flipped byte: Corruption naming the record, from the page cache and from the disk.
  {
    std::fstream f(where->file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(where->offset + 5000));
    f.put(static_cast<char>(b.bytes[5000] ^ 0x01));
  }
  ExpectCode(store->ReadActivationInto("run", 3, "mlp_out", 0, buffer, ColdRead::kDirect).status(),
             StatusCode::kCorruption, "mlp_out of layer 3 at row 0");
  drop(where->file);
  ExpectCode(store->ReadActivationInto("run", 3, "mlp_out", 0, buffer, ColdRead::kDirect).status(),
             StatusCode::kCorruption, "checksum");
  // The other record of the file is intact.
  EXPECT_TRUE(store->ReadActivationInto("run", 3, "resid_post", 0, buffer, ColdRead::kDirect).ok());
}

// A record of MBs (read into a buffer on 2 MiB pages, where O_DIRECT requests can be large) at an
// unaligned offset, read cold and then warm, reusing the buffer.
TEST_F(ShardStoreTest, ABigActivationRecordReadsColdAndWarm) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const TestTensor odd = MakeTensor("odd", DType::kI64, {7, 3}, 31);
  const TestTensor big = MakeTensor("big", DType::kF32, {7, 100000}, 32);  // 2.8 MB
  const std::vector<ActivationRecordView> records = {{0, "#odd", odd.View()}, {5, "resid_post", big.View()}};
  ASSERT_TRUE(store->PutActivationChunk("run", {0, 0, 7, 0}, records).ok());
  auto where = store->LocateActivation("run", 5, "resid_post", 0);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  EXPECT_EQ(where->offset, odd.bytes.size());
  const int fd = ::open(where->file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  RecordBuffer buffer;
  for (ColdRead cold : {ColdRead::kDirect, ColdRead::kDirect, ColdRead::kThroughPageCache, ColdRead::kDirect}) {
    auto read = store->ReadActivationInto("run", 5, "resid_post", 0, buffer, cold);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_TRUE(std::equal(read->begin(), read->end(), big.bytes.begin(), big.bytes.end()));
  }
  EXPECT_EQ(buffer.capacity() % (2 << 20), 0u);
}

TEST_F(ShardStoreTest, ActivationRunRecordRoundTripsAndReadsReadOnly) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto none = store->GetActivationRun("run");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ActivationRunInfo info;
  info.layers = {0, 2, 11};
  info.sites = {"resid_post", "q"};
  info.row_shapes = {{768}, {12, 64}};
  info.dtype = DType::kBF16;
  info.total_rows = 1 << 20;
  info.sequence = 1024;
  ASSERT_TRUE(store->PutActivationRun("run", info).ok());
  info.row_shapes.pop_back();
  ExpectCode(store->PutActivationRun("run", info), StatusCode::kInvalidArgument, "one per site");
  info.row_shapes.push_back({12, 64});
  store.reset();
  // Read-only, as `strata activations get --store` opens it.
  auto reader = OpenStore({.create_if_missing = false, .read_only = true});
  ASSERT_NE(reader, nullptr);
  auto got = reader->GetActivationRun("run");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, info);
  ExpectCode(reader->PutActivationRun("run", info), StatusCode::kInvalidArgument, "read-only");
}

TEST(ShardStoreReadOnlyTest, ReadsCommittedCheckpointsWhileAWriterHoldsTheStore) {
  char tmpl[] = "/tmp/strata-ro-XXXXXX";
  const std::string path = std::string(mkdtemp(tmpl)) + "/store";
  auto writer = ShardStore::Open(path);
  ASSERT_TRUE(writer.ok());
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  TensorView view{DType::kF32, {3}, {reinterpret_cast<const uint8_t*>(values.data()), 12}};
  ASSERT_TRUE((*writer)->PutCheckpointTensor("r", 5, "w", view).ok());
  ASSERT_TRUE((*writer)->CommitCheckpoint("r", 5).ok());
  auto reader = ShardStore::Open(path, {.create_if_missing = false, .read_only = true});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto list = (*reader)->ListCheckpoints("r");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  auto t = (*reader)->ReadCheckpointTensor("r", 5, "w");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(0, std::memcmp(t->bytes.data(), values.data(), 12));
  EXPECT_FALSE((*reader)->PutCheckpointTensor("r", 6, "w", view).ok());
  EXPECT_EQ(ShardStore::Open(path + "-missing", {.read_only = true}).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata::storage
