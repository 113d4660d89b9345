// rdma_copy: copies one file to another host with RDMA WRITE, connected by
// rdma_cm, written with the softhca C++ API (include/softhca). A real tool
// and a worked example of the pattern most RDMA data movers use:
//
//   server:  rdma_copy --server [--bind ADDR] [--port P] [--output DIR|FILE]
//   client:  rdma_copy [--port P] [--chunk SIZE] FILE SERVER_ADDR[:PORT]
//
// How the bytes move:
//   1. The client connects; its connection request's private data says what
//      it wants (protocol magic, file size, chunk size).
//   2. The server registers a landing buffer of `slots` chunks with remote
//      write access, and accepts with the buffer's address and rkey in the
//      accept's private data: no extra round trip to advertise memory.
//   3. The client SENDs the file's name, then for each chunk reads the file
//      into a registered buffer and RDMA-WRITEs it into the next landing
//      slot WITH_IMM: the immediate value (the chunk's length) consumes a
//      receive at the server, so the server learns that a chunk landed and
//      how long it is without the client sending anything else. The server
//      writes the slot to disk and SENDs an ACK, which gives the slot back:
//      at most `slots` chunks are in flight (credit-based flow control).
//   4. Both sides compute a CRC-32 (zlib) as the data passes; the client
//      SENDs DONE with its CRC and length, the server compares and answers
//      with RESULT. A mismatch fails both sides (exit 1) and the server
//      keeps no file.
//
// Every wait is bounded (--timeout), and waits on both the completion
// channel and the rdma_cm event channel with poll(2), so that a peer that
// disconnects or dies is noticed instead of waited for forever.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <softhca/cm.hpp>
#include <softhca/softhca.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <endian.h>
#include <getopt.h>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace softhca;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint16_t kDefaultPort = 7471;
constexpr std::size_t kDefaultChunk = 1 << 20;
constexpr std::size_t kMaxChunk = 64 << 20;
constexpr std::uint32_t kSlots = 2;  // chunks in flight: one lands while the last is written out
constexpr std::array<char, 4> kMagic{'R', 'C', 'P', '1'};

// ---- errors -----------------------------------------------------------------
// Anything that ends the run; main prints it as "rdma_copy: <what>".
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
  std::array<char, 1024> text{};
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text.data(), text.size(), fmt, ap);
  va_end(ap);
  throw Failure(text.data());
}

// The value of an Expected, or a Failure that says what we were doing.
template <class T>
T need(Expected<T>&& e, const char* doing) {
  if (!e) fail("%s: %s", doing, e.error().message().c_str());
  if constexpr (!std::is_void_v<T>) return std::move(*e);
}

// ---- wire formats -------------------------------------------------------------
// Fixed layouts in network byte order, so that hosts of any endianness agree.
struct ConnectRequest {  // client -> server, in the REQ's private data (<= 56 bytes)
  std::array<char, 4> magic;
  std::uint32_t chunk;  // the slot size the client would like
  std::uint64_t size;   // the file's length
};
struct ConnectGrant {  // server -> client, in the REP's private data (<= 196 bytes)
  std::array<char, 4> magic;
  std::uint32_t slots;
  std::uint32_t slot_size;
  std::uint32_t rkey;
  std::uint64_t addr;  // slot i lands at addr + i * slot_size
};

enum class MsgType : std::uint32_t { Name = 1, Done = 2, Ack = 3, Result = 4 };
struct Message {  // every SEND, both ways
  std::uint32_t type;
  std::uint32_t crc;     // Done: the client's CRC; Result: the server's
  std::uint64_t length;  // Done: bytes sent; Result: bytes received
  std::uint32_t ok;      // Result: 1 when the CRCs and lengths agree
  std::uint32_t name_len;
  std::array<char, 256> name;  // Name: the file's base name
};

template <class T>
std::span<const std::byte> as_bytes_of(const T& v) {
  return std::as_bytes(std::span(&v, 1));
}
template <class T>
T from_bytes(std::span<const std::byte> b) {
  T v{};
  std::memcpy(&v, b.data(), std::min(sizeof v, b.size()));
  return v;
}

// ---- options -------------------------------------------------------------------
struct Options {
  bool server = false;
  std::string bind_addr;  // server: empty = every address
  std::uint16_t port = kDefaultPort;
  bool port_given = false;
  std::string output = ".";
  std::size_t chunk = kDefaultChunk;
  bool progress = false;
  int timeout_s = 30;
  std::string file;  // client
  std::string host;  // client
};

