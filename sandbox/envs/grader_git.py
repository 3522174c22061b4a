"""git as the SWE-smith grader and env run it: never with the repository's own configuration.

The agent controls its repository's `.git` (config and its includes, hooks, info/attributes) and
its `.gitattributes`; any git the grader runs there would obey them: hooks, `core.fsmonitor`,
`diff.external` / textconv and clean / smudge filters run code, and an external diff prints
whatever patch it likes. So:
- `patch_script` extracts the agent's patch with a git directory of its own (made fresh in a
  temporary dir, the agent's objects reached read-only through `alternates`, the base commit
  named by the grader): no config, hooks or info/attributes of the agent's, no system or global
  config, no external diff or textconv; `.gitattributes` name drivers nobody defines;
- `SAFE_GIT` is the prefix of every other git the grader runs (its own trees: config off as
  far as git allows, hooks and fsmonitor off);
- `git_paths` / `touches_git` refuse a patch with a `.git` path (or `.gitattributes`,
  `.gitmodules`) in any header a patch tool reads, and `APPLY` applies with the tree's `.git`
  moved out of reach, so the `patch --fuzz` fallback cannot write under it either.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

# config git reads besides the repository's own, and the repository settings that run code
_ENV = (
    "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 "
    "GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0"
)
_OFF = (
    "-c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false "
    "-c core.attributesFile=/dev/null -c diff.external= -c core.pager=cat"
)
SAFE_GIT = f"env {_ENV} git {_OFF}"
DIFF_FLAGS = "--no-color --no-ext-diff --no-textconv"

# header lines `git apply` or `patch` take a file name from
_HEADER = re.compile(
    r"^(?:diff |--- |\+\+\+ |\*\*\* |Index: |rename (?:from|to) |copy (?:from|to) |Prereq: )(.*)$",
    re.M,
)
_GIT_NAMES = (".git", ".gitattributes", ".gitmodules")


def git_paths(patch: str) -> list[str]:
    """Header lines of `patch` that name a path under `.git`, or `.gitattributes` /
    `.gitmodules` (which change how the grader's git checks files out)."""
    found = []
    for m in _HEADER.finditer(patch):
        words = re.split(r"[\s\t]+", m.group(1).strip())
        for w in words:
            parts = PurePosixPath(w.strip('"')).parts
            if any(p in _GIT_NAMES or p.startswith(".git/") for p in parts):
                found.append(m.group(0)[:120])
                break
    return found


def patch_script(base: str, workdir: str, exclude: str = ".tsrl") -> str:
    """A bash script printing `git diff` of `workdir` against commit `base` (the grader's sha),
    untracked files included, with a git dir of its own (see the module doc)."""
    q = shlex.quote
    return f"""set -euo pipefail
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
unset GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_CONFIG_PARAMETERS
export {_ENV} HOME="$T" XDG_CONFIG_HOME="$T"
git init -q --bare --template= "$T/git"
export GIT_DIR="$T/git" GIT_WORK_TREE={q(workdir)}
cd {q(workdir)}
printf '%s\\n' {q(workdir + "/.git/objects")} > "$GIT_DIR/objects/info/alternates"
g() {{ git {_OFF} -c core.bare=false "$@"; }}
g read-tree {q(base)}
g add -A -- . ':(exclude){exclude}' >/dev/null
g diff --cached {DIFF_FLAGS} {q(base)} -- .
"""


# `bash -c APPLY apply TREE PATCH`: the tree's .git is moved out of the tree while the patch is
# applied, so no tool can write there; a patch that makes a new .git (through a link, a fuzzed
# header) is refused
APPLY = f"""set -u
cd "$1"
export GIT_CEILING_DIRECTORIES="$(dirname "$PWD")"  # .git is away: never a repository above
aside=$(mktemp -d)
mv .git "$aside/.git"
restore() {{ rm -rf .git; mv "$aside/.git" .git; rmdir "$aside"; }}
if {SAFE_GIT} apply --verbose "$2"; then r=APPLIED=git_apply
elif {SAFE_GIT} apply --verbose --reject "$2"; then r=APPLIED=git_apply_reject
elif patch --batch --fuzz=5 -p1 -i "$2"; then r=APPLIED=patch_fuzz
else restore; echo APPLY_FAILED; exit 1; fi
if [ -e .git ] || [ -L .git ]; then restore; echo "APPLY_FAILED: the patch wrote .git"; exit 1; fi
restore
echo "$r"
"""
