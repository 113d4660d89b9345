// The settings of softhca's libraries and tool: one table of every SOFTHCA_*
// environment variable they read, with its accepted values, default and help.
// `softhca info -c` prints it; the README lists it.
//
// Why one table: each setting used to be read with its own getenv and its own
// parser, so a bad value was ignored silently in one place and warned about
// in another, and nothing listed them all. Here every read goes through
// setting_text() (the only getenv of a SOFTHCA_ name), every value is checked
// by the same parser, and a bad value is warned about once per process and
// replaced by the default. Adding a setting is adding a row (and a SettingId).
//
// When each setting is read is the reader's choice and part of its row's
// note: the log's at its first message; the runtime directory when a process
// attaches to the host and when its CM starts; the CM timeouts at each
// connection request
// (so that a test or a user with a slow peer can change them in a running
// process); the udp link's fault schedule and capture file when the link
// starts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace softhca {

// One per row of kSettings, in its order.
enum class SettingId : uint8_t {
  kLog,
  kLogFile,
  kRuntimeDir,
  kCmResponseTimeout,
  kCmMaxRetries,
  kCmAgent,
  kLink,
  kFault,
  kPcap,
  kSharedMr,
  kUdpGso,
  kUdpSpinUs,
  kUdpHandoverUs,
  kUdpSelective,
};

enum class SettingType : uint8_t {
  kChoice,    // one word of `choices`; its value is the word's index
  kPath,      // a file or directory name, used as given
  kUnsigned,  // a decimal number in [min, max]
  kText,      // text in the row's `syntax`, parsed and checked by the layer that reads it
};

struct Setting {
  SettingId id;
  std::string_view name;          // a string literal, so name.data() is a C string
  SettingType type;
  std::string_view default_text;  // the default as users see it ("warn", "stderr", "20")
  std::string_view help;          // one line
  std::string_view note = {};     // what one line cannot say; may be empty
  std::span<const std::string_view> choices = {};  // kChoice
  uint32_t min = 0;                                // kUnsigned
  uint32_t max = 0;                                // kUnsigned
  std::string_view syntax = {};                    // kText: what it accepts, as users write it
  // kChoice: the index of the default word; kUnsigned: the default number.
  // kPath: unused (its default is computed where the path is used).
  uint32_t default_value = 0;
};

// SOFTHCA_LINK's words, in LinkChoice's order (engine/link_choice.hpp).
inline constexpr std::string_view kLinkNames[] = {"auto", "udp"};

// SOFTHCA_SHARED_MR's and SOFTHCA_UDP_GSO's words: the value is the index.
inline constexpr std::string_view kOnOffNames[] = {"on", "off"};

// In LogLevel's order (log.cpp checks it).
inline constexpr std::string_view kLogLevelNames[] = {"error", "warn", "info", "debug", "trace"};