void usage(FILE* to) {
  std::fprintf(to,
               "Usage:\n"
               "  rdma_copy --server [--bind ADDR] [--port P] [--output DIR|FILE] [options]\n"
               "  rdma_copy [--port P] [--chunk SIZE] [options] FILE SERVER_ADDR[:PORT]\n"
               "\n"
               "Copies FILE to the host where `rdma_copy --server` runs, with RDMA WRITE over an\n"
               "rdma_cm connection, and checks a CRC-32 of the data on both sides. The server\n"
               "takes one file and exits.\n"
               "\n"
               "Options:\n"
               "  -s, --server         receive a file (default: send FILE)\n"
               "  -b, --bind ADDR      server: listen on ADDR only (default: every address)\n"
               "  -p, --port P         rdma_cm port to listen on / connect to (default %u)\n"
               "  -o, --output PATH    server: a directory to write into under the sender's\n"
               "                       file name, or a file name (default: .)\n"
               "  -c, --chunk SIZE     client: bytes per RDMA WRITE, with K/M suffixes\n"
               "                       (default 1M, at most 64M)\n"
               "  -P, --progress       show progress on stderr even when it is not a terminal\n"
               "  -t, --timeout SECS   give up when the peer says nothing for SECS (default 30;\n"
               "                       the server waits for its client without limit)\n"
               "  -h, --help           this text\n"
               "\n"
               "Exit status: 0 when the file arrived and the checksums agree, 1 on any error,\n"
               "2 on bad usage. On softhca: softhca run -- rdma_copy ...\n",
               kDefaultPort);
}

std::optional<std::size_t> parse_size(std::string_view s) {
  std::size_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  std::string_view suffix(end, s.data() + s.size() - end);
  if (suffix == "K" || suffix == "k") v <<= 10;
  else if (suffix == "M" || suffix == "m") v <<= 20;
  else if (!suffix.empty()) return std::nullopt;
  return v;
}

