#include "common/curve.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/net.h"

namespace strata::curve {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  char tmpl[] = "/tmp/strata-curve-XXXXXX";
  return mkdtemp(tmpl);
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(0, stat(path.c_str(), &st)) << path;
  return st.st_mode & 0777;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CurveKeysTest, KeygenWritesPrivateKeysAndAuthorizesTheClient) {
  const std::string dir = TempDir() + "/keys";
  ASSERT_TRUE(WriteKeyDirectory(dir, false).ok());
  EXPECT_EQ(0700u, ModeOf(dir));
  EXPECT_EQ(0600u, ModeOf(dir + "/coordinator.key"));
  EXPECT_EQ(0600u, ModeOf(dir + "/client.key"));
  EXPECT_EQ(0644u, ModeOf(dir + "/coordinator.pub"));
  auto server = LoadServerKeys(dir);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = LoadClientKeys(dir);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(client->coordinator_public_key, server->own.public_key);
  EXPECT_EQ(1u, server->authorized.size());
  EXPECT_EQ(1u, server->authorized.count(client->own.public_key));
  EXPECT_NE(server->own.public_key, client->own.public_key);
}

TEST(CurveKeysTest, KeygenRefusesToOverwriteUnlessForced) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteKeyDirectory(dir, false).ok());
  const std::string before = ReadAll(dir + "/coordinator.key");
  Status again = WriteKeyDirectory(dir, false);
  EXPECT_EQ(StatusCode::kAlreadyExists, again.code());
  EXPECT_NE(std::string::npos, again.message().find("--force")) << again.message();
  EXPECT_EQ(before, ReadAll(dir + "/coordinator.key"));
  ASSERT_TRUE(WriteKeyDirectory(dir, true).ok());
  EXPECT_NE(before, ReadAll(dir + "/coordinator.key"));
  EXPECT_EQ(0600u, ModeOf(dir + "/coordinator.key"));
}

TEST(CurveKeysTest, LoadingExplainsWhatIsWrong) {
  const std::string dir = TempDir();
  auto missing = LoadServerKeys(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string::npos, missing.status().message().find("coordinator.key")) << missing.status().message();
  EXPECT_NE(std::string::npos, missing.status().message().find("strata keygen")) << missing.status().message();

  ASSERT_TRUE(WriteKeyDirectory(dir, false).ok());
  chmod((dir + "/coordinator.key").c_str(), 0644);
  auto readable = LoadServerKeys(dir);
  ASSERT_FALSE(readable.ok());
  EXPECT_NE(std::string::npos, readable.status().message().find("chmod 600")) << readable.status().message();
  chmod((dir + "/coordinator.key").c_str(), 0600);

  std::ofstream(dir + "/authorized_keys", std::ios::app) << "not-a-key\n";
  auto bad_line = LoadAuthorizedKeys(dir);
  ASSERT_FALSE(bad_line.ok());
  EXPECT_NE(std::string::npos, bad_line.status().message().find("authorized_keys:4")) << bad_line.status().message();

  // A .pub from another pair is caught before it causes baffling handshake failures.
  const std::string other = TempDir();
  ASSERT_TRUE(WriteKeyDirectory(other, false).ok());
  fs::copy_file(other + "/client.pub", dir + "/client.pub", fs::copy_options::overwrite_existing);
  auto mismatch = LoadKeyPair(dir, "client");
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(std::string::npos, mismatch.status().message().find("does not match")) << mismatch.status().message();
}

