// common/settings: the table of SOFTHCA_* settings, the parser every setting
// goes through, and the fallback to the default (with one warning) on a bad
// value. The environment itself is not touched: the readers take the text as
// the environment would hold it.
#include "common/settings.hpp"

#include <gtest/gtest.h>

#include <string>

#include "common/log.hpp"

namespace softhca {
namespace {

const Setting& log_row() { return setting(SettingId::kLog); }
const Setting& timeout_row() { return setting(SettingId::kCmResponseTimeout); }
const Setting& retries_row() { return setting(SettingId::kCmMaxRetries); }

TEST(SettingsTable, RowsAreFoundByTheirId) {
  for (const Setting& s : kSettings) EXPECT_EQ(&setting(s.id), &s) << s.name;
  EXPECT_EQ(setting(SettingId::kLogFile).name, "SOFTHCA_LOG_FILE");
  EXPECT_EQ(setting(SettingId::kRuntimeDir).name, "SOFTHCA_RUNTIME_DIR");
}

TEST(SettingsTable, EveryDefaultTextParsesToTheDefaultValue) {
  for (const Setting& s : kSettings) {
    if (s.type == SettingType::kPath || s.type == SettingType::kText) continue;
    auto parsed = parse_setting_number(s, s.default_text);
    ASSERT_TRUE(parsed.has_value()) << s.name << ": " << parsed.error();
    EXPECT_EQ(*parsed, s.default_value) << s.name;
  }
}

TEST(SettingsTable, SyntaxIsWhatUsersType) {
  EXPECT_EQ(setting_syntax(log_row()), "error|warn|info|debug|trace");
  EXPECT_EQ(setting_syntax(timeout_row()), "0..31");
  EXPECT_EQ(setting_syntax(retries_row()), "0..15");
  EXPECT_EQ(setting_syntax(setting(SettingId::kLogFile)), "a path");
  EXPECT_EQ(setting_syntax(setting(SettingId::kPcap)), "a path");
}

TEST(SettingsParse, LogWordsAreLogLevelsInOrder) {
  EXPECT_EQ(parse_setting_number(log_row(), "error").value_or(99), static_cast<uint32_t>(LogLevel::kError));
  EXPECT_EQ(parse_setting_number(log_row(), "warn").value_or(99), static_cast<uint32_t>(LogLevel::kWarn));
  EXPECT_EQ(parse_setting_number(log_row(), "info").value_or(99), static_cast<uint32_t>(LogLevel::kInfo));
  EXPECT_EQ(parse_setting_number(log_row(), "debug").value_or(99), static_cast<uint32_t>(LogLevel::kDebug));
  EXPECT_EQ(parse_setting_number(log_row(), "trace").value_or(99), static_cast<uint32_t>(LogLevel::kTrace));
}

TEST(SettingsParse, LogWordMustMatchExactly) {
  for (const char* bad : {"INFO", "inf", "info ", "", "3"}) {
    auto parsed = parse_setting_number(log_row(), bad);
    ASSERT_FALSE(parsed.has_value()) << "'" << bad << "'";
    EXPECT_EQ(parsed.error(), "want error|warn|info|debug|trace");
  }
}

TEST(SettingsParse, NumbersInRangeAreTaken) {
  EXPECT_EQ(parse_setting_number(timeout_row(), "0").value_or(99), 0u);
  EXPECT_EQ(parse_setting_number(timeout_row(), "31").value_or(99), 31u);
  EXPECT_EQ(parse_setting_number(timeout_row(), "016").value_or(99), 16u);  // decimal, not octal
  EXPECT_EQ(parse_setting_number(retries_row(), "15").value_or(99), 15u);
}

TEST(SettingsParse, NumbersOutOfRangeOrMalformedAreRefused) {
  // "-1" is the case strtoul got wrong: it wraps to a huge number.
  for (const char* bad : {"32", "-1", "+1", " 5", "5 ", "5x", "0x10", "1e1", "", "4294967296",
                          "99999999999999999999"}) {
    auto parsed = parse_setting_number(timeout_row(), bad);
    ASSERT_FALSE(parsed.has_value()) << "'" << bad << "' gave " << parsed.value_or(0);
    EXPECT_EQ(parsed.error(), "want 0..31");
  }
  EXPECT_FALSE(parse_setting_number(retries_row(), "16").has_value());
}

TEST(SettingsParse, ProblemNamesWhatIsWantedAndPathsHaveNone) {
  EXPECT_EQ(setting_problem(retries_row(), "16").value_or(""), "want 0..15");
  EXPECT_FALSE(setting_problem(retries_row(), "3").has_value());
  EXPECT_FALSE(setting_problem(setting(SettingId::kRuntimeDir), "relative/dir").has_value());
  EXPECT_FALSE(setting_problem(setting(SettingId::kLogFile), "/no/such/dir/log").has_value());
}

TEST(SettingsRead, UnsetOrEmptyIsTheDefaultWithoutWarning) {
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const SettingReading r = read_setting_number(SettingId::kCmMaxRetries, unset);
    EXPECT_EQ(r.value, 15u);
    EXPECT_FALSE(r.warning.has_value());
  }
  EXPECT_EQ(read_setting_number(SettingId::kLog, nullptr).value, static_cast<uint32_t>(LogLevel::kWarn));
}

TEST(SettingsRead, ValidTextIsItsValue) {
  const SettingReading r = read_setting_number(SettingId::kCmResponseTimeout, "16");
  EXPECT_EQ(r.value, 16u);
  EXPECT_FALSE(r.warning.has_value());
  EXPECT_EQ(read_setting_number(SettingId::kLog, "debug").value, static_cast<uint32_t>(LogLevel::kDebug));
}

TEST(SettingsRead, BadTextIsTheDefaultWithAWarningThatSaysWhy) {
  const SettingReading r = read_setting_number(SettingId::kCmMaxRetries, "16");
  EXPECT_EQ(r.value, 15u);
  EXPECT_EQ(r.warning.value_or(""), "ignoring SOFTHCA_CM_MAX_RETRIES '16' (want 0..15); using the default, 15");
  const SettingReading level = read_setting_number(SettingId::kLog, "loud");
  EXPECT_EQ(level.value, static_cast<uint32_t>(LogLevel::kWarn));
  EXPECT_EQ(level.warning.value_or(""),
            "ignoring SOFTHCA_LOG 'loud' (want error|warn|info|debug|trace); using the default, warn");
}

// setting_number_from is what the CM calls at every request: a bad value
// must not log a line per connection. Only this test warns about
// SOFTHCA_CM_RESPONSE_TIMEOUT in this executable, and ctest runs each test in
// a process of its own.
TEST(SettingsRead, BadTextIsWarnedAboutOncePerProcess) {
  if (!log_enabled(LogLevel::kWarn)) GTEST_SKIP() << "SOFTHCA_LOG in this environment hides warnings";
  if (setting_text(SettingId::kLogFile) != nullptr)
    GTEST_SKIP() << "SOFTHCA_LOG_FILE in this environment sends the log away from stderr";
  ::testing::internal::CaptureStderr();
  const uint32_t first = setting_number_from(SettingId::kCmResponseTimeout, "40");
  const uint32_t second = setting_number_from(SettingId::kCmResponseTimeout, "41");
  const uint32_t good = setting_number_from(SettingId::kCmResponseTimeout, "8");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, 20u);
  EXPECT_EQ(second, 20u);
  EXPECT_EQ(good, 8u);
  EXPECT_EQ(err,
            "softhca warn: ignoring SOFTHCA_CM_RESPONSE_TIMEOUT '40' (want 0..31); using the default, 20\n");
}

}  // namespace
}  // namespace softhca
