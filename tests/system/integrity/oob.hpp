// The out-of-band TCP channel between the two peers, as ibv_rc_pingpong has
// one: the QPs' numbers, PSNs, GIDs and the server's buffer are exchanged
// over it, then each case is announced, and its verdict reported, in fixed
// frames of big-endian words and a short text. Every read is bounded.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>

namespace integrity {

using Clock = std::chrono::steady_clock;

enum class MsgType : uint64_t { kHello = 1, kCase, kReady, kDone, kVerdict, kBye, kSummary };

struct Msg {
  static constexpr int kWords = 16;
  static constexpr size_t kTextBytes = 256;
  MsgType type{};
  uint64_t w[kWords] = {};
  std::string text;  // at most kTextBytes - 1 bytes travel
};

class Channel {
 public:
  Channel() = default;
  explicit Channel(int fd) : fd_(fd) {}
  Channel(Channel&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Channel& operator=(Channel&& other) noexcept;
  ~Channel();

  // Both return an error text, empty on success.
  std::string send(const Msg& m);
  // The next frame, or an error ("the peer closed the connection", "no
  // message within 10 s") when none came by `deadline`.
  std::expected<Msg, std::string> recv(Clock::time_point deadline);

 private:
  int fd_ = -1;
};

// The server: listens on `port` (all addresses) and accepts one peer.
std::expected<Channel, std::string> accept_one(uint16_t port, Clock::time_point deadline);
// The client: connects to host:port, retrying until `deadline` (the server
// may not listen yet).
std::expected<Channel, std::string> connect_to(const std::string& host, uint16_t port, Clock::time_point deadline);

}  // namespace integrity
