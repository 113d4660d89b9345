#include "rsocket/protocol.hpp"

#include <endian.h>

namespace softhca::rsocket {

namespace {

// Layout of rs_conn_data: version, flags, credits (be16), 3 reserved bytes,
// target_iomap_size, then two rs_sge {be64 addr, be32 key, be32 length}.
constexpr size_t kOffVersion = 0;
constexpr size_t kOffFlags = 1;
constexpr size_t kOffCredits = 2;
constexpr size_t kOffIomapSize = 7;
constexpr size_t kOffTargetSgl = 8;
constexpr size_t kOffDataBuf = 24;

template <typename T>
void put(uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof value);
}
template <typename T>
T get(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

void put_sge(uint8_t* at, const RemoteSge& sge) {
  put(at, htobe64(sge.addr));
  put(at + 8, htobe32(sge.key));
  put(at + 12, htobe32(sge.length));
}

RemoteSge get_sge(const uint8_t* at) {
  return RemoteSge{be64toh(get<uint64_t>(at)), be32toh(get<uint32_t>(at + 8)), be32toh(get<uint32_t>(at + 12))};
}

}  // namespace

void encode_conn_data(const ConnData& data, uint8_t (&out)[kConnDataSize]) {
  std::memset(out, 0, sizeof out);
  out[kOffVersion] = data.version;
  out[kOffFlags] = data.flags;
  put(out + kOffCredits, htobe16(data.credits));
  out[kOffIomapSize] = data.target_iomap_size;
  put_sge(out + kOffTargetSgl, data.target_sgl);
  put_sge(out + kOffDataBuf, data.data_buf);
}

std::optional<ConnData> decode_conn_data(const void* bytes, size_t len) {
  if (bytes == nullptr || len < kConnDataSize) return std::nullopt;
  const auto* in = static_cast<const uint8_t*>(bytes);
  if (in[kOffVersion] != kConnVersion) return std::nullopt;
  ConnData data;
  data.version = in[kOffVersion];
  data.flags = in[kOffFlags];
  data.credits = be16toh(get<uint16_t>(in + kOffCredits));
  data.target_iomap_size = in[kOffIomapSize];
  data.target_sgl = get_sge(in + kOffTargetSgl);
  data.data_buf = get_sge(in + kOffDataBuf);
  return data;
}

uint32_t value_to_scale(uint32_t value, int bits) {
  const uint32_t top = 1u << (bits - 1);
  return value <= top ? value : top | (value >> bits);
}

uint32_t scale_to_value(uint32_t scale, int bits) {
  const uint32_t top = 1u << (bits - 1);
  return scale <= top ? scale : (scale & ~top) << bits;
}

}  // namespace softhca::rsocket
