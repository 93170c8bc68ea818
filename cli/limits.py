"""The process's own limits, raised where the kernel lets a user raise them."""

from __future__ import annotations

# Descriptors a daemon (or a load generator) wants: each client connection,
# each server's pipes or sockets, the listeners. The common soft limit,
# 1024 (systemd's default for user processes, with a hard limit of 524288),
# is a few hundred idle TCP connections from locking every host out.
WANTED_DESCRIPTORS = 65536


def raise_fd_limit(wanted: int = WANTED_DESCRIPTORS) -> int:
    """Raise the soft limit on open descriptors to ``wanted`` (at most the
    hard limit; never lowered). Returns the soft limit now."""
    try:
        import resource
    except ImportError:  # (not on this system)
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft  # (a kernel's own cap, nr_open, below it: keep what there is)
        return target
    return soft