template <class T>
std::optional<T> parse_number(std::string_view s, T lo, T hi) {
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

// Returns the options, or exits (0 for --help, 2 for bad usage).
Options parse_options(int argc, char** argv) {
  static const option longopts[] = {
      {"server", no_argument, nullptr, 's'},   {"bind", required_argument, nullptr, 'b'},
      {"port", required_argument, nullptr, 'p'}, {"output", required_argument, nullptr, 'o'},
      {"chunk", required_argument, nullptr, 'c'}, {"progress", no_argument, nullptr, 'P'},
      {"timeout", required_argument, nullptr, 't'}, {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  Options o;
  auto bad = [](const char* fmt, const char* arg) {
    std::fprintf(stderr, "rdma_copy: ");
    std::fprintf(stderr, fmt, arg);
    std::fprintf(stderr, "\nrdma_copy: see rdma_copy --help\n");
    std::exit(2);
  };
  int c;
  while ((c = getopt_long(argc, argv, "sb:p:o:c:Pt:h", longopts, nullptr)) != -1) {
    switch (c) {
      case 's': o.server = true; break;
      case 'b': o.bind_addr = optarg; break;
      case 'p': {
        auto p = parse_number<std::uint16_t>(optarg, 1, 65535);
        if (!p) bad("--port takes a port number (1-65535), not '%s'", optarg);
        o.port = *p;
        o.port_given = true;
        break;
      }
      case 'o': o.output = optarg; break;
      case 'c': {
        auto n = parse_size(optarg);
        if (!n || *n == 0 || *n > kMaxChunk) bad("--chunk takes a size from 1 to 64M, not '%s'", optarg);
        o.chunk = *n;
        break;
      }
      case 'P': o.progress = true; break;
      case 't': {
        auto t = parse_number<int>(optarg, 1, 86400);
        if (!t) bad("--timeout takes seconds (1-86400), not '%s'", optarg);
        o.timeout_s = *t;
        break;
      }
      case 'h': usage(stdout); std::exit(0);
      default: std::fprintf(stderr, "rdma_copy: see rdma_copy --help\n"); std::exit(2);
    }
  }
  const int rest = argc - optind;
  if (o.server) {
    if (rest != 0) bad("the server takes no file or address ('%s')", argv[optind]);
  } else {
    if (rest != 2) bad("%s", "the client needs FILE and SERVER_ADDR (or --server for the receiving side)");
    o.file = argv[optind];
    o.host = argv[optind + 1];
  }
  return o;
}

// "host", "host:port", "[v6]" or "[v6]:port"; a bare IPv6 address has no port.
void split_host_port(Options& o) {
  std::string& h = o.host;
  std::optional<std::string> port;
  if (!h.empty() && h.front() == '[') {
    const auto close = h.find(']');
    if (close == std::string::npos) fail("bad address '%s': no ']'", h.c_str());
    if (close + 1 < h.size()) {
      if (h[close + 1] != ':') fail("bad address '%s'", h.c_str());
      port = h.substr(close + 2);
    }
    h = h.substr(1, close - 1);
  } else if (std::count(h.begin(), h.end(), ':') == 1) {
    port = h.substr(h.find(':') + 1);
    h.resize(h.find(':'));
  }
  if (port) {
    auto p = parse_number<std::uint16_t>(*port, 1, 65535);
    if (!p) fail("bad port in '%s:%s'", h.c_str(), port->c_str());
    if (o.port_given && *p != o.port) fail("two ports given: --port %u and :%u", o.port, *p);
    o.port = *p;
  }
}

// A host name or numeric address as rdma_cm takes it. Names go through the
// resolver here (getaddrinfo); rdma_cm itself only maps addresses to devices.
SocketAddress resolve(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0)
    fail("cannot resolve '%s': %s", host.c_str(), gai_strerror(rc));
  std::array<char, NI_MAXHOST> numeric{};
  const int rc = getnameinfo(res->ai_addr, res->ai_addrlen, numeric.data(), numeric.size(), nullptr, 0,
                             NI_NUMERICHOST);
  freeaddrinfo(res);
  if (rc != 0) fail("cannot resolve '%s': %s", host.c_str(), gai_strerror(rc));
  return need(SocketAddress::create(numeric.data(), port), "address");
}

std::string describe(const SocketAddress& a) {
  std::array<char, NI_MAXHOST> host{};
  std::array<char, NI_MAXSERV> serv{};
  const socklen_t len = a.family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (getnameinfo(a.get(), len, host.data(), host.size(), serv.data(), serv.size(),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return a.family() == AF_INET6 ? "[" + std::string(host.data()) + "]:" + serv.data()
                                : std::string(host.data()) + ":" + serv.data();
}

// ---- progress --------------------------------------------------------------------
// Percent and MB/s on stderr, redrawn in place on a terminal; with --progress
// and no terminal, one line a second.
class Progress {
 public:
  Progress(bool forced, std::uint64_t total)
      : tty_(isatty(STDERR_FILENO) == 1), on_(tty_ || forced), total_(total), start_(Clock::now()) {}

  void update(std::uint64_t done) {
    if (!on_ || shown_total_) return;
    const auto now = Clock::now();
    if (now - last_ < (tty_ ? milliseconds(200) : milliseconds(1000)) && done != total_) return;
    shown_total_ = done == total_;
    last_ = now;
    const double pct = total_ == 0 ? 100.0 : 100.0 * static_cast<double>(done) / static_cast<double>(total_);
    std::fprintf(stderr, "%s%5.1f%%  %10" PRIu64 " bytes  %8.1f MB/s%s", tty_ ? "\r" : "", pct, done,
                 mb_per_s(done), tty_ ? "" : "\n");
    drawn_ = true;
  }
  // Ends the line drawn in place, so that what follows starts on its own.
  void finish() {
    if (tty_ && drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double mb_per_s(std::uint64_t bytes) const {
    const double s = seconds();
    return s > 0 ? static_cast<double>(bytes) / 1e6 / s : 0.0;
  }

 private:
  bool tty_;
  bool on_;
  bool drawn_ = false;
  bool shown_total_ = false;  // 100% is drawn once
  std::uint64_t total_;
  Clock::time_point start_;
  Clock::time_point last_{};
};

// ---- one connection's verbs resources -----------------------------------------------
// The CQ reports through a completion channel, so that a wait can sleep in
// poll(2) on it and on the rdma_cm channel at once.
struct Endpoint {
  CompletionChannel comp_channel;
  CompletionQueue cq;
  ProtectionDomain pd;
  // Message buffers: one per receive, then two for sends: a general one
  // (used by one SEND at a time) and the ACK, which never changes, so that
  // ACKs still in flight never read a buffer being rewritten.
  std::vector<std::byte> ctrl;
  MemoryRegion ctrl_mr;
  std::size_t recv_count = 0;

  Endpoint(ibv_context* verbs, std::size_t recvs)
      : comp_channel(CompletionChannel::make(verbs)),
        cq(CompletionQueue::make(verbs, 64, &comp_channel)),
        pd(ProtectionDomain::make(verbs)),
        ctrl((recvs + 2) * sizeof(Message)),
        ctrl_mr(MemoryRegion::make(pd, ctrl, Access::LocalWrite)),
        recv_count(recvs) {
    recv_msg(recv_count + 1) = Message{.type = htobe32(std::to_underlying(MsgType::Ack))};
    need(cq.req_notify(), "ibv_req_notify_cq");
  }

  ibv_qp_init_attr qp_attr(std::uint32_t send_depth) const {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq.get();
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = send_depth;
    a.cap.max_recv_wr = static_cast<std::uint32_t>(recv_count);
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.sq_sig_all = 1;  // every send completes, so its queue slot is freed when we poll it
    return a;
  }
  Message& recv_msg(std::uint64_t slot) { return *reinterpret_cast<Message*>(&ctrl[slot * sizeof(Message)]); }
  Message& send_msg() { return recv_msg(recv_count); }

  // A receive for one incoming SEND or WRITE_WITH_IMM into control slot
  // `slot`; wr_id names the slot so that it can be posted again.
  void post_recv(const CmId& id, std::uint64_t slot) {
    ibv_sge sge = ctrl_mr.sge(slot * sizeof(Message), sizeof(Message));
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    need(id.post_recv(wr), "ibv_post_recv");
  }
  void post_all_recvs(const CmId& id) {
    for (std::size_t i = 0; i < recv_count; ++i) post_recv(id, i);
  }
  // SENDs send_msg() (wr_id kMsgWrId), or the ACK (kAckWrId).
  void send(const CmId& id, bool ack = false) {
    const std::size_t slot = recv_count + (ack ? 1 : 0);
    ibv_sge sge = ctrl_mr.sge(slot * sizeof(Message), sizeof(Message));
    ibv_send_wr wr{};
    wr.wr_id = ack ? kAckWrId : kMsgWrId;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    need(id.post_send(wr), "ibv_post_send");
  }
  // Receives are numbered by their buffer (0, 1, ...); sends far above.
  static constexpr std::uint64_t kMsgWrId = ~0ULL;
  static constexpr std::uint64_t kAckWrId = ~1ULL;
  static bool is_send(std::uint64_t wr_id) { return wr_id >= kAckWrId; }
};

// Waits for the next completion of the endpoint's CQ, sleeping in poll(2) on
// the completion channel and on the rdma_cm channel: a DISCONNECTED (or any
// other CM event) during the transfer ends the run, and so does `timeout`
// without any completion.
ibv_wc next_completion(Endpoint& ep, const EventChannel& cm, std::chrono::seconds timeout, const char* peer) {
  const auto deadline = Clock::now() + timeout;
  std::array<ibv_wc, 1> wc{};
  for (;;) {
    auto got = need(ep.cq.poll(wc), "ibv_poll_cq");
    if (!got.empty()) {
      if (got[0].status != IBV_WC_SUCCESS)
        fail("the %s went away or failed: work completion %s", peer, ibv_wc_status_str(got[0].status));
      return got[0];
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) fail("the %s said nothing for %lld s; giving up", peer, static_cast<long long>(timeout.count()));
    std::array<pollfd, 2> fds{pollfd{ep.comp_channel.fd(), POLLIN, 0}, pollfd{cm.fd(), POLLIN, 0}};
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) fail("poll: %s", std::strerror(errno));
    if (fds[0].revents & POLLIN) {
      // Arm again before the next poll of the CQ, so that no completion can
      // slip in between unannounced. Completions first: a peer may send its
      // last message and disconnect at once, and the message counts.
      (void)need(ep.comp_channel.get_event(), "ibv_get_cq_event");
      ep.cq.ack_events(1);
      need(ep.cq.req_notify(), "ibv_req_notify_cq");
      continue;
    }
    if (fds[1].revents & POLLIN) {
      auto ev = need(cm.get_event(), "rdma_get_cm_event");
      if (ev.type() == RDMA_CM_EVENT_DISCONNECTED) fail("the %s disconnected before the copy was complete", peer);
      fail("the %s's connection failed: %s", peer, ev.name());
    }
  }
}

// The next CM event, which must be `type`; failures in words.
CmEvent expect_event(const EventChannel& ch, rdma_cm_event_type type, std::chrono::seconds timeout,
                     const std::string& where) {
  auto ev = ch.expect(type, timeout);
  if (ev) return std::move(*ev);
  const int code = ev.error().code();
  switch (code) {
    case ECONNREFUSED: fail("connection to %s refused (is `rdma_copy --server` running there?)", where.c_str());
    case ETIMEDOUT:
      fail("no answer from %s within %lld s (waiting for %s)", where.c_str(),
           static_cast<long long>(timeout.count()), rdma_event_str(type));
    case ENETUNREACH:
    case EHOSTUNREACH:
    case EADDRNOTAVAIL:
      fail("cannot reach %s: %s", where.c_str(), std::strerror(code));
    default: fail("waiting for %s from %s: %s", rdma_event_str(type), where.c_str(), std::strerror(code));
  }
}

void write_all(int fd, const std::byte* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write %s: %s", path.c_str(), std::strerror(w < 0 ? errno : ENOSPC));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::size_t read_full(int fd, std::byte* p, std::size_t n, const std::string& path) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("cannot read %s: %s", path.c_str(), std::strerror(errno));
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

std::uint32_t crc_update(std::uint32_t crc, const std::byte* p, std::size_t n) {
  // zlib's crc32 takes a uInt length: feed it in pieces that fit.
  while (n > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = static_cast<std::uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(p), piece));
    p += piece;
    n -= piece;
  }
  return crc;
}

// ---- the output file of the server ---------------------------------------------------
// The temporary file's name for the signal handler, which may only make
// async-signal-safe calls (unlink, signal, raise): no std::string there.
std::array<char, 4096> g_partial_file{};

void remove_partial_and_die(int sig) {
  if (g_partial_file[0] != '\0') ::unlink(g_partial_file.data());
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Written under a temporary name in the target directory and renamed into
// place only when the checksums agree, so that a failed copy leaves nothing
// that looks like a good file.
class OutputFile {
 public:
  OutputFile(const std::string& output, const std::string& sent_name) {
    struct stat st{};
    if (::stat(output.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      path_ = output + "/" + sent_name;
    } else {
      path_ = output;
    }
    const auto slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash);
    const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
    tmp_ = dir + "/." + base + ".rdma_copy.XXXXXX";
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) fail("cannot create a file in %s: %s", dir.c_str(), std::strerror(errno));
    // Interrupted (Ctrl-C, kill), the server removes it too.
    if (tmp_.size() < g_partial_file.size()) {
      std::memcpy(g_partial_file.data(), tmp_.c_str(), tmp_.size() + 1);
      ::signal(SIGINT, remove_partial_and_die);
      ::signal(SIGTERM, remove_partial_and_die);
      ::signal(SIGHUP, remove_partial_and_die);
    }
    // mkstemp makes 0600; give the file the mode a plain create would.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    (void)::fchmod(fd_, 0666 & ~mask);
  }
  ~OutputFile() {
    g_partial_file[0] = '\0';
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const std::byte* p, std::size_t n) { write_all(fd_, p, n, tmp_); }
  // On disk (fsync: a crash right after must not lose what we reported as
  // copied), then renamed into place; on failure the temporary file goes.
  void commit() {
    g_partial_file[0] = '\0';  // from here on, the file is renamed or removed here
    int err = ::fsync(fd_) == 0 ? 0 : errno;
    if (::close(std::exchange(fd_, -1)) != 0 && err == 0) err = errno;
    if (err == 0 && ::rename(tmp_.c_str(), path_.c_str()) == 0) return;
    const bool renaming = err == 0;
    if (renaming) err = errno;
    ::unlink(tmp_.c_str());
    if (renaming) fail("cannot rename %s to %s: %s", tmp_.c_str(), path_.c_str(), std::strerror(err));
    fail("cannot write %s: %s", tmp_.c_str(), std::strerror(err));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
};

// A name the server may write under: the base name only, never "." or "..".
std::string safe_name(const Message& m) {
  const std::size_t len = std::min<std::size_t>(be32toh(m.name_len), m.name.size());
  std::string name(m.name.data(), len);
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    fail("the client sent an unusable file name");
  return name;
}

// ---- server ---------------------------------------------------------------------------
int run_server(const Options& o) {
  const auto timeout = std::chrono::seconds(o.timeout_s);
  auto channel = EventChannel::make();
  auto listener = CmId::make(channel);
  const SocketAddress local = o.bind_addr.empty() ? need(SocketAddress::create("0.0.0.0", o.port), "address")
                                                  : resolve(o.bind_addr, o.port);
  if (auto r = listener.bind(local); !r)
    fail("cannot listen on %s: %s", describe(local).c_str(), std::strerror(r.error().code()));
  need(listener.listen(1), "rdma_listen");
  // Unbuffered stderr: a script waiting for this line sees it at once.
  std::fprintf(stderr, "rdma_copy: listening on %s\n", describe(local).c_str());

  // Declared before the connection's id, so destroyed after the QP that
  // uses them (C++ destroys in reverse order of declaration).
  std::optional<Endpoint> ep;
  std::vector<std::byte> landing;
  std::optional<MemoryRegion> landing_mr;

  // The one client. The server waits for it without limit; a request that
  // does not speak our protocol is rejected and the wait goes on.
  CmId conn;
  ConnectRequest req{};
  for (;;) {
    CmEvent ev = need(channel.expect(RDMA_CM_EVENT_CONNECT_REQUEST), "waiting for a client");
    req = from_bytes<ConnectRequest>(ev.private_data());
    CmId candidate(ev.id());
    ev = CmEvent();  // acknowledge before anything may destroy the id
    if (req.magic == kMagic) {
      conn = std::move(candidate);
      break;
    }
    std::fprintf(stderr, "rdma_copy: rejected a connection that is not from rdma_copy\n");
    (void)candidate.reject();
  }
  const std::uint64_t size = be64toh(req.size);
  const std::uint32_t slot_size =
      static_cast<std::uint32_t>(std::clamp<std::size_t>(be32toh(req.chunk), 1, kMaxChunk));

  // Receives: one per chunk in flight, plus the name and DONE messages.
  ep.emplace(conn.verbs(), kSlots + 2);
  landing.resize(std::size_t{kSlots} * slot_size);
  landing_mr.emplace(MemoryRegion::make(ep->pd, landing, Access::LocalWrite | Access::RemoteWrite));
  need(conn.create_qp(ep->qp_attr(kSlots + 2), ep->pd.get()), "rdma_create_qp");
  ep->post_all_recvs(conn);  // before accepting: the client may write at once

  ConnectGrant grant{.magic = kMagic,
                     .slots = htobe32(kSlots),
                     .slot_size = htobe32(slot_size),
                     .rkey = htobe32(landing_mr->rkey()),
                     .addr = htobe64(landing_mr->addr())};
  need(conn.accept({.private_data = as_bytes_of(grant)}), "rdma_accept");
  expect_event(channel, RDMA_CM_EVENT_ESTABLISHED, timeout, "the client");

  std::optional<OutputFile> out;
  Progress progress(o.progress, size);
  std::uint64_t received = 0;
  std::uint64_t chunks = 0;
  std::uint32_t crc = crc32(0, nullptr, 0);
  for (;;) {
    const ibv_wc wc = next_completion(*ep, channel, timeout, "client");
    if (Endpoint::is_send(wc.wr_id)) continue;  // our ACKs completing
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      // A chunk landed in the next slot; the immediate is its length.
      if (!out) fail("the client wrote data before naming the file");
      const std::uint32_t len = be32toh(wc.imm_data);
      const std::byte* slot = landing.data() + (chunks % kSlots) * slot_size;
      if (len > slot_size || received + len > size) fail("the client wrote more than it announced");
      out->write(slot, len);
      crc = crc_update(crc, slot, len);
      received += len;
      ++chunks;
      progress.update(received);
      ep->post_recv(conn, wc.wr_id);
      ep->send(conn, /*ack=*/true);  // the slot is free again
      continue;
    }
    const Message msg = ep->recv_msg(wc.wr_id);
    ep->post_recv(conn, wc.wr_id);
    switch (static_cast<MsgType>(be32toh(msg.type))) {
      case MsgType::Name:
        out.emplace(o.output, safe_name(msg));
        continue;
      case MsgType::Done: {
        progress.finish();
        const std::uint32_t client_crc = be32toh(msg.crc);
        const std::uint64_t client_len = be64toh(msg.length);
        const bool match = out && client_crc == crc && client_len == received && received == size;
        // The file is in place (or not) before the client hears that it is:
        // a failed rename must not look like a good copy to the sender.
        std::optional<Failure> commit_failed;
        if (match) {
          try {
            out->commit();
          } catch (const Failure& e) {
            commit_failed = e;
          }
        }
        const bool ok = match && !commit_failed;
        ep->send_msg() = Message{.type = htobe32(std::to_underlying(MsgType::Result)),
                                 .crc = htobe32(crc),
                                 .length = htobe64(received),
                                 .ok = htobe32(ok ? 1 : 0)};
        const double seconds = progress.seconds();
        const double rate = progress.mb_per_s(received);
        ep->send(conn);
        // The client disconnects once it has the RESULT: wait for that
        // (bounded), so that our exit never cuts the RESULT off.
        (void)channel.expect(RDMA_CM_EVENT_DISCONNECTED, timeout);
        if (commit_failed) throw *commit_failed;
        if (!match)
          fail("checksum mismatch: received %" PRIu64 " bytes with crc32 %08x, the client sent %" PRIu64
               " bytes with crc32 %08x; nothing written",
               received, crc, client_len, client_crc);
        std::printf("rdma_copy: received %s (%" PRIu64 " bytes) in %.3f s, %.1f MB/s\n", out->path().c_str(),
                    received, seconds, rate);
        std::printf("rdma_copy: crc32 %08x matches the client's\n", crc);
        return 0;
      }
      default: fail("the client sent an unexpected message");
    }
  }
}

// ---- client ---------------------------------------------------------------------------
int run_client(Options o) {
  const auto timeout = std::chrono::seconds(o.timeout_s);
  // The file first: a missing file should not cost a connection.
  const int fd = ::open(o.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open %s: %s", o.file.c_str(), std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) fail("cannot stat %s: %s", o.file.c_str(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("%s is not a regular file", o.file.c_str());
  const auto size = static_cast<std::uint64_t>(st.st_size);
  std::string name = o.file.substr(o.file.rfind('/') == std::string::npos ? 0 : o.file.rfind('/') + 1);
  if (name.size() > Message{}.name.size()) fail("file name too long: %s", name.c_str());

  split_host_port(o);
  const SocketAddress server = resolve(o.host, o.port);
  const std::string where = describe(server);

  auto channel = EventChannel::make();
  // Declared before the id, so destroyed after the QP that uses them.
  std::optional<Endpoint> ep;
  std::vector<std::byte> chunks_buf;
  std::optional<MemoryRegion> chunks_mr;
  auto id = CmId::make(channel);
  if (auto r = id.resolve_addr(server, timeout); !r)
    fail("cannot resolve an RDMA route to %s: %s", where.c_str(), std::strerror(r.error().code()));
  expect_event(channel, RDMA_CM_EVENT_ADDR_RESOLVED, timeout, where);
  need(id.resolve_route(timeout), "rdma_resolve_route");
  expect_event(channel, RDMA_CM_EVENT_ROUTE_RESOLVED, timeout, where);

  // Receives: one ACK per chunk in flight, plus the RESULT.
  ep.emplace(id.verbs(), kSlots + 1);
  // The source buffers: no access flags, since the local HCA only reads them.
  chunks_buf.resize(std::size_t{kSlots} * o.chunk);
  chunks_mr.emplace(MemoryRegion::make(ep->pd, chunks_buf, Access::None));
  need(id.create_qp(ep->qp_attr(kSlots + 4), ep->pd.get()), "rdma_create_qp");
  ep->post_all_recvs(id);

  const ConnectRequest req{.magic = kMagic, .chunk = htobe32(static_cast<std::uint32_t>(o.chunk)), .size = htobe64(size)};
  need(id.connect({.private_data = as_bytes_of(req)}), "rdma_connect");
  CmEvent established = expect_event(channel, RDMA_CM_EVENT_ESTABLISHED, timeout, where);
  const ConnectGrant grant = from_bytes<ConnectGrant>(established.private_data());
  established = CmEvent();
  if (grant.magic != kMagic) fail("%s is not an rdma_copy server", where.c_str());
  const std::uint32_t slots = be32toh(grant.slots);
  const std::uint32_t slot_size = be32toh(grant.slot_size);
  const std::uint64_t remote = be64toh(grant.addr);
  const std::uint32_t rkey = be32toh(grant.rkey);
  if (slots == 0 || slots > kSlots || slot_size == 0 || slot_size > o.chunk)
    fail("the server granted an unusable landing buffer");

  Message& name_msg = ep->send_msg();
  name_msg = Message{.type = htobe32(std::to_underlying(MsgType::Name)),
                     .name_len = htobe32(static_cast<std::uint32_t>(name.size()))};
  std::memcpy(name_msg.name.data(), name.data(), name.size());
  ep->send(id);
  bool msg_in_flight = true;  // the control send buffer is busy until its completion

  Progress progress(o.progress, size);
  std::uint32_t crc = crc32(0, nullptr, 0);
  std::uint64_t offset = 0;
  std::uint64_t seq = 0;
  std::uint32_t credits = slots;
  std::uint32_t writes_in_flight = 0;
  auto handle = [&](const ibv_wc& wc) {
    if (wc.wr_id == Endpoint::kMsgWrId) {
      msg_in_flight = false;
    } else if (wc.opcode == IBV_WC_RDMA_WRITE) {
      --writes_in_flight;
    } else if (wc.opcode == IBV_WC_RECV) {
      const Message m = ep->recv_msg(wc.wr_id);
      ep->post_recv(id, wc.wr_id);
      if (be32toh(m.type) != std::to_underlying(MsgType::Ack)) fail("the server sent an unexpected message");
      ++credits;
    }
  };
  while (offset < size) {
    // A free landing slot, and our copy of it no longer being read by a WRITE.
    while (credits == 0 || writes_in_flight >= slots) handle(next_completion(*ep, channel, timeout, "server"));
    std::byte* buf = chunks_buf.data() + (seq % slots) * slot_size;
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(slot_size, size - offset));
    const std::size_t got = read_full(fd, buf, want, o.file);
    if (got != want) fail("%s shrank while it was being copied", o.file.c_str());
    crc = crc_update(crc, buf, got);

    ibv_sge sge = chunks_mr->sge(static_cast<std::size_t>(buf - chunks_buf.data()), got);
    ibv_send_wr wr{};
    wr.wr_id = seq;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htobe32(static_cast<std::uint32_t>(got));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = remote + (seq % slots) * slot_size;
    wr.wr.rdma.rkey = rkey;
    need(id.post_send(wr), "ibv_post_send");
    --credits;
    ++writes_in_flight;
    ++seq;
    offset += got;
    progress.update(offset);
  }
  ::close(fd);
  progress.update(offset);  // an empty file too shows its 100%
  progress.finish();

  // DONE once every chunk is written and the name's SEND is back.
  while (msg_in_flight || writes_in_flight > 0) handle(next_completion(*ep, channel, timeout, "server"));
  ep->send_msg() = Message{.type = htobe32(std::to_underlying(MsgType::Done)), .crc = htobe32(crc), .length = htobe64(offset)};
  ep->send(id);
  std::optional<Message> result;
  while (!result) {
    const ibv_wc wc = next_completion(*ep, channel, timeout, "server");
    if (wc.opcode == IBV_WC_RECV) {
      const Message m = ep->recv_msg(wc.wr_id);
      if (be32toh(m.type) == std::to_underlying(MsgType::Result)) result = m;
      else if (be32toh(m.type) == std::to_underlying(MsgType::Ack)) ep->post_recv(id, wc.wr_id);
      else fail("the server sent an unexpected message");
    }
  }
  (void)id.disconnect();
  (void)channel.expect(RDMA_CM_EVENT_DISCONNECTED, milliseconds(2000));

  const std::uint32_t server_crc = be32toh(result->crc);
  const std::uint64_t server_len = be64toh(result->length);
  if (server_crc != crc || server_len != offset)
    fail("checksum mismatch: sent %" PRIu64 " bytes with crc32 %08x, the server received %" PRIu64
         " bytes with crc32 %08x",
         offset, crc, server_len, server_crc);
  if (be32toh(result->ok) != 1) fail("the server received the file intact but could not store it (see its output)");
  std::printf("rdma_copy: sent %s (%" PRIu64 " bytes) to %s in %.3f s, %.1f MB/s\n", o.file.c_str(), offset,
              where.c_str(), progress.seconds(), progress.mb_per_s(offset));
  std::printf("rdma_copy: crc32 %08x verified by the server\n", crc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  try {
    return o.server ? run_server(o) : run_client(o);
  } catch (const Failure& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "rdma_copy: %s\n", e.what());
  } catch (const VerbsError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "rdma_copy: %s\n", e.what());
  }
  return 1;
}
