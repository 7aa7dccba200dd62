#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "worker/communicator.h"

namespace strata::worker {
namespace {

// n ranks in n threads over real ipc sockets; each rank's buffer is seeded differently.
void CheckAllReduce(uint32_t n, size_t count) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<std::string> addresses;
  for (uint32_t r = 0; r < n; ++r) addresses.push_back("ipc://" + dir + "/r" + std::to_string(r));
  std::vector<std::vector<float>> buffers(n, std::vector<float>(count));
  std::vector<double> expected(count, 0.0);
  for (uint32_t r = 0; r < n; ++r) {
    std::mt19937 rng(r + 1);
    std::uniform_int_distribution<int> dist(-1000, 1000);
    for (size_t i = 0; i < count; ++i) {
      buffers[r][i] = dist(rng) / 8.0f;  // exactly representable: sums are exact in any order
      expected[i] += buffers[r][i];
    }
  }
  zmq::context_t context;
  std::vector<std::thread> threads;
  std::vector<Status> results(n);
  for (uint32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = CreateZmqCommunicator(context, {r, addresses, 99, 10000});
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      for (int round = 0; round < 3 && results[r].ok(); ++round) {
        results[r] = (*comm)->AllReduceSum(buffers[r].data(), count);
        if (round < 2) {
          for (auto& v : buffers[r]) v /= static_cast<float>(n);  // back to the mean: same sum again
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t r = 0; r < n; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].ToString();
    for (size_t i = 0; i < count; ++i) ASSERT_FLOAT_EQ(buffers[r][i], static_cast<float>(expected[i])) << "rank " << r << " i " << i;
    EXPECT_EQ(0, std::memcmp(buffers[r].data(), buffers[0].data(), count * sizeof(float)));
  }
}

TEST(ZmqCommunicatorTest, OneRankIsANoOp) { CheckAllReduce(1, 10); }
TEST(ZmqCommunicatorTest, TwoRanks) { CheckAllReduce(2, 1001); }
TEST(ZmqCommunicatorTest, ThreeRanksUnevenChunks) { CheckAllReduce(3, 1000); }
TEST(ZmqCommunicatorTest, FewerElementsThanRanks) { CheckAllReduce(4, 2); }

TEST(ZmqCommunicatorTest, AbortUnblocksAWaitingRank) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<std::string> addresses = {"ipc://" + dir + "/a", "ipc://" + dir + "/b"};
  zmq::context_t context;
  auto comm = CreateZmqCommunicator(context, {0, addresses, 1, 60000});
  ASSERT_TRUE(comm.ok());
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (*comm)->Abort();
  });
  std::vector<float> data(8, 1.0f);
  Status st = (*comm)->AllReduceSum(data.data(), data.size());  // rank 1 never shows up
  aborter.join();
  EXPECT_EQ(st.code(), StatusCode::kAborted);
}

TEST(ZmqCommunicatorTest, SilentPeerTimesOutNamingIt) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<std::string> addresses = {"ipc://" + dir + "/a", "ipc://" + dir + "/b"};
  zmq::context_t context;
  auto comm = CreateZmqCommunicator(context, {0, addresses, 1, 300});
  ASSERT_TRUE(comm.ok());
  std::vector<float> data(8, 1.0f);
  Status st = (*comm)->AllReduceSum(data.data(), data.size());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos);
}

}  // namespace
}  // namespace strata::worker
