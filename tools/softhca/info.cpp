// softhca info: what someone debugging a setup asks first (which version,
// which libraries `softhca run` loads, where the shared state lives and
// whether it can), and with -c every SOFTHCA_* setting with its value in this
// environment, its default and its help, from the one table the libraries
// read (common/settings.hpp).
//
// It reports and changes nothing: the runtime directory is probed, not
// created, and no library is loaded or device opened.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "common/settings.hpp"
#include "host/runtime_dir.hpp"

#ifndef SOFTHCA_VERSION
#define SOFTHCA_VERSION "unknown"
#endif

namespace softhca::tool {
namespace {

namespace fs = std::filesystem;

constexpr int kLabelWidth = 19;  // "library directory  "
constexpr std::size_t kTextWidth = 80;
constexpr std::string_view kIndent = "    ";

void print_labeled(std::string_view label, const std::string& text) {
  std::printf("%-*.*s%s\n", kLabelWidth, static_cast<int>(label.size()), label.data(), text.c_str());
}

// Prints `text` in lines of at most kTextWidth, each starting with kIndent.
// A word longer than a line gets a line of its own.
void print_wrapped(std::string_view text) {
  std::string line;
  while (!text.empty()) {
    const std::size_t space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    if (word.empty()) continue;
    if (!line.empty() && kIndent.size() + line.size() + 1 + word.size() > kTextWidth) {
      std::printf("%.*s%s\n", static_cast<int>(kIndent.size()), kIndent.data(), line.c_str());
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += word;
  }
  if (!line.empty()) std::printf("%.*s%s\n", static_cast<int>(kIndent.size()), kIndent.data(), line.c_str());
}

// The value column of a setting: the environment's text, or "(default)".
std::string value_text(const Setting& s) {
  const char* text = setting_text(s.id);
  return text != nullptr ? text : "(default)";
}

// softhca info -c
int print_settings() {
  struct Row {
    const Setting* setting;
    std::string value;
    std::optional<std::string> problem;
  };
  std::vector<Row> rows;
  std::size_t name_width = std::string_view("SETTING").size();
  std::size_t value_width = std::string_view("VALUE").size();
  std::size_t default_width = std::string_view("DEFAULT").size();
  for (const Setting& s : kSettings) {
    const char* text = setting_text(s.id);
    rows.push_back({&s, value_text(s), text != nullptr ? setting_problem(s, text) : std::nullopt});
    name_width = std::max(name_width, s.name.size());
    value_width = std::max(value_width, rows.back().value.size());
    default_width = std::max(default_width, s.default_text.size());
  }
  const auto columns = [&](std::string_view name, std::string_view value, std::string_view fallback,
                           std::string_view syntax) {
    std::printf("%-*.*s  %-*.*s  %-*.*s  %.*s\n", static_cast<int>(name_width), static_cast<int>(name.size()),
                name.data(), static_cast<int>(value_width), static_cast<int>(value.size()), value.data(),
                static_cast<int>(default_width), static_cast<int>(fallback.size()), fallback.data(),
                static_cast<int>(syntax.size()), syntax.data());
  };
  columns("SETTING", "VALUE", "DEFAULT", "ACCEPTS");
  for (const Row& row : rows) {
    const Setting& s = *row.setting;
    std::putchar('\n');
    columns(s.name, row.value, s.default_text, setting_syntax(s));
    if (row.problem) print_wrapped("ignored (" + *row.problem + "): the libraries use the default");
    print_wrapped(s.help);
    if (!s.note.empty()) print_wrapped(s.note);
  }
  return kExitOk;
}

// softhca info
int print_overview() {
  bool ok = true;
  std::printf("softhca %s: libibverbs.so.1 and librdmacm.so.1 with the ABI of rdma-core 44\n", SOFTHCA_VERSION);

  // The library directory, as `softhca run` finds it.
  if (auto libdir = default_libdir(); !libdir) {
    print_labeled("library directory", "unknown: " + libdir.error());
    ok = false;
  } else {
    // Without librdmacm.so.1 verbs programs still run; without
    // libibverbs.so.1 nothing does.
    std::string missing;
    for (const std::string_view library : {"libibverbs.so.1", "librdmacm.so.1"}) {
      std::error_code ec;
      if (fs::exists(*libdir / library, ec)) continue;
      missing += (missing.empty() ? "" : ", ") + std::string(library);
      if (library == "libibverbs.so.1") ok = false;
    }
    print_labeled("library directory",
                  libdir->string() + (missing.empty() ? "" : " (missing: " + missing + "; build softhca first)"));
  }

  // The runtime directory, as the libraries would choose it now.
  using State = host::RuntimeDirProbe::State;
  const host::RuntimeDirProbe probe = host::probe_runtime_directory();
  std::string where = probe.path.empty() ? "none" : probe.path;
  const std::string detail = probe.detail.empty() ? "" : "; " + probe.detail;
  switch (probe.state) {
    case State::kUsable:
      where += " (usable" + detail + ")";
      break;
    case State::kCreated:
      where += " (not there yet; created at first use" + detail + ")";
      break;
    case State::kUnusable:
      where += " (unusable: " + probe.detail + ")";
      ok = false;
      break;
  }
  print_labeled("runtime directory", where);

  const SettingReading level = read_setting_number(SettingId::kLog, setting_text(SettingId::kLog));
  const char* log_file = setting_text(SettingId::kLogFile);
  print_labeled("log", std::string(kLogLevelNames[level.value]) + ", to " + (log_file ? log_file : "stderr"));

  // The settings in effect that differ from the defaults, so that a stray
  // variable in the environment is seen.
  bool any = false;
  for (const Setting& s : kSettings) {
    const char* text = setting_text(s.id);
    if (text == nullptr) continue;
    std::string line = std::string(s.name) + " " + text;
    if (auto problem = setting_problem(s, text)) line += " (ignored: " + *problem + ")";
    print_labeled(any ? "" : "settings", line);
    any = true;
  }
  if (!any) print_labeled("settings", "all defaults; `softhca info -c` lists them");
  return ok ? kExitOk : kExitFailure;
}

int info_main(std::span<char* const> args) {
  bool config = false;
  for (const char* arg : args) {
    const std::string_view word = arg;
    if (word == "-c" || word == "--config") {
      config = true;
    } else if (is_help_flag(word)) {
      std::fwrite(kInfoCommand.help.data(), 1, kInfoCommand.help.size(), stdout);
      return kExitOk;
    } else {
      std::fprintf(stderr, "softhca info: unknown %s '%s'; usage: softhca info [-c|--config]\n",
                   word.starts_with("-") ? "option" : "argument", arg);
      return kExitUsage;
    }
  }
  return config ? print_settings() : print_overview();
}

}  // namespace

const Command kInfoCommand = {
    .name = "info",
    .summary = "version, library and runtime directories; -c: every setting",
    .help =
        "usage: softhca info [-c|--config]\n"
        "\n"
        "Without options, prints what a setup is made of: softhca's version; the\n"
        "library directory `softhca run` puts first in LD_LIBRARY_PATH and whether it\n"
        "holds libibverbs.so.1 and librdmacm.so.1; the runtime directory the\n"
        "libraries would use now (SOFTHCA_RUNTIME_DIR or /dev/shm/softhca-<uid>),\n"
        "and whether it is usable; the log level and destination; and every\n"
        "SOFTHCA_* setting set in the environment, flagged when its value is\n"
        "ignored. Nothing is created or changed.\n"
        "\n"
        "options:\n"
        "  -c, --config   list every setting the libraries read: its value in this\n"
        "                 environment (or \"(default)\"), its default, the values it\n"
        "                 accepts and what it does\n"
        "\n"
        "exit status: 0; 1 when libibverbs.so.1 is missing from the library directory\n"
        "or the runtime directory is unusable; 2 on a usage error.\n",
    .main = info_main,
};

}  // namespace softhca::tool
