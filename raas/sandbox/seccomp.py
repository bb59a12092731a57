"""The seccomp filter of a sandbox: system calls refused, in bwrap's form and in apptainer's.

What an agent never needs and the kernel has had its worst bugs in: io_uring, the kernel keyring,
loading kernel modules, eBPF, kexec and perf events. They fail with EPERM, so a program that
probes for them (an io_uring-capable runtime) falls back as it would on a locked-down host.
Everything else is allowed: a deny list, not a profile of what agents may run.

Written by hand (a classic-BPF program of a dozen instructions). libseccomp is on Debian and
PyPI has a pure-Python ctypes binding for it (pyseccomp 0.1.2); it was not tried yet, and would
take the syscall tables below off raas's hands. The numbers are those of x86_64 and aarch64 (the
kernel's tables); the program first checks the architecture, and a call of any other (32-bit
x86 through ``int 0x80``) kills the process, as does an x32 call on x86_64, whose numbers
would otherwise get around the list.

Apptainer takes the same list as a JSON profile (``profile``, Docker's format, read by
``apptainer exec --security seccomp:FILE``), which apptainer turns into a filter with libseccomp
and installs in the container's process just before it execs the command: by name, so for every
architecture libseccomp knows, and a call of another architecture (or an x32 one) kills the
calling thread (libseccomp's default for a foreign architecture).
"""

from __future__ import annotations

import errno
import json
import platform
import struct
from dataclasses import dataclass

# linux/audit.h
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
# linux/filter.h, linux/seccomp.h
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_RET_K = 0x06
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; ...
NR_OFFSET = 0
ARCH_OFFSET = 4
X32_SYSCALL_BIT = 0x40000000

REFUSED = (
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    "init_module", "finit_module", "delete_module",
    "bpf", "kexec_load", "kexec_file_load", "perf_event_open",
)  # fmt: skip


@dataclass(frozen=True)
class Arch:
    audit: int
    numbers: dict[str, int]
    x32: bool = False


# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h
ARCHES = {
    "x86_64": Arch(
        AUDIT_ARCH_X86_64,
        {
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "keyctl": 250, "add_key": 248, "request_key": 249,
            "init_module": 175, "finit_module": 313, "delete_module": 176,
            "bpf": 321, "kexec_load": 246, "kexec_file_load": 320, "perf_event_open": 298,
        },
        x32=True,
    ),
    "aarch64": Arch(
        AUDIT_ARCH_AARCH64,
        {
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "keyctl": 219, "add_key": 217, "request_key": 218,
            "init_module": 105, "finit_module": 273, "delete_module": 106,
            "bpf": 280, "kexec_load": 104, "kexec_file_load": 294, "perf_event_open": 241,
        },
    ),
}  # fmt: skip


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(arch: Arch) -> bytes:
    """The filter for ``arch``: an array of ``struct sock_filter``, as bwrap reads it."""
    numbers = [arch.numbers[name] for name in REFUSED]
    head = [
        _insn(BPF_LD_W_ABS, ARCH_OFFSET),
        _insn(BPF_JEQ_K, arch.audit, jt=1),
        _insn(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        _insn(BPF_LD_W_ABS, NR_OFFSET),
    ]
    if arch.x32:
        head += [
            _insn(BPF_JGE_K, X32_SYSCALL_BIT, jf=1),
            _insn(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        ]
    # One test a number; each match jumps over the tests left and the ALLOW to the ERRNO.
    tests = [
        _insn(BPF_JEQ_K, nr, jt=len(numbers) - i) for i, nr in enumerate(numbers)
    ]  # jt: the tests after this one, then ALLOW
    tail = [_insn(BPF_RET_K, SECCOMP_RET_ALLOW), _insn(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EPERM)]
    return b"".join(head + tests + tail)


def profile() -> bytes:
    """The filter as a seccomp profile in Docker's JSON format (apptainer's ``--security
    seccomp:FILE``): everything allowed but ``REFUSED``, which fails with EPERM.
    """
    refused = {"names": list(REFUSED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [refused]}).encode()


def host_program() -> bytes | None:
    """The filter for this machine's architecture; None where raas knows no numbers for it."""
    arch = ARCHES.get(platform.machine())
    return program(arch) if arch is not None else None
