"""Keeps a cached cargo target folder from growing without end.

Every build of a test or bench target links a new executable named
`NAME-<16 hex digits>` in `<target>/<profile>/deps`; the older ones stay
behind (hundreds of MB each, tens of GB after a few dozen runs). This
removes all but the newest executable of each name (and its `.d` file),
in the profiles given, and prints what it freed. Cargo relinks one it
needs again. Usage: python3 .ci/prune-target.py TARGET_DIR [PROFILE...]
"""

import collections
import os
import re
import sys


def prune(deps):
    groups = collections.defaultdict(list)
    for name in os.listdir(deps):
        path = os.path.join(deps, name)
        match = re.fullmatch(r"(.+)-([0-9a-f]{16})", name)
        if match and os.path.isfile(path) and os.access(path, os.X_OK):
            stat = os.stat(path)
            groups[match.group(1)].append((stat.st_mtime, path, stat.st_size))
    freed = 0
    for items in groups.values():
        items.sort(reverse=True)
        for _, path, size in items[1:]:
            for stale in (path, path + ".d"):
                try:
                    os.remove(stale)
                except FileNotFoundError:
                    pass
            freed += size
    return freed


def main():
    target = sys.argv[1]
    profiles = sys.argv[2:] or ["debug", "release"]
    freed = 0
    for profile in profiles:
        deps = os.path.join(target, profile, "deps")
        if os.path.isdir(deps):
            freed += prune(deps)
    print(f"freed {freed / 2**30:.1f} GiB of stale test and bench executables under {target}")


if __name__ == "__main__":
    main()
