#include "common/settings.hpp"

#include <charconv>
#include <cstdlib>

#include "common/log.hpp"

namespace softhca {

static_assert(kSettings.size() <= kLogOnceKeys, "setting_number_from's warn-once keys are table indices");

std::string setting_syntax(const Setting& s) {
  switch (s.type) {
    case SettingType::kChoice: {
      std::string out;
      for (const std::string_view word : s.choices) {
        if (!out.empty()) out += '|';
        out += word;
      }
      return out;
    }
    case SettingType::kUnsigned:
      return std::to_string(s.min) + ".." + std::to_string(s.max);
    case SettingType::kText:
      return std::string(s.syntax);
    case SettingType::kPath:
      break;
  }
  return "a path";
}

std::expected<uint32_t, std::string> parse_setting_number(const Setting& s, std::string_view text) {
  const std::string want = "want " + setting_syntax(s);
  switch (s.type) {
    case SettingType::kChoice:
      for (std::size_t i = 0; i < s.choices.size(); ++i)
        if (s.choices[i] == text) return static_cast<uint32_t>(i);
      return std::unexpected(want);
    case SettingType::kUnsigned: {
      // from_chars, unlike strtoul, takes no sign and no leading spaces, so
      // "-1" is an error rather than a huge number.
      uint32_t n = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (ec != std::errc() || end != text.data() + text.size() || n < s.min || n > s.max)
        return std::unexpected(want);
      return n;
    }
    case SettingType::kText:
      return std::unexpected(std::string(s.name) + " is text, not a number");
    case SettingType::kPath:
      break;
  }
  return std::unexpected(std::string(s.name) + " is a path, not a number");
}

std::optional<std::string> setting_problem(const Setting& s, std::string_view text) {
  if (s.type == SettingType::kPath || s.type == SettingType::kText) return std::nullopt;
  auto parsed = parse_setting_number(s, text);
  if (parsed) return std::nullopt;
  return std::move(parsed.error());
}

SettingReading read_setting_number(SettingId id, const char* text) {
  const Setting& s = setting(id);
  if (text == nullptr || *text == '\0') return {s.default_value, std::nullopt};
  auto parsed = parse_setting_number(s, text);
  if (parsed) return {*parsed, std::nullopt};
  return {s.default_value, "ignoring " + std::string(s.name) + " '" + text + "' (" + parsed.error() +
                               "); using the default, " + std::string(s.default_text)};
}

const char* setting_text(SettingId id) noexcept {
  const char* text = std::getenv(setting(id).name.data());
  return text != nullptr && *text != '\0' ? text : nullptr;
}

uint32_t setting_number_from(SettingId id, const char* text) {
  SettingReading reading = read_setting_number(id, text);
  if (reading.warning && log_first_time(static_cast<unsigned>(id))) SOFTHCA_WARN("%s", reading.warning->c_str());
  return reading.value;
}

uint32_t setting_number(SettingId id) { return setting_number_from(id, setting_text(id)); }

}  // namespace softhca
