#include "c10d/collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace elasticrun::python::c10d {
namespace {

Request request(Request::Kind kind, const void* in, void* out, std::size_t count, DataType type, bool check) {
  Request r;
  r.kind = kind, r.in = in, r.out = out, r.count = count, r.type = type, r.check = check;
  return r;
}

// memcpy, for buffers that may be empty (an empty tensor's data pointer may be null).
void copy(void* to, const void* from, std::size_t bytes) {
  if (bytes != 0) std::memcpy(to, from, bytes);
}

void check_ranks(Context& ctx, std::size_t n, const char* what) {
  const int size = ctx.comm().size();
  if (n != static_cast<std::size_t>(size))
    throw Error(fmt::format("{}: {} buffers for {} ranks", what, n, size));
}

}  // namespace

void allreduce_concatenated(Context& ctx, std::span<void* const> bufs, std::span<const std::size_t> counts,
                         DataType type, ReduceOp op, bool check) {
  const std::size_t esize = size_of(type);
  std::size_t total = 0;
  for (auto c : counts) total += c;
  std::vector<std::uint8_t> flat(total * esize);
  std::size_t at = 0;
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    copy(flat.data() + at, bufs[i], counts[i] * esize);
    at += counts[i] * esize;
  }
  Request r = request(Request::Kind::allreduce, flat.data(), flat.data(), total, type, check);
  r.op = op;
  execute(ctx, r);
  at = 0;
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    copy(bufs[i], flat.data() + at, counts[i] * esize);
    at += counts[i] * esize;
  }
}

void allgather_into(Context& ctx, const void* in, std::size_t count, DataType type, std::span<void* const> outs,
                    bool check) {
  check_ranks(ctx, outs.size(), "allgather");
  const std::size_t bytes = count * size_of(type);
  std::vector<std::uint8_t> all(bytes * outs.size());
  execute(ctx, request(Request::Kind::allgather, in, all.data(), count, type, check));
  for (std::size_t r = 0; r < outs.size(); ++r) copy(outs[r], all.data() + r * bytes, bytes);
}

void reduce_scatter_from(Context& ctx, std::span<const void* const> ins, void* out, std::size_t count,
                         DataType type, ReduceOp op, bool check) {
  check_ranks(ctx, ins.size(), "reduce_scatter");
  const std::size_t bytes = count * size_of(type);
  std::vector<std::uint8_t> all(bytes * ins.size());
  for (std::size_t r = 0; r < ins.size(); ++r) copy(all.data() + r * bytes, ins[r], bytes);
  Request q = request(Request::Kind::reduce_scatter, all.data(), out, count, type, check);
  q.op = op;
  execute(ctx, q);
}

void reduce_to(Context& ctx, void* buf, std::size_t count, DataType type, ReduceOp op, int root, bool check) {
  // An allreduce, whose result non-root ranks drop: the library has no rooted reduce,
  // and its allreduce moves no more data than a reduce followed by nothing.
  std::vector<std::uint8_t> scratch;
  void* out = buf;
  if (ctx.comm().rank() != root) {
    scratch.resize(count * size_of(type));
    out = scratch.data();
  }
  Request r = request(Request::Kind::allreduce, buf, out, count, type, check);
  r.op = op;
  execute(ctx, r);
}

void gather_to(Context& ctx, const void* in, std::size_t count, DataType type, std::span<void* const> outs,
               int root, bool check) {
  if (ctx.comm().rank() == root) return allgather_into(ctx, in, count, type, outs, check);
  std::vector<std::uint8_t> all(count * size_of(type) * static_cast<std::size_t>(ctx.comm().size()));
  execute(ctx, request(Request::Kind::allgather, in, all.data(), count, type, check));
}

void scatter_from(Context& ctx, std::span<const void* const> ins, void* out, std::size_t count, DataType type,
                  int root, bool check) {
  // root's blocks, broadcast whole; each rank keeps its own.
  const std::size_t n = static_cast<std::size_t>(ctx.comm().size()), bytes = count * size_of(type);
  const std::size_t me = static_cast<std::size_t>(ctx.comm().rank());
  std::vector<std::uint8_t> all(bytes * n);
  if (me == static_cast<std::size_t>(root)) {
    check_ranks(ctx, ins.size(), "scatter");
    for (std::size_t r = 0; r < n; ++r) copy(all.data() + r * bytes, ins[r], bytes);
  }
  Request r = request(Request::Kind::broadcast, nullptr, all.data(), count * n, type, check);
  r.root = root;
  execute(ctx, r);
  copy(out, all.data() + me * bytes, bytes);
}

void alltoallv(Context& ctx, std::span<const Block> in, std::span<const MutableBlock> out) {
  check_ranks(ctx, in.size(), "alltoall");
  check_ranks(ctx, out.size(), "alltoall");
  const std::size_t n = in.size();
  std::int64_t largest = 0;
  for (std::size_t j = 0; j < n; ++j)
    largest = std::max({largest, static_cast<std::int64_t>(in[j].bytes), static_cast<std::int64_t>(out[j].bytes)});
  Request agree = request(Request::Kind::allreduce, &largest, &largest, 1, DataType::i64, false);
  agree.op = ReduceOp::max;
  execute(ctx, agree);
  const std::size_t block = static_cast<std::size_t>(largest);
  if (block == 0) return;
  std::vector<std::uint8_t> send(block * n), recv(block * n);
  for (std::size_t j = 0; j < n; ++j) copy(send.data() + j * block, in[j].data, in[j].bytes);
  execute(ctx, request(Request::Kind::alltoall, send.data(), recv.data(), block, DataType::u8, false));
  for (std::size_t j = 0; j < n; ++j) copy(out[j].data, recv.data() + j * block, out[j].bytes);
}

}  // namespace elasticrun::python::c10d
