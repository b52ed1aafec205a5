#!/usr/bin/python3
"""A DNS server that answers slowly: every query gets NXDOMAIN after --delay seconds.

For the test of the driver's name lookups (test_slow_dns.py): run inside a network and
mount namespace whose /etc/resolv.conf names it. Each query is logged as a line
"<received> <answered> <name>" (CLOCK_MONOTONIC seconds) to --log; --ready is created once
the socket is bound."""
import argparse
import socket
import struct
import threading
import time


def question_name(packet):
    labels, i = [], 12
    while i < len(packet) and packet[i]:
        n = packet[i]
        labels.append(packet[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels), i + 5  # the zero label, QTYPE and QCLASS


def nxdomain(packet):
    qid, flags = struct.unpack("!HH", packet[:4])
    _, end = question_name(packet)
    # QR, the query's opcode and RD, RA, RCODE 3; one question, no answers.
    header = struct.pack("!HHHHHH", qid, 0x8000 | (flags & 0x7900) | 0x0080 | 3, 1, 0, 0, 0)
    return header + packet[12:end]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--delay", type=float, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--port", type=int, default=53)
    a = p.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", a.port))
    open(a.ready, "w").close()
    lock = threading.Lock()

    def answer(packet, peer, received):
        time.sleep(a.delay)
        sock.sendto(nxdomain(packet), peer)
        with lock, open(a.log, "a") as f:
            f.write(f"{received:.3f} {time.monotonic():.3f} {question_name(packet)[0]}\n")

    while True:
        packet, peer = sock.recvfrom(4096)
        if len(packet) > 12:
            threading.Thread(target=answer, args=(packet, peer, time.monotonic()), daemon=True).start()


if __name__ == "__main__":
    main()
