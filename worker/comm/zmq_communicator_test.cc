#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "kernels/bf16.h"
#include "worker/comm/communicator.h"

namespace strata::worker {
namespace {

// One rank per address, each in its own thread over real sockets; each rank's buffer is seeded
// differently.
void CheckAllReduceOn(const std::vector<std::string>& addresses, const std::optional<curve::ClientKeys>& keys,
                      size_t count) {
  const uint32_t n = static_cast<uint32_t>(addresses.size());
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
      auto comm = CreateZmqCommunicator(context, {r, addresses, 99, 10000, keys});
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
    for (size_t i = 0; i < count; ++i)
      ASSERT_FLOAT_EQ(buffers[r][i], static_cast<float>(expected[i])) << "rank " << r << " i " << i;
    EXPECT_EQ(0, std::memcmp(buffers[r].data(), buffers[0].data(), count * sizeof(float)));
  }
}

// n ranks over ipc sockets.
void CheckAllReduce(uint32_t n, size_t count) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<std::string> addresses;
  for (uint32_t r = 0; r < n; ++r) addresses.push_back("ipc://" + dir + "/r" + std::to_string(r));
  CheckAllReduceOn(addresses, std::nullopt, count);
}

TEST(ZmqCommunicatorTest, OneRankIsANoOp) { CheckAllReduce(1, 10); }
TEST(ZmqCommunicatorTest, TwoRanks) { CheckAllReduce(2, 1001); }
TEST(ZmqCommunicatorTest, ThreeRanksUnevenChunks) { CheckAllReduce(3, 1000); }
TEST(ZmqCommunicatorTest, FewerElementsThanRanks) { CheckAllReduce(4, 2); }

// Runs `body(comm, rank)` on n ranks (threads) over real ipc sockets; returns each rank's status.
template <typename Body>
std::vector<Status> OnRanks(uint32_t n, Body body) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<std::string> addresses;
  for (uint32_t r = 0; r < n; ++r) addresses.push_back("ipc://" + dir + "/r" + std::to_string(r));
  zmq::context_t context;
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ZmqCommunicatorOptions options;
      options.rank = r;
      options.peer_addresses = addresses;
      options.task_token = 42;
      options.peer_timeout_ms = 10000;
      auto comm = CreateZmqCommunicator(context, options);
      results[r] = comm.ok() ? body(**comm, r) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Rank r's value at i: small integers, so every sum is exact in any order.
float Value(uint32_t rank, size_t i) { return static_cast<float>((rank + 1) * 100 + i % 97); }

class CollectivesTest : public ::testing::TestWithParam<std::pair<uint32_t, size_t>> {};

