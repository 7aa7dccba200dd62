#include "activations/batches.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

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
  Status ReadTokens(const ActivationIndex&, uint64_t, uint64_t, const std::function<Status(std::span<const uint8_t>)>&) override {
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
  auto stream = BatchStream::Start([] { return Result<std::unique_ptr<ActivationReader>>(std::make_unique<FakeReader>()); },
                                   index, std::move(o));
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

}  // namespace
}  // namespace strata::activations
