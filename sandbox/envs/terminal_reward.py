"""How a terminal verifier is run and what of its output is trusted (`terminal_verify` uses it).

- The verifier script (run-tests.sh / test.sh) runs from memory: `bash -c 'eval "$(cat F)"' F`
  reads the whole file before its first line runs, so code under test that appends to or rewrites
  the script (bash reads a script file as it executes it) changes nothing that runs.
- Every process the verifier leaves behind voids its result: the runner notes the pids alive
  before the script, and after it lists every live process that is neither one of those nor an
  ancestor of the runner (a daemon started by agent code the tests import, still rewriting the
  reward file). Such a verdict is 0 naming the processes; the session's cleanup then kills
  them (docker: every pid but the keep-alive; local: the exec's pid namespace ends), and only
  then are the reward files read. The runner ends with a line carrying a random nonce; a run
  whose line is missing (the runner was killed) is also 0.
- Harbor's reward files are read in Harbor's order: /logs/verifier/reward.txt (one number), then
  reward.json ({name: number}). Every numeric key of reward.json is kept as a named score
  (`Verdict.scores`); the training reward is the key chosen by the recipe (env extras
  `reward_key`), else by the task (task.toml `[verifier] reward_key`, a ThunderSync field Harbor
  ignores), else "reward", else the only key, else the mean of the keys (the reason says so). A
  reward.json without the chosen key earns 0 (its scores still kept), the reason naming the key.
"""

from __future__ import annotations

import json
import math
import secrets
import shlex
from typing import Any

from thundersync.sandbox.envs.junit import ReportError
from thundersync.sandbox.executor import ExecResult

REWARD_TXT, REWARD_JSON = "/logs/verifier/reward.txt", "/logs/verifier/reward.json"
# output of apt / pip / curl without a network: the verdict then names the task's network setting
_NO_NET = (
    "Temporary failure resolving",
    "Could not resolve",
    "Failed to establish a new connection",
    "Network is unreachable",
    "Method http has died",
)

# pids alive now (the runner's ancestors, the keep-alive): never leftovers
_BEFORE = 'tsrl_before=" $(cd /proc && echo [0-9]*) "; '
# after the script: every other live, non-zombie process is a leftover; printed with the nonce
_SCAN = (
    'tsrl_anc=" "; p=$$; while [ -n "$p" ] && [ "$p" != 0 ]; do tsrl_anc="$tsrl_anc$p "; '
    "p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null); done; "
    'tsrl_left=""; for d in /proc/[0-9]*; do p=${d#/proc/}; '
    'case "$tsrl_before$tsrl_anc" in *" $p "*) continue;; esac; '
    'st=$(cat "$d/status" 2>/dev/null) || continue; case "$st" in *"(zombie)"*) continue;; esac; '
    'c=$(tr "\\0" " " < "$d/cmdline" 2>/dev/null | cut -c1-80); tsrl_left="$tsrl_left [$p: $c]"; '
    "done; "
)


def runner(script: str, nonce: str) -> str:
    """The command that runs `script` from memory, then reports leftovers after `nonce`."""
    q = shlex.quote(script)
    return (
        f'{_BEFORE}bash -c \'eval "$(cat -- "$0")"\' {q} 2>&1; tsrl_rc=$?; {_SCAN}'
        f'printf "\\n{nonce}:%s:%s\\n" "$tsrl_rc" "$tsrl_left"; exit $tsrl_rc'
    )


def new_nonce() -> str:
    return "tsrl-verifier-" + secrets.token_hex(12)


def leftovers(r: ExecResult, nonce: str) -> tuple[ExecResult, str | None]:
    """(the result without the runner's line, None when the verifier left nothing running, else
    why its result is void)."""
    text = r.stdout
    at = text.rfind(f"\n{nonce}:")
    if at < 0:
        return r, (
            f"the verifier's runner did not finish (exit {r.exit_code}; killed by code under "
            "test?): its result is not trusted"
        )
    line = text[at + 1 :].split("\n", 1)[0]
    left = line.split(":", 2)[2].strip() if line.count(":") >= 2 else ""
    clean = ExecResult(**{**r.__dict__, "stdout": text[:at] + text[at + 1 + len(line) + 1 :]})
    if left:
        return clean, (
            f"processes outlived the verifier ({left[:300]}): a process started during "
            "verification could have written the reward; the result is not trusted"
        )
    return clean, None


def network_hint(text: str, network: bool) -> str:
    """A note for a failing verifier's reason when its output looks like a missing network."""
    if network or not any(m in text for m in _NO_NET):
        return ""
    return (
        " (the verifier ran without network: the project's default; Harbor's is on. Give "
        'task.toml [verifier] network_mode = "public" if the task needs it)'
    )


def checked(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReportError(f"verifier error: {where} holds {value!r}, not a number")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ReportError(
            f"verifier error: {where} holds {value!r}; a reward must be a finite number in [0, 1]"
        )
    return float(value)


def parse_reward_txt(raw: bytes) -> float:
    text = raw.decode("utf-8", "replace").strip()
    try:
        number = float(text)
    except ValueError:
        raise ReportError(f"verifier error: {REWARD_TXT} is not a float: {text[:50]!r}") from None
    return checked(number, REWARD_TXT)


def parse_reward_json(raw: bytes, key: str | None) -> tuple[float, dict[str, float], str]:
    """(training reward, named scores, how it was chosen) of a reward.json."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise ReportError(f"verifier error: {REWARD_JSON} is not valid JSON") from None
    if not isinstance(data, dict) or not data:
        raise ReportError(f"verifier error: {REWARD_JSON} must be a non-empty JSON object")
    scores = {
        str(k): float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    if key is not None:
        if key not in data:  # 0, never another score; the named scores are still reported
            how = (
                f"no key {key!r}, the reward_key chosen (env.reward_key, else task.toml "
                f"[verifier] reward_key); it has {sorted(data)}"
            )
            return 0.0, scores, how
        return checked(data[key], f"{REWARD_JSON} key {key!r}"), scores, key
    if "reward" in data:
        return checked(data["reward"], f"{REWARD_JSON} key 'reward'"), scores, "reward"
    nums = [checked(v, f"{REWARD_JSON} key {k!r}") for k, v in data.items()]
    if len(nums) == 1:
        return nums[0], scores, next(iter(data))
    how = f"mean of {len(nums)} named scores (choose one with reward_key)"
    return sum(nums) / len(nums), scores, how
