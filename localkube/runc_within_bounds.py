#!/usr/bin/python3 -I
"""A runc for Docker that never asks for a capability this machine's bounding set lacks.

On a host whose root lacks a capability in its bounding set (this VM: CAP_SYS_RESOURCE),
Docker 20.10 grants `--privileged` containers every capability it knows, and runc fails each
one with "unable to apply caps: operation not permitted". kind runs every node privileged,
with no way to ask otherwise. `localkube.host.ensure_privileged_containers` makes this script
Docker's default runtime there: before `create`, `run` or `exec` it drops from the container's
(or process's) OCI spec the capabilities nobody on this host can hold, then runs the real runc
with the same arguments. Everything else passes through unchanged.

Standalone on purpose (the system Python, standard library only): Docker runs it for every
container operation, outside the project's environment.
"""

import json
import os
import sys

REAL_RUNC = os.environ.get("GREGOR_REAL_RUNC", "/usr/sbin/runc")
# fmt: off
CAPABILITY_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)
# fmt: on
"""Linux's capabilities by number (capability.h)."""


def unavailable() -> set[str]:
    """The capabilities missing from this process's bounding set, as OCI names."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapBnd:"):
                bounding = int(line.split()[1], 16)
                return {
                    f"CAP_{name}"
                    for bit, name in enumerate(CAPABILITY_NAMES)
                    if not bounding >> bit & 1
                }
    return set()


def spec_file(argv: list[str]) -> tuple[str, bool] | None:
    """The OCI file this invocation reads: (path, whether it is a whole bundle's config.json
    rather than an exec's process.json); None for any other command."""
    command = next((a for a in argv if a in ("create", "run", "exec")), None)
    if command is None:
        return None
    flags = ("--bundle", "-b") if command != "exec" else ("--process", "-p")
    for index, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and index + 1 < len(argv):
                value = argv[index + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            else:
                continue
            if command == "exec":
                return value, False
            return os.path.join(value, "config.json"), True
    if command != "exec":
        return "config.json", True  # runc's default bundle is the working directory
    return None


def drop_unavailable(path: str, whole_spec: bool, missing: set[str]) -> None:
    with open(path) as file:
        spec = json.load(file)
    process = spec.get("process", {}) if whole_spec else spec
    capabilities = process.get("capabilities") or {}
    changed = False
    for kind, names in capabilities.items():
        if isinstance(names, list) and missing & set(names):
            capabilities[kind] = [name for name in names if name not in missing]
            changed = True
    if changed:
        with open(path + ".tmp", "w") as file:
            json.dump(spec, file)
        os.replace(path + ".tmp", path)


def main() -> None:
    argv = sys.argv[1:]
    found = spec_file(argv)
    if found is not None and os.path.exists(found[0]):
        missing = unavailable()
        if missing:
            drop_unavailable(found[0], found[1], missing)
    os.execv(REAL_RUNC, [REAL_RUNC, *argv])


if __name__ == "__main__":
    main()
