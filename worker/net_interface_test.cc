// --net-interface: an interface the host has becomes NCCL_SOCKET_IFNAME; one it lacks is refused
// with the flag and the name in the message, and the environment is left as it was.
#include "worker/net_interface.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace strata::worker {
namespace {

TEST(UseNetInterface, SetsNcclSocketIfnameToAnInterfaceTheHostHas) {
  setenv("NCCL_SOCKET_IFNAME", "eth9", 1);  // the flag wins over the environment
  ASSERT_TRUE(UseNetInterface("lo").ok());  // every Linux host has lo
  ASSERT_NE(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "lo");
  unsetenv("NCCL_SOCKET_IFNAME");
}

TEST(UseNetInterface, RefusesAnInterfaceTheHostLacksAndNamesIt) {
  unsetenv("NCCL_SOCKET_IFNAME");
  const Status st = UseNetInterface("nosuch0");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--net-interface nosuch0"), std::string::npos) << st.message();
  EXPECT_EQ(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
}

TEST(UseNetInterface, EmptyLeavesTheEnvironmentAlone) {
  setenv("NCCL_SOCKET_IFNAME", "ib0", 1);
  ASSERT_TRUE(UseNetInterface("").ok());
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "ib0");
  unsetenv("NCCL_SOCKET_IFNAME");
}

}  // namespace
}  // namespace strata::worker
