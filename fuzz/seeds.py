#!/usr/bin/env python3
"""Writes the binary seed corpora in fuzz/corpus/ (the text ones are plain
files). Rerun after a wire format changes: python3 fuzz/seeds.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
BOOT_MAGIC = 0x43464C5842535031
AF_INET, AF_INET6 = 2, 10


def wire(family=AF_INET, port=12345, addr=b"\x7f\x00\x00\x01"):
    return struct.pack("<HHI", family, socket_port(port), 0) + addr.ljust(16, b"\0")


def socket_port(port):
    return struct.unpack("<H", struct.pack(">H", port))[0]


def put(name, seed, data):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, seed), "wb") as f:
        f.write(data)


def bootstrap():
    secret = 0x1122334455667788
    hello = lambda r, n, s=secret, fam=AF_INET: struct.pack("<QQii", BOOT_MAGIC, s, r, n) + wire(fam)
    put("fuzz_bootstrap", "hellos_4_ranks", b"\0" + struct.pack("<Q", secret)
        + b"".join(hello(r, 4) for r in (2, 0, 3, 1)))
    put("fuzz_bootstrap", "hellos_strangers", b"\0" + struct.pack("<Q", secret)
        + hello(0, 2, s=1) + hello(5, 2) + hello(0, 2, fam=7) + hello(1, 3) + hello(0, 2) + hello(0, 2))
    hdr = lambda kind, src, size: struct.pack("<QQIiIIQ", BOOT_MAGIC, secret, kind, src, 7, 0, size)
    ctx = lambda n, r, ring: struct.pack("<QIIB", secret, n - 1, r, ring)
    put("fuzz_bootstrap", "peer_ring", b"\1" + ctx(4, 1, 0) + hdr(1, 0, 0))
    put("fuzz_bootstrap", "peer_message", b"\1" + ctx(4, 1, 1) + hdr(2, 3, 272))
    put("fuzz_bootstrap", "peer_message_huge", b"\1" + ctx(4, 1, 1) + hdr(2, 3, 1 << 40))
    put("fuzz_bootstrap", "reply_ok", b"\2" + struct.pack("<I", 2) + struct.pack("<QIi", BOOT_MAGIC, 0, 3)
        + wire() + wire(AF_INET6, addr=b"\0" * 15 + b"\1") + b"\0" * 24)
    bid = struct.pack("<QQII", BOOT_MAGIC, secret, 1, 0) + wire()
    put("fuzz_bootstrap", "unique_id", b"\3" + bid.ljust(128, b"\0"))


def socket_wire():
    info_recv = struct.pack("<IIQiI", 0x52584643, 2, 0xABCDEF, 1, 0) + wire()
    info_send = struct.pack("<IIQiI", 0x53584643, 0, 0, 1, 0) + b"\0" * 24
    put("fuzz_socket_wire", "info_for_sender", b"\0\0" + struct.pack("<I", 1) + info_recv)
    put("fuzz_socket_wire", "info_for_receiver", b"\0\1" + struct.pack("<I", 1) + info_send)
    hello = lambda r, i, n: struct.pack("<IiQII", 0x48584643, r, 0xABCDEF, i, n)
    put("fuzz_socket_wire", "hellos", b"\1" + struct.pack("<IB", 3, 3)
        + hello(3, 1, 4) + hello(3, 1, 4) + hello(2, 0, 4) + hello(3, 9, 4) + hello(3, 0, 4)
        + hello(3, 3, 4) + hello(3, 2, 4))
    print_ = struct.pack("<QQiBBBBII", 5, 1024, -1, 0, 7, 0, 1, 0, 0)
    header = lambda step, size, magic=0x44584643: struct.pack("<IIQ", magic, step, size) + print_
    put("fuzz_socket_wire", "headers", b"\2" + struct.pack("<II", 524288 - 1, 0)
        + header(0, 4096) + header(1, 524288) + header(2, 0) + header(3, 1 << 33))
    put("fuzz_socket_wire", "poison", b"\2" + struct.pack("<II", 4095, 0)
        + header(0, 4096) + header(1, (3 << 32) | 5, magic=0x50584643))


def shm_info():
    def info(kind, nbytes, addr, pid, fd):
        return struct.pack("<IIQQii", kind, 0, nbytes, addr, pid, fd)
    expect, pid = 4096 * 2, 1234
    flags_proc, flags_thread = 0x00, 0x01
    head = lambda flags: bytes([flags]) + struct.pack("<II", expect, pid)
    put("fuzz_shm_info", "memfd", head(flags_proc)
        + info(1, expect, 0, pid, 7).ljust(256, b"\0"))
    put("fuzz_shm_info", "memfd_of_another_process", head(flags_proc)
        + info(1, expect, 0, 1, 7).ljust(256, b"\0"))
    put("fuzz_shm_info", "local", head(flags_thread)
        + info(2, expect, 0x7f0000001000, 0, -1).ljust(256, b"\0"))
    put("fuzz_shm_info", "local_from_elsewhere", head(flags_proc)
        + info(2, expect, 0xdeadbeef, 0, -1).ljust(256, b"\0"))


if __name__ == "__main__":
    bootstrap()
    socket_wire()
    shm_info()
