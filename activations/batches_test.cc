#include "activations/batches.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "storage/shard_store.h"

namespace strata::activations {
namespace {

// Row r of (layer, site) holds the float r + 1000 * layer in each of its 2 columns; chunks of
// uneven sizes over two "workers".
class FakeReader final : public ActivationReader {
 public:
  Result<ActivationIndex> Index(const std::string&) override { return MakeIndex(); }
  Status ReadRows(const ActivationIndex&, int64_t layer, const std::string&, uint64_t begin, uint64_t end,
                  const std::function<Status(std::span<const uint8_t>)>& sink) override {
    std::vector<float> v;
    for (uint64_t r = begin; r < end; ++r) v.insert(v.end(), 2, static_cast<float>(r + 1000 * layer));
    return sink({reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4});
  }
  Status ReadTokens(const ActivationIndex&, uint64_t, uint64_t,
                    const std::function<Status(std::span<const uint8_t>)>&) override {
    return NotFound("none");
  }

  static ActivationIndex MakeIndex() {
    ActivationIndex index;
    index.run = "r";
    index.layers = {0, 1};
    index.sites = {"resid_post"};
    index.row_shapes = {{2}};
    index.hidden = 2;
    uint64_t row = 0, chunk = 0;
    for (uint64_t n : {100, 100, 37, 100, 250, 13}) {
      index.chunks.push_back({chunk, row, n, n * 8, chunk % 2 ? "w1" : "w0", "", 0});
      row += n;
      ++chunk;
    }
    index.total_rows = row;
    return index;
  }
};

std::vector<Batch> All(BatchOptions o, ActivationIndex index = FakeReader::MakeIndex()) {
  auto stream = BatchStream::Start(
      [] { return Result<std::unique_ptr<ActivationReader>>(std::make_unique<FakeReader>()); }, index, std::move(o));
  EXPECT_TRUE(stream.ok()) << stream.status().ToString();
  std::vector<Batch> out;
  if (!stream.ok()) return out;
  while (true) {
    auto next = (*stream)->Next();
    EXPECT_TRUE(next.ok());
    if (!next.ok() || !*next) break;
    out.push_back(std::move(**next));
  }
  return out;
}

BatchOptions Options(uint64_t seed) {
  BatchOptions o;
  o.records = {{0, "resid_post"}, {1, "resid_post"}};
  o.batch_rows = 64;
  o.seed = seed;
  o.epochs = 3;
  o.buffer_rows = 150;
  return o;
}

TEST(BatchStreamTest, EveryRowOncePerEpochWithItsOwnBytes) {
  const uint64_t total = FakeReader::MakeIndex().total_rows;
  std::vector<std::vector<uint64_t>> epochs(3);
  for (const Batch& b : All(Options(5))) {
    EXPECT_LE(b.rows.size(), 64u);
    for (size_t i = 0; i < b.rows.size(); ++i) {
      for (size_t r = 0; r < 2; ++r) {
        float v[2];
        std::memcpy(v, b.data[r].data() + i * 8, 8);
        EXPECT_EQ(v[0], static_cast<float>(b.rows[i] + 1000 * r));
      }
    }
    epochs[b.epoch].insert(epochs[b.epoch].end(), b.rows.begin(), b.rows.end());
  }
  std::vector<uint64_t> all(total);
  std::iota(all.begin(), all.end(), 0);
  for (auto& e : epochs) {
    EXPECT_NE(e, all);  // shuffled
    std::sort(e.begin(), e.end());
    EXPECT_EQ(e, all);
  }
}

TEST(BatchStreamTest, SameSeedSameBatchesOtherSeedOthers) {
  auto rows = [](const std::vector<Batch>& bs) {
    std::vector<uint64_t> out;
    for (const auto& b : bs) out.insert(out.end(), b.rows.begin(), b.rows.end());
    return out;
  };
  EXPECT_EQ(rows(All(Options(5))), rows(All(Options(5))));
  EXPECT_NE(rows(All(Options(5))), rows(All(Options(6))));
}

TEST(BatchStreamTest, UnshuffledIsRowOrderAndDropLastDropsTheShortBatch) {
  BatchOptions o = Options(0);
  o.shuffle = false;
  o.epochs = 1;
  auto batches = All(o);
  uint64_t next = 0;
  for (const auto& b : batches) {
    for (uint64_t r : b.rows) EXPECT_EQ(r, next++);
  }
  EXPECT_EQ(next, FakeReader::MakeIndex().total_rows);
  EXPECT_EQ(batches.back().rows.size(), 600u % 64);
  o.drop_last = true;
  EXPECT_EQ(All(o).size(), 600u / 64);
}

TEST(BatchStreamTest, RefusesWhatItCannotServe) {
  auto open = [] { return Result<std::unique_ptr<ActivationReader>>(std::make_unique<FakeReader>()); };
  BatchOptions o = Options(0);
  o.records = {{3, "resid_post"}};
  auto bad_layer = BatchStream::Start(open, FakeReader::MakeIndex(), o);
  ASSERT_FALSE(bad_layer.ok());
  EXPECT_NE(bad_layer.status().message().find("layer 3 was not captured"), std::string::npos);
  o = Options(0);
  o.batch_rows = 0;
  EXPECT_EQ(BatchStream::Start(open, FakeReader::MakeIndex(), o).status().code(), StatusCode::kInvalidArgument);
  ActivationIndex missing = FakeReader::MakeIndex();
  missing.offline = true;
  missing.source = "store /s";
  missing.chunks.erase(missing.chunks.begin() + 1);
  auto gap = BatchStream::Start(open, missing, Options(0));
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("rows 100:200"), std::string::npos) << gap.status().ToString();
}

// The fake's rows written into two real stores (chunks alternating between them, each chunk file
// with a tokens record after the layers, so records start at unaligned offsets), read back through
// OpenStores: cold around the page cache (O_DIRECT), cold through it, and warm, the batches are the
// fake reader's, byte for byte; a damaged record is an error naming it.
class StoreBatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/strata_batches_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    const ActivationIndex fake = FakeReader::MakeIndex();
    storage::ActivationRunInfo info;
    info.layers = {0, 1};
    info.sites = {"resid_post"};
    info.row_shapes = {{2}};
    info.dtype = storage::DType::kF32;
    info.total_rows = fake.total_rows;
    info.sequence = 10;
    for (int w = 0; w < 2; ++w) {
      dirs_.push_back(dir_ + "/w" + std::to_string(w));
      auto store = storage::ShardStore::Open(dirs_.back());
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      ASSERT_TRUE((*store)->PutActivationRun("r", info).ok());
      for (const StoredChunk& c : fake.chunks) {
        if (c.chunk % 2 != static_cast<uint64_t>(w)) continue;
        std::vector<std::vector<float>> values(2);
        for (int64_t layer = 0; layer < 2; ++layer) {
          for (uint64_t r = c.row_begin; r < c.row_begin + c.row_count; ++r) {
            values[layer].insert(values[layer].end(), 2, static_cast<float>(r + 1000 * layer));
          }
        }
        std::vector<int64_t> tokens(c.row_count * 3, 7);
        auto view = [&](storage::DType dtype, int64_t columns, const void* p, size_t bytes) {
          return storage::TensorView{
              dtype, {static_cast<int64_t>(c.row_count), columns}, {static_cast<const uint8_t*>(p), bytes}};
        };
        const std::vector<storage::ActivationRecordView> records = {
            {0, "resid_post", view(storage::DType::kF32, 2, values[0].data(), values[0].size() * 4)},
            {1, "resid_post", view(storage::DType::kF32, 2, values[1].data(), values[1].size() * 4)},
            {0, storage::kActivationTokensSite, view(storage::DType::kI64, 3, tokens.data(), tokens.size() * 8)}};
        ASSERT_TRUE((*store)->PutActivationChunk("r", {c.chunk, c.row_begin, c.row_count, 0}, records).ok());
      }
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void DropCache() {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_)) {
      if (!entry.is_regular_file()) continue;
      const int fd = ::open(entry.path().c_str(), O_RDONLY);
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }

