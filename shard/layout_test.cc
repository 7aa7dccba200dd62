#include "shard/layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace strata::shard {
namespace {

TEST(LayoutTest, RanksAndPositionsRoundTripWithTensorParallelFastest) {
  const MeshShape mesh{2, 2, 2};
  for (int64_t r = 0; r < mesh.size(); ++r) EXPECT_EQ(RankOf(mesh, PositionOf(mesh, r)), r);
  EXPECT_EQ(PositionOf(mesh, 1).tp_rank, 1);  // tp groups are consecutive ranks
  EXPECT_EQ(PositionOf(mesh, 2).dp_rank, 1);
  EXPECT_EQ(PositionOf(mesh, 4).stage, 1);
}

TEST(LayoutTest, StagesCoverEveryLayerOnceWithTheLargerStagesLast) {
  EXPECT_EQ(StageLayers(5, 2, 0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(StageLayers(5, 2, 1), (std::pair<int64_t, int64_t>{2, 5}));
  // Explicit counts (parallel.stages) override the even split; empty keeps it.
  EXPECT_EQ(StageLayers(5, 2, 0, {4, 1}), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(StageLayers(5, 2, 1, {4, 1}), (std::pair<int64_t, int64_t>{4, 5}));
  EXPECT_EQ(StageLayers(5, 2, 1, {}), (std::pair<int64_t, int64_t>{2, 5}));
  for (int64_t pp = 1; pp <= 7; ++pp) {
    int64_t next = 0;
    for (int64_t s = 0; s < pp; ++s) {
      auto [first, last] = StageLayers(7, pp, s);
      EXPECT_EQ(first, next);
      EXPECT_GE(last - first, 1);
      next = last;
    }
    EXPECT_EQ(next, 7);
  }
}

// GPT-2's fused c_attn [3h, h]: rank r of 2 holds rows [r h/2, (r+1) h/2) of each of q, k, v.
TEST(LayoutTest, FusedQkvSplitsEachOfQKAndVByHeads) {
  ModelSpec spec;
  spec.hidden = 4;
  const std::vector<int64_t> shape = {12, 4};
  const TensorSplit split = TensorParallelSplit(spec, "h.0.c_attn.weight", shape, 2);
  EXPECT_EQ(SliceShape(split, shape, 2), (std::vector<int64_t>{6, 4}));
  std::vector<float> full(48), slice(24), back(48, -1.0f);
  std::iota(full.begin(), full.end(), 0.0f);
  CopySlice(split, shape, 2, 1, sizeof(float), reinterpret_cast<uint8_t*>(full.data()),
            reinterpret_cast<uint8_t*>(slice.data()));
  // Rank 1: q rows 2-3 (elements 8..15), k rows 6-7 (24..31), v rows 10-11 (40..47).
  EXPECT_EQ(slice[0], 8.0f);
  EXPECT_EQ(slice[8], 24.0f);
  EXPECT_EQ(slice[16], 40.0f);
  for (int64_t r = 0; r < 2; ++r) {
    CopySlice(split, shape, 2, r, sizeof(float), reinterpret_cast<uint8_t*>(full.data()),
              reinterpret_cast<uint8_t*>(slice.data()));
    PlaceSlice(split, shape, 2, r, sizeof(float), reinterpret_cast<uint8_t*>(slice.data()),
               reinterpret_cast<uint8_t*>(back.data()));
  }
  EXPECT_EQ(back, full);
  // Row-parallel projections split columns; norms and positions are replicated.
  EXPECT_EQ(SliceShape(TensorParallelSplit(spec, "h.0.attn_proj.weight", {4, 4}, 2), {4, 4}, 2),
            (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(TensorParallelSplit(spec, "h.0.ln_1.weight", {4}, 2).replicated());
  EXPECT_TRUE(TensorParallelSplit(spec, "wpe.weight", {256, 4}, 2).replicated());
  spec.family = Family::kLlama;
  EXPECT_EQ(TensorParallelSplit(spec, "layers.3.self_attn.k_proj.weight", {2, 4}, 2).dim, 0);
  EXPECT_EQ(TensorParallelSplit(spec, "layers.3.mlp.down_proj.weight", {4, 8}, 2).dim, 1);
}

// The token embedding and the head split by vocabulary rows where tp divides the vocabulary;
// pieces written so (and pieces of the same tensor written whole by an older, replicated run)
// assemble into the whole tensor.
TEST(LayoutTest, EmbeddingAndHeadAreVocabParallelWhereTpDividesTheVocabulary) {
  ModelSpec spec;
  spec.family = Family::kLlama;
  spec.vocab = 6;
  spec.hidden = 2;
  const std::vector<int64_t> shape = {6, 2};
  for (const char* name : {"embed_tokens.weight", "lm_head.weight"}) {
    EXPECT_EQ(SliceShape(TensorParallelSplit(spec, name, shape, 2), shape, 2), (std::vector<int64_t>{3, 2})) << name;
    EXPECT_EQ(SliceShape(TensorParallelSplit(spec, name, shape, 3), shape, 3), (std::vector<int64_t>{2, 2})) << name;
    EXPECT_TRUE(TensorParallelSplit(spec, name, shape, 4).replicated()) << name << ": 6 rows do not split over 4";
    EXPECT_TRUE(TensorParallelSplit(spec, name, shape, 1).replicated()) << name;
  }
  EXPECT_TRUE(TensorParallelSplit(spec, "norm.weight", {2}, 2).replicated());
  EXPECT_TRUE(VocabParallel(spec, 2));
  EXPECT_FALSE(VocabParallel(spec, 4));
  spec.family = Family::kGpt2;
  spec.vocab = 50257;
  EXPECT_TRUE(TensorParallelSplit(spec, "wte.weight", {50257, 2}, 2).replicated())
      << "GPT-2's odd vocabulary stays whole";
  spec.vocab = 50304;
  EXPECT_EQ(TensorParallelSplit(spec, "wte.weight", {50304, 2}, 2).dim, 0) << "padded to a multiple of tp, it splits";

  spec.family = Family::kLlama;
  spec.vocab = 6;
  std::vector<float> full(12);
  std::iota(full.begin(), full.end(), 0.0f);
  TensorAssembler assembler(spec);
  const TensorSplit split = TensorParallelSplit(spec, "lm_head.weight", shape, 2);
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> slice(6);
    CopySlice(split, shape, 2, r, sizeof(float), reinterpret_cast<uint8_t*>(full.data()),
              reinterpret_cast<uint8_t*>(slice.data()));
    EXPECT_EQ(slice[0], static_cast<float>(6 * r)) << "rank " << r << " holds rows [3r, 3r + 3)";
    ASSERT_TRUE(assembler
                    .Add({"param", "lm_head.weight", r, 2, 0, 6, shape}, sizeof(float),
                         reinterpret_cast<uint8_t*>(slice.data()))
                    .ok());
  }
  ASSERT_TRUE(assembler
                  .Add({"param", "embed_tokens.weight", 0, 1, 0, 12, shape}, sizeof(float),
                       reinterpret_cast<uint8_t*>(full.data()))
                  .ok());
  for (const char* name : {"lm_head.weight", "embed_tokens.weight"}) {
    auto taken = assembler.Take(name);
    ASSERT_TRUE(taken.ok()) << name << ": " << taken.status().ToString();
    std::vector<float> back(12);
    std::memcpy(back.data(), taken->data(), taken->size());
    EXPECT_EQ(back, full) << name;
  }
}

TEST(LayoutTest, PieceNamesRoundTripAndBadNamesAreRefused) {
  PieceName p{"adam_v", "layers.1.mlp.up_proj.weight", 1, 2, 10, 20, {96, 32}};
  auto parsed = ParsePiece(FormatPiece(p));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->kind, "adam_v");
  EXPECT_EQ(parsed->name, p.name);
  EXPECT_EQ(parsed->tp_rank, 1);
  EXPECT_EQ(parsed->end, 20);
  EXPECT_EQ(parsed->shape, p.shape);
  for (const char* bad :
       {"param/wte.weight", "param/x@tp=2/2@[0,4)@4", "param/x@tp=0/1@[5,4)@4", "param/x@tp=0/1@[0,4)@"}) {
    EXPECT_FALSE(ParsePiece(bad).ok()) << bad;
  }
}

TEST(LayoutTest, AssemblerNamesATensorWithAMissingPiece) {
  ModelSpec spec;
  TensorAssembler assembler(spec);
  std::vector<float> half(8, 1.0f);
  ASSERT_TRUE(
      assembler.Add({"param", "wte.weight", 0, 1, 0, 8, {4, 4}}, sizeof(float), reinterpret_cast<uint8_t*>(half.data()))
          .ok());
  auto taken = assembler.Take("wte.weight");
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("do not cover"), std::string::npos);
  ASSERT_TRUE(
      assembler
          .Add({"param", "wte.weight", 0, 1, 8, 16, {4, 4}}, sizeof(float), reinterpret_cast<uint8_t*>(half.data()))
          .ok());
  EXPECT_TRUE(assembler.Take("wte.weight").ok());
  EXPECT_FALSE(
      assembler
          .Add({"param", "wte.weight", 0, 1, 8, 20, {4, 4}}, sizeof(float), reinterpret_cast<uint8_t*>(half.data()))
          .ok());
}

// Counting elements is not coverage: two pieces of the same half add up to the whole tensor.
TEST(LayoutTest, AssemblerRefusesAPieceWrittenTwiceAndNamesTheHole) {
  ModelSpec spec;
  TensorAssembler assembler(spec);
  std::vector<float> half(8, 1.0f);
  const auto* bytes = reinterpret_cast<uint8_t*>(half.data());
  ASSERT_TRUE(assembler.Add({"param", "wte.weight", 0, 1, 0, 8, {4, 4}}, sizeof(float), bytes).ok());
  Status twice = assembler.Add({"param", "wte.weight", 0, 1, 4, 12, {4, 4}}, sizeof(float), bytes);
  ASSERT_EQ(twice.code(), StatusCode::kCorruption);
  EXPECT_NE(twice.message().find("overlap [0, 8)"), std::string::npos) << twice.message();
  auto taken = assembler.Take("wte.weight");
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("element 8"), std::string::npos) << taken.status().message();
}

TEST(LayoutTest, ElementCoverageIsCompleteOnlyWhenRangesTileTheTensor) {
  ElementCoverage coverage(10);
  EXPECT_TRUE(coverage.Add(6, 10).ok());
  EXPECT_TRUE(coverage.Add(0, 3).ok());
  EXPECT_FALSE(coverage.complete());
  EXPECT_EQ(coverage.first_missing(), 3);
  EXPECT_FALSE(coverage.Add(2, 4).ok());   // overlaps [0, 3)
  EXPECT_FALSE(coverage.Add(5, 7).ok());   // overlaps [6, 10)
  EXPECT_FALSE(coverage.Add(8, 11).ok());  // past the end
  EXPECT_FALSE(coverage.Add(4, 4).ok());   // empty
  EXPECT_TRUE(coverage.Add(3, 6).ok());
  EXPECT_TRUE(coverage.complete());
  EXPECT_EQ(coverage.first_missing(), 10);
}

}  // namespace
}  // namespace strata::shard
