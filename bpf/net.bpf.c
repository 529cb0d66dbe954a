// SPDX-License-Identifier: Apache-2.0
// TCP retransmissions per owning process, from tracepoints only (this kernel has no kprobes).
//
// Retransmissions run in timer/softirq context, where the current task is unrelated to the
// socket, so the count is keyed by the socket's owner instead: the tgid last seen sending on
// the socket (sock:sock_send_length, process context) or connecting it
// (sock:inet_sock_set_state -> SYN_SENT, process context). Retransmits of a socket never seen
// sending since the agent started have owner 0 ("unattributed").
//
// Knobs, as -D flags: OWNERS_MAX (sockets remembered, LRU) and COUNTS_MAX (owner keys counted).

#include <uapi/linux/in.h>
#include <net/tcp_states.h>

#ifndef OWNERS_MAX
#define OWNERS_MAX 65536
#endif
#ifndef COUNTS_MAX
#define COUNTS_MAX 16384
#endif

struct retransmit_key {
    u32 tgid;     // socket owner; 0 when unknown
    u16 family;   // AF_INET or AF_INET6
    u16 pad;
};

BPF_TABLE("lru_hash", u64, u32, owners, OWNERS_MAX);          // sock address -> owner tgid
BPF_HASH(retransmits, struct retransmit_key, u64, COUNTS_MAX);
BPF_ARRAY(lost, u64, 1);                                       // retransmits not counted: map full

static __always_inline void remember_owner(const void *sk)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 key = (u64)sk;
    u32 *known;

    if (tgid == 0)
        return;
    known = owners.lookup(&key);
    // Most sends are by the socket's known owner: skip the write.
    if (known && *known == tgid)
        return;
    owners.update(&key, &tgid);
}

TRACEPOINT_PROBE(sock, sock_send_length)
{
    if (args->protocol == IPPROTO_TCP)
        remember_owner(args->sk);
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    u64 key = (u64)args->skaddr;

    if (args->protocol != IPPROTO_TCP)
        return 0;
    if (args->newstate == TCP_SYN_SENT)
        remember_owner(args->skaddr);  // connect(): SYN retransmits belong to the caller
    else if (args->newstate == TCP_CLOSE)
        owners.delete(&key);           // the address may be reused by another socket
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
    u64 sk = (u64)args->skaddr;
    struct retransmit_key key = {};
    u64 zero = 0, *count;
    u32 *owner = owners.lookup(&sk);
    int slot = 0;

    key.family = args->family;
    if (owner)
        key.tgid = *owner;
    count = retransmits.lookup_or_try_init(&key, &zero);
    if (count) {
        __sync_fetch_and_add(count, 1);
    } else {
        u64 *n = lost.lookup(&slot);
        if (n)
            __sync_fetch_and_add(n, 1);
    }
    return 0;
}