inline constexpr std::array kSettings = {
    Setting{
        .id = SettingId::kLog,
        .name = "SOFTHCA_LOG",
        .type = SettingType::kChoice,
        .default_text = "warn",
        .help = "how much the libraries log",
        .note = "info also names every error completion with its QP and status, and each rdma_cm "
                "listener once it listens; read at a process's first log message",
        .choices = kLogLevelNames,
        .default_value = 1,
    },
    Setting{
        .id = SettingId::kLogFile,
        .name = "SOFTHCA_LOG_FILE",
        .type = SettingType::kPath,
        .default_text = "stderr",
        .help = "append the log to this file instead of stderr",
        .note = "opened at a process's first log message; when it cannot be opened, the log goes to "
                "stderr with a warning that says why",
    },
    Setting{
        .id = SettingId::kRuntimeDir,
        .name = "SOFTHCA_RUNTIME_DIR",
        .type = SettingType::kPath,
        .default_text = "/dev/shm/softhca-<uid>",
        .help = "the directory of this user's host registry, CM port table and CM sockets",
        .note = "created (mode 0700) if missing; it must be a directory of this user with mode "
                "0700, or ibv_open_device fails. Processes see each other only when they use the same "
                "one; read when a process first opens the device and when its CM starts. Unset: "
                "/dev/shm/softhca-<uid>, or, past names another user holds, the first usable of "
                "/dev/shm/softhca-<uid>.1 ... .15 (`softhca info` shows which)",
    },
    Setting{
        .id = SettingId::kCmResponseTimeout,
        .name = "SOFTHCA_CM_RESPONSE_TIMEOUT",
        .type = SettingType::kUnsigned,
        .default_text = "20",
        .help = "the CM response time of each connection request: 4.096 us x 2^n (20: 4.3 s)",
        .note = "how long both sides wait for each other's CM before they send again; read at each "
                "request",
        .min = 0,
        .max = 31,
        .default_value = 20,
    },
    Setting{
        .id = SettingId::kCmMaxRetries,
        .name = "SOFTHCA_CM_MAX_RETRIES",
        .type = SettingType::kUnsigned,
        .default_text = "15",
        .help = "times an unanswered CM message is resent before its id fails with -ETIMEDOUT",
        .note = "the event is UNREACHABLE for a REQ, REP or SIDR_REQ and DISCONNECTED for a DREQ; "
                "read at each request",
        .min = 0,
        .max = 15,
        .default_value = 15,
    },
    Setting{
        .id = SettingId::kCmAgent,
        .name = "SOFTHCA_CM_AGENT",
        .type = SettingType::kChoice,
        .default_text = "on",
        .help = "start the host's CM agent, which disconnects a dead process's connections to other hosts",
        .note = "the kernel's CM sends the DREQs of a killed process and retries them until answered; "
                "softhca's CM lives in the process, so a process connected to another host writes "
                "what it would send into a table of the runtime directory, and softhca-cm-agent (beside "
                "the libraries; started by the first process that needs it, gone once no connection "
                "is left) sends the DREQs of processes that died. off: never started. Read when the CM "
                "starts",
        .choices = kOnOffNames,
        .default_value = 0,
    },
    Setting{
        .id = SettingId::kLink,
        .name = "SOFTHCA_LINK",
        .type = SettingType::kChoice,
        .default_text = "auto",
        .help = "how QPs reach peers: auto (shared memory on this host, udp to others) or udp",
        .note = "udp sends even to QPs of this host as RoCEv2 packets over UDP port 4791, as "
                "between two machines (for tests and captures); read when a QP moves to RTR and "
                "at each UD send",
        .choices = kLinkNames,
        .default_value = 0,
    },
    Setting{
        .id = SettingId::kFault,
        .name = "SOFTHCA_FAULT",
        .type = SettingType::kText,
        .default_text = "none",
        .help = "drop, duplicate, reorder, delay or corrupt packets the udp link sends, on a seeded "
                "schedule (udp link only)",
        .note = "probabilities from 0 to 1, e.g. loss=0.05,dup=0.01,reorder=0.02,delay_us=200,"
                "corrupt=0.001,seed=7; loss counts all packets, the others the packets sent; a delayed "
                "packet waits 1..delay_us us (delay: the share delayed, default 1); a corruption flips "
                "bits of one byte the ICRC covers; seed defaults to a constant, so runs repeat. Read "
                "when the udp link starts; a value that does not parse is warned about and ignored (no "
                "faults). The shm link is never affected",
        .syntax = "loss=P,dup=P,reorder=P,delay=P,delay_us=N,corrupt=P,seed=N",
    },
    Setting{
        .id = SettingId::kPcap,
        .name = "SOFTHCA_PCAP",
        .type = SettingType::kPath,
        .default_text = "none",
        .help = "write every packet the udp link sends and receives to this pcap file (udp link only)",
        .note = "Ethernet/IP/UDP frames that tshark and Wireshark decode as RoCEv2; %p in the name "
                "becomes the process id, so processes sharing the setting write files of their own; "
                "a file of the same format is continued (delete it for a fresh capture), and flushed after every packet. The "
                "shm link's operations are not packets and are not captured",
    },
    Setting{
        .id = SettingId::kSharedMr,
        .name = "SOFTHCA_SHARED_MR",
        .type = SettingType::kChoice,
        .default_text = "on",
        .help = "move registered memory into a shared file so that processes of this host reach it "
                "without a system call per operation",
        .note = "only private anonymous read-write memory moves (malloc, the heap, anonymous mmap); "
                "other memory, and all memory with off, is reached with process_vm_readv/writev. "
                "Read at each registration",
        .choices = kOnOffNames,
        .default_value = 0,
    },
    Setting{
        .id = SettingId::kUdpGso,
        .name = "SOFTHCA_UDP_GSO",
        .type = SettingType::kChoice,
        .default_text = "on",
        .help = "send runs of equal-size packets as one GSO message (udp link only)",
        .note = "the kernel numbers the IPv4 IDs of a run's segments 0, 1, 2, ..., and the ICRC "
                "covers the ID, so each segment's ICRC is computed for the ID it will get; softhca "
                "receivers, which cannot see the ID, accept IDs 0 to 63. off: every packet alone, "
                "with ID 0 (for a softhca older than this, whose receivers accept ID 0 only). "
                "Read when the udp link starts",
        .choices = kOnOffNames,
        .default_value = 0,
    },
    Setting{
        .id = SettingId::kUdpSpinUs,
        .name = "SOFTHCA_UDP_SPIN_US",
        .type = SettingType::kUnsigned,
        .default_text = "0",
        .help = "microseconds the udp link's thread keeps polling its sockets after traffic before it "
                "sleeps (udp link only)",
        .note = "waking a sleeping thread costs microseconds (more in a virtual machine), and a "
                "ping-pong pays it at every packet: with 50, ib_write_lat between two namespaces fell "
                "by a quarter on a 16-core machine. The thread then takes a core while packets flow "
                "(none once the link is idle), so use it where every process has one to spare. "
                "Read when the udp link starts",
        .min = 0,
        .max = 100000,
        .default_value = 0,
    },
    Setting{
        .id = SettingId::kUdpHandoverUs,
        .name = "SOFTHCA_UDP_HANDOVER_US",
        .type = SettingType::kUnsigned,
        .default_text = "2000",
        .help = "microseconds an application thread must busy-poll its CQs before the udp link's thread "
                "leaves the sockets to it (0: never; udp link only)",
        .note = "a busy-polling application receives the link's packets itself; the link's thread, "
                "woken by the kernel for the same packets, only took a core from others (on 2 cores "
                "ib_write_bw between two namespaces gained about half). The thread looks every "
                "millisecond whether the polling goes on and takes the sockets back when it stopped, "
                "or at once when the application arms a CQ to sleep. Read when the udp link starts",
        .min = 0,
        .max = 10000000,
        .default_value = 2000,
    },
    Setting{
        .id = SettingId::kUdpSelective,
        .name = "SOFTHCA_UDP_SELECTIVE",
        .type = SettingType::kChoice,
        .default_text = "on",
        .help = "recover lost packets selectively between two softhca ends of an RC connection (udp "
                "link only)",
        .note = "the responder keeps up to 512 packets behind a lost one and reports each gap; the "
                "requester resends only those packets. Both ends mark it in reserved BTH bits and use "
                "it only when the other end does, so a RoCE NIC or rxe at the other end sees IBTA "
                "go-back-N. off: go-back-N between softhca ends too. Read when the udp link starts",
        .choices = kOnOffNames,
        .default_value = 0,
    },
};

