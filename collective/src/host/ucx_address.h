// What a rank publishes for its UCX peers, and which of its addresses a peer connects to.
//
// UCX (1.13; upstream master still does) reaches a peer over shared memory (sysv, posix,
// cma) when both share the machine's boot_id and the IPC namespace. A receiver that is
// idle (adaptive progress leaves a shared-memory interface unpolled until it has an
// endpoint, and a blocking wait sleeps on it) is woken by a datagram to a Unix socket in
// the abstract namespace, and abstract sockets belong to the network namespace: from
// another one the sendto() gets ECONNREFUSED, which UCX ignores. So two processes on one
// machine with one IPC namespace but two network namespaces (scripts/testcluster hosts,
// Docker --ipc=host or Kubernetes hostIPC: true with a network of their own) get paired
// over shared memory, and a rank whose first action is a receive never sees the message.
//
// Each rank therefore publishes where it runs (boot_id, network namespace) beside two
// addresses of its worker: the full one and the one with network transports only. A
// sender whose peer shares the machine but not the network namespace connects with the
// network-only address; every other pair gets the full address and UCX's own choice.
#pragma once

#include "control/store.h"

#include <cstdint>
#include <string>

namespace elasticrun::collective {

// Where a process runs, as far as UCX's shared memory is concerned. Unknown (empty
// machine) where /proc cannot tell; an unknown side never restricts a pair.
struct Locality {
  std::string machine;     // /proc/sys/kernel/random/boot_id, the machine id UCX compares
  std::uint64_t netns = 0; // inode of the calling thread's network namespace

  bool known() const { return !machine.empty() && netns != 0; }
  bool operator==(const Locality&) const = default;
};

// The calling thread's locality (/proc/thread-self: a namespace is a thread's, and UCX
// binds its sockets in the thread that builds the worker).
Locality this_locality();

// Whether a sender at `mine` must reach a peer at `peer` over network transports only:
// both known, one machine, two network namespaces.
bool needs_network_only(const Locality& mine, const Locality& peer);

// Which transports UCX may take to another machine. Where that is TCP alone, a message
// goes whole in the eager protocol whatever its size (UCX_RNDV_THRESH=inf, set by
// UcxTransport where the ranks span hosts): over TCP UCX's rendezvous moves no fewer
// copies and costs a handshake, a round trip or two per message, which behind 500 us
// links made recursive halving-doubling's 512 KiB-8 MiB halves 1.2-3.4x slower
// (bench/RESULTS.md). Over RDMA a rendezvous is zero-copy and stays.
//
// TCP alone where UCX_TLS (`tls`, null when unset) names only TCP and transports within a
// machine (self, shared memory, GPU copies), or where this machine has no RDMA device
// (`rdma_devices`: /sys/class/infiniband lists InfiniBand, RoCE and iWARP ports alike). A
// list of exclusions ("^...") or a name not known here says nothing.
bool network_is_tcp_only(const char* tls, bool rdma_devices);
// Whether /sys/class/infiniband lists a device.
bool has_rdma_devices();

// The value under `<scope>addr/<rank>`.
struct PublishedAddress {
  Locality where;
  Bytes full;      // ucp_worker_query's address
  Bytes net_only;  // the same with UCP_WORKER_ADDRESS_FLAG_NET_ONLY

  // The address a sender at `mine` connects with.
  const Bytes& for_sender_at(const Locality& mine) const {
    return needs_network_only(mine, where) ? net_only : full;
  }
};

Bytes encode(const PublishedAddress& a);
// Throws ProtocolError naming `rank` when `bytes` is not an encoded PublishedAddress.
PublishedAddress decode_address(const Bytes& bytes, int rank);

}  // namespace elasticrun::collective