// A ROUTER CURVE server with a ZAP handler on tcp loopback, answering "pong" on its own thread.
class EchoServer {
 public:
  explicit EchoServer(const ServerKeys& keys) : router_(context_, zmq::socket_type::router) {
    auto zap = ZapHandler::Bind(context_, keys.authorized, "test server");
    EXPECT_TRUE(zap.ok());
    zap_ = std::move(zap).value();
    router_.set(zmq::sockopt::linger, 0);
    ConfigureServer(router_, keys.own);
    router_.bind("tcp://127.0.0.1:*");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] {
      std::vector<zmq::message_t> frames;
      while (!stop_.load()) {
        if (!PollWithZap(router_, zap_.get(), 20) || !net::RecvMultipart(router_, &frames, 0)) continue;
        router_.send(frames[0], zmq::send_flags::sndmore);
        router_.send(zmq::str_buffer("pong"));
      }
    });
  }
  ~EchoServer() {
    stop_.store(true);
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  int refused() const { return zap_->refused(); }

 private:
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t router_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// True if a DEALER configured by `configure` gets an answer within 1.5 s.
template <typename Configure>
bool Ping(const std::string& endpoint, Configure configure) {
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  configure(dealer);
  dealer.connect(endpoint);
  dealer.send(zmq::str_buffer("ping"), zmq::send_flags::dontwait);
  std::vector<zmq::message_t> frames;
  return net::RecvMultipart(dealer, &frames, 1500) && frames.size() == 1 && frames[0].to_string() == "pong";
}

TEST(ZapHandlerTest, OnlyAuthorizedKeysGetThrough) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteKeyDirectory(dir, false).ok());
  auto server_keys = LoadServerKeys(dir);
  auto client_keys = LoadClientKeys(dir);
  ASSERT_TRUE(server_keys.ok() && client_keys.ok());
  EchoServer server(*server_keys);

  EXPECT_TRUE(Ping(server.endpoint(), [&](zmq::socket_t& s) {
    ConfigureClient(s, client_keys->own, client_keys->coordinator_public_key);
  }));
  EXPECT_EQ(0, server.refused());

  // A valid CURVE key pair that is not in authorized_keys: the handshake completes, ZAP says no.
  auto stranger = GenerateKeyPair();
  ASSERT_TRUE(stranger.ok());
  EXPECT_FALSE(Ping(server.endpoint(),
                    [&](zmq::socket_t& s) { ConfigureClient(s, *stranger, client_keys->coordinator_public_key); }));
  EXPECT_GE(server.refused(), 1);

  // No CURVE at all (the NULL mechanism): the handshake fails before any message is accepted.
  EXPECT_FALSE(Ping(server.endpoint(), [](zmq::socket_t&) {}));

  // The server keeps serving authorized clients after refusing others.
  EXPECT_TRUE(Ping(server.endpoint(), [&](zmq::socket_t& s) {
    ConfigureClient(s, client_keys->own, client_keys->coordinator_public_key);
  }));
}

// Anyone who can reach the port can make refusals; they are logged at most once per interval, with
// how many more there were. ZAP requests go straight to the handler over its inproc endpoint.
TEST(ZapHandlerTest, RefusalsAreLoggedAtMostOncePerInterval) {
  zmq::context_t context;
  auto zap = ZapHandler::Bind(context, {}, "test server", /*log_interval_ms=*/400);
  ASSERT_TRUE(zap.ok()) << zap.status().ToString();
  zmq::socket_t req(context, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.connect("inproc://zeromq.zap.01");
  auto refuse = [&](int i) {
    const std::string key(32, static_cast<char>('a' + i % 26));
    const std::string address = "10.0.0." + std::to_string(i);
    req.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    req.send(zmq::buffer(std::to_string(i)), zmq::send_flags::sndmore);
    req.send(zmq::str_buffer("strata"), zmq::send_flags::sndmore);
    req.send(zmq::buffer(address), zmq::send_flags::sndmore);
    req.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    req.send(zmq::str_buffer("CURVE"), zmq::send_flags::sndmore);
    req.send(zmq::buffer(key), zmq::send_flags::none);
    (*zap)->ServePending();
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(net::RecvMultipart(req, &reply, 1000));
    ASSERT_GE(reply.size(), 3u);
    EXPECT_EQ(reply[2].to_string(), "400");
  };
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };

  testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) refuse(i);
  (*zap)->FlushRefusedLog();  // the interval has not passed: nothing yet
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "refused a CURVE connection from 10.0.0.0: public key"), 1u) << log;
  EXPECT_EQ(count(log, "refused"), 1u) << "50 refusals within the interval must make one line:\n" << log;
  EXPECT_EQ(50, (*zap)->refused());

  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  testing::internal::CaptureStderr();
  (*zap)->FlushRefusedLog();
  log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "49 more connection(s) refused"), 1u) << log;
  EXPECT_NE(log.find("10.0.0.49"), std::string::npos) << "names the latest: " << log;

  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  testing::internal::CaptureStderr();
  refuse(60);
  refuse(61);
  log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "refused"), 1u) << log;
  EXPECT_EQ(count(log, "10.0.0.60"), 1u) << log;
}

TEST(CurveTest, OnlyNetworkEndpointsRequireCurve) {
  EXPECT_TRUE(RequiresCurve("tcp://127.0.0.1:5555"));
  EXPECT_TRUE(RequiresCurve("tcp://0.0.0.0:5555"));
  EXPECT_FALSE(RequiresCurve("ipc:///tmp/x.sock"));
  EXPECT_FALSE(RequiresCurve("inproc://x"));
}

}  // namespace
}  // namespace strata::curve
