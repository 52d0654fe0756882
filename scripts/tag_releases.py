"""Creates the git tags of the releases recorded in releases.toml: ``v<version>`` on its commit.

Tooling (standard library only; ``make tags``). Nothing reads the tags: tests find a release by
its commit. A tag that already names the recorded commit is left alone; one that names another
commit is an error (the file and the tag disagree), and so is a commit this clone does not have
(a shallow clone: ``git fetch --unshallow``).

Usage: python scripts/tag_releases.py [--dry-run]   (prints the git commands it would run).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RELEASES = REPO_ROOT / "releases.toml"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    releases = tomllib.loads(RELEASES.read_text())["release"]
    for release in releases:
        tag, commit = f"v{release['version']}", release["commit"]
        if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            print(f"{tag}: commit {commit} is not in this clone (a shallow clone? "
                  "git fetch --unshallow)", file=sys.stderr)
            return 1
        tagged = _git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
        if tagged.returncode == 0:
            if tagged.stdout.strip() != commit:
                print(f"{tag} names {tagged.stdout.strip()}, releases.toml says {commit}",
                      file=sys.stderr)
                return 1
            print(f"{tag}: already on {commit}")
            continue
        command = ["git", "tag", "-a", tag, commit, "-m", f"hami-accounting {release['version']}"]
        if dry_run:
            print(shlex.join(command))
            continue
        subprocess.run(command, cwd=REPO_ROOT, check=True)
        print(f"{tag}: tagged {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
