// core/env.h: the strict parsers of the MESHTRAIN_* environment variables.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.h"
#include "core/error.h"

namespace {

constexpr const char* kVar = "MESHTRAIN_TEST_ENV_VALUE";

TEST(EnvFlag, UnsetEmptyZeroOneAndAnythingElse) {
  ::unsetenv(kVar);
  EXPECT_FALSE(mt::env_flag(kVar).has_value());
  ::setenv(kVar, "", 1);
  EXPECT_FALSE(mt::env_flag(kVar).has_value());
  ::setenv(kVar, "0", 1);
  EXPECT_EQ(mt::env_flag(kVar), std::optional<bool>(false));
  ::setenv(kVar, "1", 1);
  EXPECT_EQ(mt::env_flag(kVar), std::optional<bool>(true));
  for (const char* bad : {"yes", "true", "2", "10", "1 ", "off"}) {
    ::setenv(kVar, bad, 1);
    try {
      mt::env_flag(kVar);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const mt::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(kVar) + "=" + bad), std::string::npos) << e.what();
    }
  }
  ::unsetenv(kVar);
}

TEST(EnvInt, AnIntegerInRangeOnly) {
  ::setenv(kVar, "64", 1);
  EXPECT_EQ(mt::env_int(kVar, 4, 65536), std::optional<long>(64));
  for (const char* bad : {"64abc", "3", "65537", "x", "6 4"}) {
    ::setenv(kVar, bad, 1);
    EXPECT_THROW(mt::env_int(kVar, 4, 65536), mt::InputError) << bad;
  }
  ::unsetenv(kVar);
  EXPECT_FALSE(mt::env_int(kVar, 4, 65536).has_value());
}

TEST(EnvIntPair, TwoNonNegativeIntegersOnly) {
  ::unsetenv(kVar);
  EXPECT_FALSE(mt::env_int_pair(kVar).has_value());
  ::setenv(kVar, "300,2000", 1);
  EXPECT_EQ(mt::env_int_pair(kVar), (std::optional<std::pair<int, int>>{{300, 2000}}));
  ::setenv(kVar, "0,0", 1);
  EXPECT_EQ(mt::env_int_pair(kVar), (std::optional<std::pair<int, int>>{{0, 0}}));
  for (const char* bad : {"300", "300,", "300,2000,5", "-1,5", "5,-1", "a,b", "300,2000x"}) {
    ::setenv(kVar, bad, 1);
    EXPECT_THROW(mt::env_int_pair(kVar), mt::InputError) << bad;
  }
  ::unsetenv(kVar);
}

}  // namespace
