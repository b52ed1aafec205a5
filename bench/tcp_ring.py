#!/usr/bin/python3
"""Plain TCP in a ring of hosts: the floor under a ring collective on the test cluster.

Run one per host at once; each listens on its own address, connects to the next host's,
sends BYTES to it while receiving BYTES from the previous one, and prints the time:

  for k in 1 2 3 4; do
    scripts/testcluster exec $k /usr/bin/python3 bench/tcp_ring.py 10.77.0.1$k 10.77.0.1$((k % 4 + 1)) 12000000 &
  done; wait
"""
import socket
import sys
import threading
import time


def main() -> int:
    if len(sys.argv) != 4:
        print("usage: tcp_ring.py MY_ADDR NEXT_ADDR BYTES", file=sys.stderr)
        return 2
    me, nxt, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
    port = 7001
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((me, port))
    srv.listen(1)
    deadline = time.time() + 10
    while True:  # the next host may not listen yet
        try:
            out = socket.create_connection((nxt, port), timeout=1)
            break
        except OSError:
            if time.time() > deadline:
                print(f"{me}: cannot reach {nxt}:{port}", file=sys.stderr)
                return 1
            time.sleep(0.05)
    inc, _ = srv.accept()
    chunk = b"x" * (1 << 20)
    got = 0

    def receive() -> None:
        nonlocal got
        while got < total:
            b = inc.recv(1 << 20)
            if not b:
                break
            got += len(b)

    start = time.time()
    rx = threading.Thread(target=receive)
    rx.start()
    sent = 0
    while sent < total:
        n = min(len(chunk), total - sent)
        out.sendall(chunk[:n])
        sent += n
    rx.join()
    ms = (time.time() - start) * 1e3
    print(f"{me}: {total} bytes each way in {ms:.1f} ms")
    return 0 if got == total else 1


if __name__ == "__main__":
    sys.exit(main())
