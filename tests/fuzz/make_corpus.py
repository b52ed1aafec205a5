#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ (small valid inputs).

Run it again after a change to the wire format; it only writes the seeds it names
(seed-*), so regression inputs added by hand (regress-*) stay.

Frame inputs start with two bytes the fuzzer reads as flags and chunk seed (see
frame_fuzz.cc), then the stream: frames of header (u16 magic 0x5245, u8 type, u8
version 1, u32 length) + payload, all little endian."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def u8(v): return struct.pack('<B', v)
def u32(v): return struct.pack('<I', v & 0xffffffff)
def u64(v): return struct.pack('<Q', v)
def i32(v): return struct.pack('<i', v)
def string(s): b = s.encode() if isinstance(s, str) else s; return u32(len(b)) + b
def strings(v): return u32(len(v)) + b''.join(string(s) for s in v)


def frame(t, payload):
    return struct.pack('<HBBI', 0x5245, t, 1, len(payload)) + payload


MESSAGES = {
    'hello': frame(1, string(b'\x01' * 16)),
    'auth': frame(2, string('worker') + string(b'\x02' * 16) + string(b'\x03' * 32)),
    'auth_ok': frame(3, string(b'\x04' * 32)),
    'error': frame(4, u64(7) + string('no such key')),
    'join': frame(10, string('node1') + u32(0) + u32(4242) + u64(0)),
    'join_ok': frame(11, u64(0) + u64(3) + i32(1) + i32(4) + i32(1) + i32(2) + i32(0) + i32(2) + u32(1000)),
    'kv_set': frame(12, u64(1) + string('key') + string(b'value')),
    'kv_get': frame(13, u64(2) + string('key') + u32(1000)),
    'kv_value': frame(14, u64(2) + string(b'value')),
    'barrier': frame(15, u64(3) + string('init') + u32(5000)),
    'ok': frame(16, u64(3)),
    'notify': frame(17, u8(2) + u64(4) + string('hosts changed')),
    'leave': frame(18, b''),
    'rejoin': frame(19, u64(5) + u64(4)),
    'report': frame(20, u64(6) + u64(40) + string('{"loss":0.25,"accuracy":0.9}')),
    'report_reply': frame(21, u64(6) + u8(1)),
    'config': frame(30, string(b'\x05' * 32) + string('10.0.0.1:29500') + string('node1') + string('/tmp')
                    + u32(5) + u32(2500) + u32(10000) + strings(['torch', 'torch.distributed'])),
    'spawn': frame(31, u32(0) + u64(1) + i32(0) + i32(2) + strings(['python3', 'train.py']) + strings(['A=1', 'B=2'])
                   + i32(2)),
    'kill': frame(32, u32(0xffffffff) + i32(15)),
    'shutdown': frame(33, u32(2000)),
    'ready': frame(34, u32(99) + string('node1') + u32(5)),
    'started': frame(35, u32(0) + u32(100)),
    'output': frame(36, u32(0) + u8(1) + string(b'hello\n')),
    'exited': frame(37, u32(0) + u32(100) + i32(1) + i32(0) + string('{"message": "boom"}') + u64(19)),
    'spawn_failed': frame(38, u32(1) + string('exec: no such file')),
    'heartbeat': frame(39, b''),
    'reserve_port': frame(40, u64(2) + u8(1)),
    'port_reserved': frame(41, u64(2) + u32(29500) + string('') + u8(1)),
}


def xxh3(data):
    """XXH3_64bits from Debian's libxxhash0 (the library the checkpoint code links)."""
    import ctypes
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(data, len(data))


def checkpoint_file(kind, epoch, commit, items, payload):
    """A checkpoint file (collective/src/control/checkpoint_file.h), checksums included."""
    manifest = (string(kind) + u64(epoch) + u64(commit) + u32(len(items)) +
                b''.join(string(n) + u32(t) + u64(b) for n, t, b in items) +
                u64(len(payload)) + u64(xxh3(payload)) + string('node1') + u32(42) + u64(1700000000000))
    head = b'ERCKPT1\n' + u64(len(manifest)) + manifest
    return head + payload + u64(xxh3(head))