  // The batches, or the first error.
  Result<std::vector<Batch>> Read(BatchOptions o) {
    auto open = [this] { return ActivationReader::OpenStores(dirs_); };
    STRATA_ASSIGN_OR_RETURN(auto reader, open());
    STRATA_ASSIGN_OR_RETURN(ActivationIndex index, reader->Index("r"));
    STRATA_ASSIGN_OR_RETURN(auto stream, BatchStream::Start(open, index, std::move(o)));
    std::vector<Batch> out;
    while (true) {
      STRATA_ASSIGN_OR_RETURN(std::optional<Batch> next, stream->Next());
      if (!next) return out;
      out.push_back(std::move(*next));
    }
  }

  std::string dir_;
  std::vector<std::string> dirs_;
};

void ExpectSameBatches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].epoch, b[i].epoch);
    EXPECT_EQ(a[i].rows, b[i].rows);
    ASSERT_EQ(a[i].data.size(), b[i].data.size());
    for (size_t r = 0; r < a[i].data.size(); ++r) EXPECT_TRUE(a[i].data[r] == b[i].data[r]) << "batch " << i;
  }
}

TEST_F(StoreBatchesTest, ColdWarmAndThroughThePageCacheGiveTheFakesBatches) {
  const std::vector<Batch> expected = All(Options(5));
  for (int threads : {1, 3}) {
    for (std::optional<bool> page_cache :
         {std::optional<bool>(false), std::optional<bool>(true), std::optional<bool>()}) {
      BatchOptions o = Options(5);
      o.threads = threads;
      o.page_cache = page_cache;
      DropCache();
      auto cold = Read(o);
      ASSERT_TRUE(cold.ok()) << cold.status().ToString();
      ExpectSameBatches(*cold, expected);
      auto again = Read(o);  // warm where it went through the page cache, else cold again
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      ExpectSameBatches(*again, expected);
    }
  }
}

TEST_F(StoreBatchesTest, ADamagedRecordIsAnErrorNamingIt) {
  // Chunk 2 (rows 200:237, in w0): flip a byte of layer 1's record (after layer 0's 37 rows x 8 bytes).
  std::string file;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dirs_[0] + "/activations")) {
    if (entry.path().filename() == "2.bin") file = entry.path();
  }
  ASSERT_FALSE(file.empty());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(37 * 8 + 5);
    const char c = static_cast<char>(f.get());
    f.seekp(37 * 8 + 5);
    f.put(static_cast<char>(c ^ 0x10));
  }
  for (bool page_cache : {false, true}) {
    DropCache();
    BatchOptions o = Options(5);
    o.page_cache = page_cache;
    auto read = Read(o);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), StatusCode::kCorruption) << read.status().ToString();
    EXPECT_NE(read.status().message().find("resid_post of layer 1 at row 200"), std::string::npos)
        << read.status().ToString();
  }
}

}  // namespace
}  // namespace strata::activations
