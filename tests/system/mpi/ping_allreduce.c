/* ping_allreduce: a small MPI program that checks data over the transport
 * Open MPI picked (on softhca: the ucx pml over rc_verbs/ud_verbs).
 *
 * Ranks 0 and 1 ping-pong messages of several sizes, from one byte through
 * the sizes where UCX switches from eager sends to rendezvous (RDMA reads),
 * each filled with a pattern of (size, round, byte index); the receiver
 * checks every byte and answers with the bytes complemented, which the sender
 * checks in turn. Then every rank takes part in an MPI_Allreduce (a sum of
 * vectors whose result is known in closed form) and an MPI_Barrier.
 *
 * Rank 0 prints "ping_allreduce: ranks N, S sizes, M messages, B bytes checked,
 * allreduce ok" at the end; any mismatch prints the first bad byte and aborts
 * with exit status 1. Usage: mpirun -np 2 ping_allreduce [ROUNDS]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t kSizes[] = {1, 8, 64, 1000, 4096, 8193, 65536, 1 << 20};
enum { kNumSizes = sizeof kSizes / sizeof kSizes[0], kAllreduceCount = 4099 };

static unsigned char pattern(size_t size, int round, size_t i) {
  return (unsigned char)((i * 131u) ^ (size * 7u) ^ ((unsigned)round * 29u) ^ (i >> 8));
}

static void fail(int rank, const char* what, size_t size, int round, size_t i, unsigned got, unsigned want) {
  fprintf(stderr, "ping_allreduce: rank %d: %s: size %zu round %d byte %zu is 0x%02x, expected 0x%02x\n", rank,
          what, size, round, i, got, want);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char** argv) {
  int rank = 0, ranks = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int rounds = argc > 1 ? atoi(argv[1]) : 10;
  if (ranks < 2 || rounds < 1) {
    if (rank == 0) fprintf(stderr, "ping_allreduce: needs at least 2 ranks and 1 round\n");
    MPI_Finalize();
    return 2;
  }

  unsigned char* buf = malloc(kSizes[kNumSizes - 1]);
  if (buf == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  long long messages = 0, bytes = 0;
  if (rank < 2) {
    const int peer = 1 - rank;
    for (int s = 0; s < kNumSizes; ++s) {
      const size_t size = kSizes[s];
      for (int round = 0; round < rounds; ++round) {
        const int tag = s * 1000 + round;
        if (rank == 0) {
          for (size_t i = 0; i < size; ++i) buf[i] = pattern(size, round, i);
          MPI_Send(buf, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD);
          memset(buf, 0, size);
          MPI_Recv(buf, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          for (size_t i = 0; i < size; ++i) {
            const unsigned char want = (unsigned char)~pattern(size, round, i);
            if (buf[i] != want) fail(rank, "pong", size, round, i, buf[i], want);
          }
        } else {
          MPI_Status status;
          int count = 0;
          memset(buf, 0, size);
          MPI_Recv(buf, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &status);
          MPI_Get_count(&status, MPI_BYTE, &count);
          if ((size_t)count != size) fail(rank, "ping length", size, round, (size_t)count, 0, 0);
          for (size_t i = 0; i < size; ++i) {
            const unsigned char want = pattern(size, round, i);
            if (buf[i] != want) fail(rank, "ping", size, round, i, buf[i], want);
            buf[i] = (unsigned char)~buf[i];
          }
          MPI_Send(buf, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD);
        }
        messages += 2;
        bytes += 2 * (long long)size;
      }
    }
  }

  /* Allreduce: rank r contributes v[i] = (r + 1) * (i + 1); the sum over
   * ranks is (i + 1) * ranks * (ranks + 1) / 2. */
  long long* in = malloc(kAllreduceCount * sizeof *in);
  long long* out = malloc(kAllreduceCount * sizeof *out);
  if (in == NULL || out == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 0; i < kAllreduceCount; ++i) {
    in[i] = (long long)(rank + 1) * (i + 1);
    out[i] = -1;
  }
  MPI_Allreduce(in, out, kAllreduceCount, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < kAllreduceCount; ++i) {
    const long long want = (long long)(i + 1) * ranks * (ranks + 1) / 2;
    if (out[i] != want) {
      fprintf(stderr, "ping_allreduce: rank %d: allreduce element %d is %lld, expected %lld\n", rank, i, out[i],
              want);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    printf("ping_allreduce: ranks %d, %d sizes, %lld messages, %lld bytes checked, allreduce ok\n", ranks,
           kNumSizes, messages, bytes);
  }
  free(in);
  free(out);
  free(buf);
  MPI_Finalize();
  return 0;
}