def write(target, name, data):
    d = os.path.join(HERE, 'corpus', target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'seed-' + name), 'wb') as f:
        f.write(data)


def main():
    for name, fr in MESSAGES.items():
        write('frame_fuzz', name, b'\x00\x00' + fr)        # fed whole
    write('frame_fuzz', 'chunked-session', b'\x07\x2a' + b''.join(MESSAGES.values()))  # 1..8-byte chunks
    write('frame_fuzz', 'partial', b'\x03\x01' + MESSAGES['spawn'][:-3])
    write('frame_fuzz', 'oversize-small-limit', b'\x80\x00' + frame(36, u32(0) + u8(1) + string(b'x' * 80)))
    write('frame_fuzz', 'bad-magic', b'\x00\x00' + MESSAGES['ok'] + b'GET / HTTP/1.1\r\n\r\n')

    d = b'\x00'  # default slots 1
    write('discovery_fuzz', 'plain', d + b'node1\nnode2:4\nnode3 slots=2\n')
    write('discovery_fuzz', 'comments-crlf', d + b'# hosts\r\nnode1:2 # gpu box\r\n\r\n  node2\t slots=8\r\n')
    write('discovery_fuzz', 'repeats', b'\x03' + b'a\nb:2\na:3\nb\na\n')
    write('discovery_fuzz', 'ipv6', d + b'[fe80::1]:2\n[::1]\nuser@host:3\n')
    write('discovery_fuzz', 'host-list', b'\x01' + b'a:4,b:2,c')
    write('discovery_fuzz', 'max-slots', b'\x80' + b'big\nbig:1\n')
    write('discovery_fuzz', 'errors', d + b'good\nbad slots=x\n-dash\n' + b'\xff\x00\n')

    write('metrics_fuzz', 'plain', b'{"loss":0.25,"accuracy":0.91,"step_time":12}')
    write('metrics_fuzz', 'empty', b'{}')
    write('metrics_fuzz', 'escapes', b'{"a\\u00e9\\n":-1e-300, "b": 1.7976931348623157e308}')
    write('metrics_fuzz', 'nested', b'{"a":[1,{"b":2}],"c":null,"d":"x"}')
    # checkpoint_fuzz: a mode byte (0: as is, 1: trailer recomputed), then a file.
    write('checkpoint_fuzz', 'state', b'\x00' + checkpoint_file('state', 3, 40, [('w', 5, 16), ('step', 7, 8)],
                                                                 bytes(range(24))))
    write('checkpoint_fuzz', 'python', b'\x01' + checkpoint_file('python', 1, 7, [('pickle', 0, 5)], b'\x80\x05N.\x00'))
    write('checkpoint_fuzz', 'empty', b'\x00' + checkpoint_file('state', 0, 0, [], b''))
    # (inputs naming --checkpoint-dir are skipped: it makes a directory)
    write('options_fuzz', 'checkpoint', b'--checkpoint-every\x005\x00--checkpoint-interval\x000.5\x00prog')
    write('options_fuzz', 'report-fd', b'--report-fd\x003\x00-np\x002\x00./train')
    write('options_fuzz', 'np', b'-np\x004\x00-H\x00a:2,b:2\x00./train')
    write('options_fuzz', 'elastic', b'--min-np\x002\x00--max-np\x004\x00--host-discovery-script\x00./d.sh\x00'
          b'--blacklist-cooldown-range\x001\x0010\x00--\x00python3\x00train.py')
    write('options_fuzz', 'env', b'-x\x00A=1\x00-xHOME\x00--start-timeout=5\x00--log-level\x00info\x00prog\x00--np')
    write('options_fuzz', 'help', b'--help')
    write('options_fuzz', 'preload', b'--preload\x00torch,torch.distributed\x00--max-restarts\x001\x00python3\x00-m\x00x')
    write('options_fuzz', 'worker-timeout', b'--worker-timeout\x002.5\x00--host-timeout=30\x00-np\x002\x00prog')
    write('options_fuzz', 'timeouts', b'--discovery-interval\x000.5\x00--reset-limit\x003\x00--slots-per-host\x002\x00'
          b'--output-filename\x00out\x00--events\x00ev.jsonl\x00-v\x00cmd')


if __name__ == '__main__':
    main()
