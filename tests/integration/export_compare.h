// Bit-for-bit comparison of two exported models (`strata export` safetensors files), for tests
// that promise a run lost nothing: every tensor of one is in the other with the same shape and
// the same bytes.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "storage/safetensors.h"

namespace strata::testing {

inline void ExpectBitIdenticalModels(const std::string& got_path, const std::string& reference_path,
                                     const std::string& reference_name) {
  auto got = storage::ReadSafetensors(got_path);
  auto reference = storage::ReadSafetensors(reference_path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  ASSERT_EQ(got->tensors.size(), reference->tensors.size());
  for (const auto& [name, tensor] : reference->tensors) {
    ASSERT_TRUE(got->tensors.count(name)) << name;
    EXPECT_EQ(got->tensors.at(name).shape, tensor.shape) << name;
    EXPECT_TRUE(got->tensors.at(name).bytes == tensor.bytes) << name << " differs from " << reference_name << "'s";
  }
}

}  // namespace strata::testing