// The row of `id`.
constexpr const Setting& setting(SettingId id) { return kSettings[static_cast<std::size_t>(id)]; }

namespace detail {

constexpr bool is_decimal_of(std::string_view text, uint32_t n) {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return false;
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint64_t>(c - '0');
    if (value > UINT32_MAX) return false;
  }
  return value == n;
}

constexpr bool is_setting_name(std::string_view name) {
  if (!name.starts_with("SOFTHCA_") || name.size() == 8) return false;
  for (const char c : name)
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return name.data()[name.size()] == '\0';  // setting_text passes name.data() to getenv
}

// What `softhca info -c` and the parser rely on, checked when compiling.
constexpr bool table_is_consistent() {
  for (std::size_t i = 0; i < kSettings.size(); ++i) {
    const Setting& s = kSettings[i];
    if (static_cast<std::size_t>(s.id) != i || !is_setting_name(s.name) || s.help.empty() ||
        s.default_text.empty())
      return false;
    for (std::size_t j = 0; j < i; ++j)
      if (kSettings[j].name == s.name) return false;
    switch (s.type) {
      case SettingType::kChoice:
        if (s.default_value >= s.choices.size() || s.choices[s.default_value] != s.default_text) return false;
        break;
      case SettingType::kUnsigned:
        if (!(s.min <= s.default_value && s.default_value <= s.max) ||
            !is_decimal_of(s.default_text, s.default_value) || !s.choices.empty())
          return false;
        break;
      case SettingType::kPath:
        if (!s.choices.empty() || !s.syntax.empty()) return false;
        break;
      case SettingType::kText:
        if (!s.choices.empty() || s.syntax.empty()) return false;
        break;
    }
  }
  return true;
}

}  // namespace detail

static_assert(detail::table_is_consistent(), "every row: its own id, a SOFTHCA_ name, help, a valid default");

// The values a setting accepts, as users write them: "error|warn|info|debug|trace",
// "0..31", "a path", or a text setting's `syntax`.
std::string setting_syntax(const Setting& s);

// Parses a number or choice setting's text (as the environment holds it):
// the number, or the index of the word. The error says what is wanted
// ("want 0..15"). Whole text, no sign, no spaces; words are case-sensitive.
std::expected<uint32_t, std::string> parse_setting_number(const Setting& s, std::string_view text);

// Why `text` is not a valid value of `s`, or nullopt when it is. Paths are
// always valid here: whether they can be used is found out when they are.
// So is text: its parser belongs to the layer that reads it (SOFTHCA_FAULT's
// to the udp link), which warns when it reads a bad one.
std::optional<std::string> setting_problem(const Setting& s, std::string_view text);

// One read of a number or choice setting: the value to use, and when the
// text was not valid, the warning that says so (without the level tag).
struct SettingReading {
  uint32_t value;
  std::optional<std::string> warning;
};

// Pure: `text` is what the environment holds (nullptr or empty: unset).
SettingReading read_setting_number(SettingId id, const char* text);

// The environment's text of a setting; nullptr when unset or empty (an empty
// variable means "unset" for every setting, as `VAR= program` suggests).
// The only place that reads a SOFTHCA_ variable from the environment.
const char* setting_text(SettingId id) noexcept;

// A number or choice setting's value from `text`, or its default; a bad text
// is warned about (SOFTHCA_WARN) once per setting per process, so a setting
// read at each request does not flood the log.
uint32_t setting_number_from(SettingId id, const char* text);

// setting_number_from(id, setting_text(id)): the value in effect now.
uint32_t setting_number(SettingId id);

}  // namespace softhca
