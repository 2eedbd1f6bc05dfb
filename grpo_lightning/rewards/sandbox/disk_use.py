"""What a code run's files hold on disk, as the trainer polls it where the kernel does not cap it.

The kernel's cap is a tmpfs of ``disk_mb`` as the run's directory (bubblewrap 0.8+, or the ``python``
backend in its private root); it is exact, whatever the number of files, and costs nothing. Where it
is missing (an older bubblewrap; user namespaces refused), the run's directory is the host's, and the
trainer reads its size every ``DISK_POLL_S``, stopping the run once past the cap. That poll lets a run
overshoot by what it writes between two polls, and does not see a file unlinked while held open
(each still capped by ``file_size_mb``): the reason the kernel's cap comes first. Where it holds, the
host's directory stays empty and a poll costs one ``scandir``.
"""

from __future__ import annotations

import math
import os
import stat

DISK_POLL_S = 0.02
BLOCK_BYTES = 4096


def disk_use(directory: str, limit: int) -> int | float:
    """Bytes the files beneath ``directory`` hold on disk, each entry counted as one block at least (so
    that a million empty files count too); the count stops once past ``limit``, which bounds its
    cost. A directory the program made unreadable counts as infinite."""
    total, pending = 0, [directory]
    while pending and total <= limit:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        held = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed since it was listed
                    total += max(held.st_blocks * 512, BLOCK_BYTES)
                    if stat.S_ISDIR(held.st_mode):
                        pending.append(entry.path)
                    if total > limit:
                        break
        except FileNotFoundError:
            continue
        except OSError:
            return math.inf
    return total