TEST_P(CollectivesTest, ReduceScatterLeavesEachRankTheSumOfItsShard) {
  const auto [n, count] = GetParam();
  auto results = OnRanks(n, [count = count, n = n](Communicator& comm, uint32_t r) -> Status {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = Value(r, i);
    STRATA_RETURN_IF_ERROR(comm.ReduceScatterSum(data.data(), count));
    const auto [begin, end] = ShardRange(count, n, r);
    for (size_t i = begin; i < end; ++i) {
      float expected = 0;
      for (uint32_t k = 0; k < n; ++k) expected += Value(k, i);
      if (data[i] != expected) return Internal("rank " + std::to_string(r) + " element " + std::to_string(i));
    }
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(CollectivesTest, AllGatherAssemblesEveryShard) {
  const auto [n, count] = GetParam();
  auto results = OnRanks(n, [count = count, n = n](Communicator& comm, uint32_t r) -> Status {
    std::vector<float> data(count, -1.0f);
    const auto [begin, end] = ShardRange(count, n, r);
    for (size_t i = begin; i < end; ++i) data[i] = Value(r, i);  // only its own block is set
    STRATA_RETURN_IF_ERROR(comm.AllGather(data.data(), count));
    for (uint32_t k = 0; k < n; ++k) {
      const auto [b, e] = ShardRange(count, n, k);
      for (size_t i = b; i < e; ++i) {
        if (data[i] != Value(k, i)) return Internal("rank " + std::to_string(r) + " element " + std::to_string(i));
      }
    }
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
}

// 16-bit elements (ZeRO-3's bf16 gathers): each element's bits arrive as they were sent.
TEST_P(CollectivesTest, AllGather16AssemblesEveryShardBitForBit) {
  const auto [n, count] = GetParam();
  auto results = OnRanks(n, [count = count, n = n](Communicator& comm, uint32_t r) -> Status {
    auto bits = [](uint32_t rank, size_t i) { return static_cast<uint16_t>((rank * 40503u + i * 2654435761u) >> 7); };
    std::vector<uint16_t> data(count, 0xffff);
    const auto [begin, end] = ShardRange(count, n, r);
    for (size_t i = begin; i < end; ++i) data[i] = bits(r, i);
    STRATA_RETURN_IF_ERROR(comm.AllGather16(data.data(), count));
    for (uint32_t k = 0; k < n; ++k) {
      const auto [b, e] = ShardRange(count, n, k);
      for (size_t i = b; i < e; ++i) {
        if (data[i] != bits(k, i)) return Internal("rank " + std::to_string(r) + " element " + std::to_string(i));
      }
    }
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
}

// The out-of-place forms (ZeRO-3's gathers from the shard and reduce-scatters into the shard's
// gradient): the same blocks as the in-place ones, read from and written to separate buffers.
TEST_P(CollectivesTest, OutOfPlaceFormsGiveTheInPlaceBlocks) {
  const auto [n, count] = GetParam();
  auto results = OnRanks(n, [count = count, n = n](Communicator& comm, uint32_t r) -> Status {
    const auto [begin, end] = ShardRange(count, n, r);
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = Value(r, i);
    std::vector<float> block(end - begin + 1, -7.0f);  // one more: the write stays inside its block
    STRATA_RETURN_IF_ERROR(comm.ReduceScatterSumTo(data.data(), block.data(), count));
    for (size_t i = begin; i < end; ++i) {
      float expected = 0;
      for (uint32_t k = 0; k < n; ++k) expected += Value(k, i);
      if (block[i - begin] != expected)
        return Internal("reduce-scatter: rank " + std::to_string(r) + " element " + std::to_string(i));
    }
    if (block.back() != -7.0f) return Internal("reduce-scatter wrote past rank " + std::to_string(r) + "'s block");
    std::vector<float> mine(end - begin), full(count, -1.0f);
    std::vector<uint16_t> mine16(end - begin), full16(count, 0xffff);
    for (size_t i = begin; i < end; ++i) {
      mine[i - begin] = Value(r, i);
      mine16[i - begin] = static_cast<uint16_t>(Value(r, i)) ^ 0x8001u;
    }
    STRATA_RETURN_IF_ERROR(comm.AllGatherFrom(mine.data(), full.data(), count));
    STRATA_RETURN_IF_ERROR(comm.AllGather16From(mine16.data(), full16.data(), count));
    for (size_t i = 0; i < count; ++i) {
      uint32_t owner = 0;
      while (ShardRange(count, n, owner).second <= i) ++owner;
      if (full[i] != Value(owner, i) || full16[i] != (static_cast<uint16_t>(Value(owner, i)) ^ 0x8001u)) {
        return Internal("all-gather: rank " + std::to_string(r) + " element " + std::to_string(i));
      }
    }
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
}

// bf16 sums (tensor-parallel activations of a bf16 run). Small integers: every partial sum is
// exact in bf16, so the result is too. Values that bf16 cannot hold exactly: within one rounding
// per addition of the exact sum, and every rank ends with the same bits.
TEST_P(CollectivesTest, Bf16SumsAreTheSumsInEveryRankAlike) {
  const auto [n, count] = GetParam();
  std::vector<std::vector<uint16_t>> rounded(n);
  auto results = OnRanks(n, [&, count = count, n = n](Communicator& comm, uint32_t r) -> Status {
    auto small = [](uint32_t rank, size_t i) { return static_cast<float>(rank + 1 + i % 7); };
    std::vector<uint16_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = kernels::FloatToBf16(small(r, i));
    STRATA_RETURN_IF_ERROR(comm.AllReduceSumBf16(data.data(), count));
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (uint32_t k = 0; k < n; ++k) expected += small(k, i);
      if (kernels::Bf16ToFloat(data[i]) != expected)
        return Internal("all-reduce: rank " + std::to_string(r) + " element " + std::to_string(i));
    }
    const auto [begin, end] = ShardRange(count, n, r);
    for (size_t i = 0; i < count; ++i) data[i] = kernels::FloatToBf16(small(r, i));
    std::vector<uint16_t> block(end - begin + 1, 0x7777);  // one more: the write stays inside its block
    STRATA_RETURN_IF_ERROR(comm.ReduceScatterSumBf16To(data.data(), block.data(), count));
    for (size_t i = begin; i < end; ++i) {
      float expected = 0;
      for (uint32_t k = 0; k < n; ++k) expected += small(k, i);
      if (kernels::Bf16ToFloat(block[i - begin]) != expected)
        return Internal("reduce-scatter: rank " + std::to_string(r) + " element " + std::to_string(i));
    }
    if (block.back() != 0x7777) return Internal("reduce-scatter wrote past rank " + std::to_string(r) + "'s block");
    auto inexact = [](uint32_t rank, size_t i) { return 1.0f / static_cast<float>(3 + rank + i % 11); };
    for (size_t i = 0; i < count; ++i) data[i] = kernels::FloatToBf16(inexact(r, i));
    STRATA_RETURN_IF_ERROR(comm.AllReduceSumBf16(data.data(), count));
    for (size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (uint32_t k = 0; k < n; ++k) exact += inexact(k, i);
      // Each input rounded once, each of the n - 1 additions once: 2^-8 relative apiece.
      if (std::abs(kernels::Bf16ToFloat(data[i]) - exact) > exact * (2.0 * n) / 256) {
        return Internal("inexact all-reduce: rank " + std::to_string(r) + " element " + std::to_string(i));
      }
    }
    rounded[r] = data;
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
  for (uint32_t r = 1; r < n; ++r) EXPECT_EQ(rounded[r], rounded[0]) << "rank " << r << "'s bits differ from rank 0's";
}

TEST_P(CollectivesTest, BroadcastFromEveryRootThenAllReduceInOneSequence) {
  const auto [n, count] = GetParam();
  auto results = OnRanks(n, [count = count, n = n](Communicator& comm, uint32_t r) -> Status {
    for (uint32_t root = 0; root < n; ++root) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = Value(r, i);
      STRATA_RETURN_IF_ERROR(comm.Broadcast(data.data(), count, root));
      for (size_t i = 0; i < count; ++i) {
        if (data[i] != Value(root, i)) return Internal("root " + std::to_string(root) + " rank " + std::to_string(r));
      }
    }
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = Value(r, i);
    STRATA_RETURN_IF_ERROR(comm.AllReduceSum(data.data(), count));
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (uint32_t k = 0; k < n; ++k) expected += Value(k, i);
      if (data[i] != expected) return Internal("all-reduce after broadcasts, element " + std::to_string(i));
    }
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectivesTest,
                         ::testing::Values(std::pair<uint32_t, size_t>{1, 5}, std::pair<uint32_t, size_t>{2, 1001},
                                           std::pair<uint32_t, size_t>{3, 1000}, std::pair<uint32_t, size_t>{4, 3}));

// A 2 x 2 mesh: rows {0,1}, {2,3} and columns {0,2}, {1,3} all-reduce in their groups while
// point-to-point traffic of the world crosses them, in orders that differ per rank (rank 3
// sends before it reduces, rank 2 receives after it): the mailbox sorts it out.
// A peer restarting its task still has its previous task's socket bound at its address for a
// moment (here: a plain PULL socket the test holds for 300 ms). Whatever is pushed to it then is
// lost with it; the handshake's resent hello makes the new pair's first transfer wait for the new
// socket, so the all-reduce completes (without it rank 0's chunk vanished and both ranks waited
// out their deadline).
TEST(ZmqCommunicatorTest, APeersStaleSocketLosesNothingOfTheNewTask) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> addresses = {"ipc://" + dir + "/r0", "ipc://" + dir + "/r1"};
  zmq::context_t context;
  auto stale = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pull);
  stale->set(zmq::sockopt::linger, 0);
  stale->bind(addresses[1]);
  std::vector<float> a(6, 1.0f), b(6, 2.0f);
  Status rank0, rank1;
  std::thread first([&] {
    auto comm = CreateZmqCommunicator(context, {0, addresses, 5, 5000, std::nullopt});
    rank0 = comm.ok() ? (*comm)->AllReduceSum(a.data(), a.size()) : comm.status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is already sending
  stale.reset();                                                // the old task ends; the new one binds the same address
  std::thread second([&] {
    auto comm = CreateZmqCommunicator(context, {1, addresses, 5, 5000, std::nullopt});
    rank1 = comm.ok() ? (*comm)->AllReduceSum(b.data(), b.size()) : comm.status();
  });
  first.join();
  second.join();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(rank0.ok()) << rank0.ToString();
  ASSERT_TRUE(rank1.ok()) << rank1.ToString();
  EXPECT_EQ(a, std::vector<float>(6, 3.0f));
  EXPECT_EQ(b, std::vector<float>(6, 3.0f));
}

// The watchdog's answer: a rank whose peer never starts names it after the deadline.
TEST(ZmqCommunicatorTest, APeerThatNeverStartsIsNamed) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  zmq::context_t context;
  auto comm = CreateZmqCommunicator(
      context, {0, {"ipc://" + dir + "/r0", "ipc://" + dir + "/r1", "ipc://" + dir + "/r2"}, 5, 500, std::nullopt});
  ASSERT_TRUE(comm.ok());
  std::vector<float> a(3, 1.0f);
  Status st = (*comm)->AllReduceSum(a.data(), a.size());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("to start the task"), std::string::npos) << st.ToString();
  EXPECT_EQ((*comm)->missing_peer(), 2);
}

TEST(ZmqCommunicatorTest, GroupsAndPointToPointInterleave) {
  auto results = OnRanks(4, [](Communicator& world, uint32_t r) -> Status {
    STRATA_ASSIGN_OR_RETURN(auto row, world.Split({{0, 1}, {2, 3}}));
    STRATA_ASSIGN_OR_RETURN(auto column, world.Split({{0, 2}, {1, 3}}));
    if (row->world_size() != 2 || row->rank() != r % 2 || column->rank() != r / 2) {
      return Internal("rank " + std::to_string(r) + " got the wrong group rank");
    }
    const double payload = 1000.0 + r;
    double received = 0;
    if (r == 3) STRATA_RETURN_IF_ERROR(world.Send(&payload, sizeof(payload), 2));
    std::vector<float> a(10, static_cast<float>(r)), b(7, static_cast<float>(r * 10));
    STRATA_RETURN_IF_ERROR(row->AllReduceSum(a.data(), a.size()));
    STRATA_RETURN_IF_ERROR(column->AllReduceSum(b.data(), b.size()));
    if (r == 2) STRATA_RETURN_IF_ERROR(world.Recv(&received, sizeof(received), 3));
    const float row_sum = r < 2 ? 0 + 1 : 2 + 3;
    const float column_sum = 10.0f * (r % 2 == 0 ? 0 + 2 : 1 + 3);
    for (float v : a) {
      if (v != row_sum) return Internal("row sum on rank " + std::to_string(r) + ": " + std::to_string(v));
    }
    for (float v : b) {
      if (v != column_sum) return Internal("column sum on rank " + std::to_string(r) + ": " + std::to_string(v));
    }
    if (r == 2 && received != 1003.0) return Internal("rank 2 received " + std::to_string(received));
    return Status::Ok();
  });
  for (auto& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(ZmqCommunicatorTest, WrongSizedReceiveNamesTheMismatch) {
  auto results = OnRanks(2, [](Communicator& world, uint32_t r) -> Status {
    std::vector<float> data(r == 0 ? 4 : 6, 1.0f);
    if (r == 0) return world.Send(data.data(), data.size() * sizeof(float), 1);
    return world.Recv(data.data(), data.size() * sizeof(float), 0);
  });
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(results[1].code(), StatusCode::kInternal);
  EXPECT_NE(results[1].message().find("16 bytes where 24"), std::string::npos) << results[1].ToString();
}

TEST(ZmqCommunicatorTest, BroadcastRejectsARootOutsideTheWorld) {
  auto results = OnRanks(1, [](Communicator& comm, uint32_t) -> Status {
    float x = 1;
    return comm.Broadcast(&x, 1, 3);
  });
  EXPECT_EQ(results[0].code(), StatusCode::kInvalidArgument);
}

TEST(ZmqCommunicatorTest, AbortUnblocksAWaitingRank) {
  char tmpl[] = "/tmp/strata-comm-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<std::string> addresses = {"ipc://" + dir + "/a", "ipc://" + dir + "/b"};
  zmq::context_t context;
  auto comm = CreateZmqCommunicator(context, {0, addresses, 1, 60000, std::nullopt});
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
  auto comm = CreateZmqCommunicator(context, {0, addresses, 1, 300, std::nullopt});
  ASSERT_TRUE(comm.ok());
  std::vector<float> data(8, 1.0f);
  Status st = (*comm)->AllReduceSum(data.data(), data.size());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos);
}

// ---------------------------------------------------------------- CURVE on tcp

// A loopback port that was free a moment ago (the communicator binds a concrete address).
int FreePort() {
  zmq::context_t context;
  zmq::socket_t probe(context, zmq::socket_type::pull);
  probe.bind("tcp://127.0.0.1:*");
  const std::string endpoint = probe.get(zmq::sockopt::last_endpoint);
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

curve::ClientKeys ClusterKeys() {
  char tmpl[] = "/tmp/strata-comm-keys-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  EXPECT_TRUE(curve::WriteKeyDirectory(dir, false).ok());
  auto keys = curve::LoadClientKeys(dir, "client", /*with_authorized=*/true);
  EXPECT_TRUE(keys.ok()) << keys.status().ToString();
  return *keys;
}

TEST(ZmqCommunicatorCurveTest, TwoRanksOverTcpWithCurve) {
  const curve::ClientKeys keys = ClusterKeys();
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) {
    addresses.push_back(curve::AddressWithKey("tcp://127.0.0.1:" + std::to_string(FreePort()), keys.own.public_key));
  }
  CheckAllReduceOn(addresses, keys, 1001);
}

TEST(ZmqCommunicatorCurveTest, TcpWithoutKeysIsRefused) {
  zmq::context_t context;
  std::vector<std::string> addresses = {"tcp://127.0.0.1:" + std::to_string(FreePort()),
                                        "tcp://127.0.0.1:" + std::to_string(FreePort())};
  auto comm = CreateZmqCommunicator(context, {0, addresses, 1, 1000, std::nullopt});
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("--keys"), std::string::npos) << comm.status().ToString();
}

// Rank 1 waits for rank 0, which never comes; instead a stranger sends it the two well-formed
// chunks (right token, sequence and sizes) that would complete its all-reduce. Only a sender
// with an authorized key gets them in (the control case shows the frames would be accepted).
Status InjectIntoRank1(const curve::ClientKeys& rank_keys, const std::optional<curve::KeyPair>& attacker,
                       std::vector<float>* data) {
  const std::string rank1 = "tcp://127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::string> addresses = {
      curve::AddressWithKey("tcp://127.0.0.1:" + std::to_string(FreePort()), rank_keys.own.public_key),
      curve::AddressWithKey(rank1, rank_keys.own.public_key)};
  constexpr uint64_t kToken = 7;
  zmq::context_t context;
  auto comm = CreateZmqCommunicator(context, {1, addresses, kToken, 1500, rank_keys});
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  if (!comm.ok()) return comm.status();

  zmq::context_t attacker_context;
  zmq::socket_t push(attacker_context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  if (attacker) curve::ConfigureClient(push, *attacker, rank_keys.own.public_key);  // public keys are public
  push.connect(rank1);
  const std::vector<float> evil(2, 1e6f);
  // Rank 0's side of the start-up handshake: its hello, and the ack of rank 1's hello.
  for (const char what : {'H', 'A'}) {
    const uint64_t header[4] = {kToken, /*group=*/~uint64_t{0}, 0, /*source=*/0};
    push.send(zmq::buffer(header, sizeof(header)), zmq::send_flags::sndmore);
    push.send(zmq::buffer(&what, 1), zmq::send_flags::none);
  }
  for (uint64_t seq = 0; seq < 2; ++seq) {
    // Rank 1 of 2 receives two chunks from rank 0 (reduce-scatter, then all-gather).
    const uint64_t header[4] = {kToken, /*group=*/0, seq, /*source=*/0};
    push.send(zmq::buffer(header, sizeof(header)), zmq::send_flags::sndmore);
    push.send(zmq::buffer(evil.data(), evil.size() * sizeof(float)), zmq::send_flags::none);
  }
  return (*comm)->AllReduceSum(data->data(), data->size());
}

TEST(ZmqCommunicatorCurveTest, StrangersCannotInjectChunks) {
  const curve::ClientKeys keys = ClusterKeys();
  std::vector<float> data(4, 1.0f);
  // No CURVE at all.
  Status st = InjectIntoRank1(keys, std::nullopt, &data);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_EQ(data, std::vector<float>(4, 1.0f));
  // A valid CURVE key pair that is not in authorized_keys.
  auto stranger = curve::GenerateKeyPair();
  ASSERT_TRUE(stranger.ok());
  st = InjectIntoRank1(keys, *stranger, &data);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_EQ(data, std::vector<float>(4, 1.0f));
  // Control: the same frames from an authorized key are taken, so the refusals above are real.
  st = InjectIntoRank1(keys, keys.own, &data);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(data, std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace strata::worker
