"""The agent's tool-call format and the tools every ThunderSync environment offers.

An action is the raw model text; the env looks for the FIRST block

    <tool>NAME
    BODY</tool>

(NAME on the first line after `<tool>`; BODY is everything up to `</tool>`):

- `bash`        BODY is a shell command, run in the task directory; the observation is the
                (capped) stdout + stderr and the exit code.
- `view`        BODY is `PATH` or `PATH START END` (1-based, inclusive lines); numbered lines.
- `str_replace` BODY is JSON `{"path": ..., "old": ..., "new": ...}`; `old` must occur exactly once.
- `create`      BODY is JSON `{"path": ..., "content": ...}`; writes (overwrites) the file.
- `submit`      no body: the episode ends and the verifier computes the reward.

Text without a `<tool>` block, an unknown tool name or a malformed body gets an error
observation (the turn counts, the episode goes on); so does an argument no tool can take (a NUL
byte, text that is not UTF-8 such as a lone surrogate, a command over 100 KiB or a path over 4096
bytes): whatever the policy emits, `run_tool` answers with text, never an exception. All file
tools go through the sandbox session, so they see exactly what `bash` sees.
"""

from __future__ import annotations

import errno
import json
import re
from dataclasses import dataclass
from enum import StrEnum

from thundersync.sandbox.executor import SandboxError, Session


class Tool(StrEnum):
    BASH = "bash"
    VIEW = "view"
    STR_REPLACE = "str_replace"
    CREATE = "create"
    SUBMIT = "submit"


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    body: str


class ToolCallError(ValueError):
    pass


_BLOCK = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)

TOOL_HELP = """Use exactly one tool per reply, written as
<tool>bash
COMMAND</tool>                                  run a shell command in the task directory
<tool>view
PATH [START END]</tool>                         show a file with line numbers
<tool>str_replace
{"path": "...", "old": "...", "new": "..."}</tool>   replace a unique snippet in a file
<tool>create
{"path": "...", "content": "..."}</tool>        write a file
<tool>submit</tool>                             finish; your work is then verified"""


def parse_action(text: str) -> ToolCall:
    m = _BLOCK.search(text)
    if not m:
        raise ToolCallError(
            "no tool call found: write <tool>NAME\\nBODY</tool> (see the tool list)"
        )
    inner = m.group(1)
    name, _, body = inner.lstrip("\n").partition("\n")
    name = name.strip()
    try:
        tool = Tool(name)
    except ValueError:
        raise ToolCallError(
            f"unknown tool {name!r}; available: {', '.join(t.value for t in Tool)}"
        ) from None
    return ToolCall(tool, body)


def _json_body(call: ToolCall, keys: tuple[str, ...]) -> dict[str, str]:
    try:
        data = json.loads(call.body)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"{call.tool} expects a JSON object with {list(keys)}: {e}") from None
    if not isinstance(data, dict) or any(not isinstance(data.get(k), str) for k in keys):
        raise ToolCallError(f"{call.tool} expects a JSON object with string fields {list(keys)}")
    return data


MAX_COMMAND = 100 << 10  # bytes: the kernel takes at most 128 KiB per argument (MAX_ARG_STRLEN)
MAX_PATH = 4096  # bytes: PATH_MAX
MAX_CONTENT = 64 << 20  # bytes written by one create / str_replace


def _arg(what: str, text: str, limit: int, nul_ok: bool = False) -> str:
    """`text` if a tool can take it as `what`, else ToolCallError saying why."""
    if not nul_ok and "\0" in text:
        raise ToolCallError(f"{what} holds a NUL byte, which no command line or path can carry")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ToolCallError(
            f"{what} is not valid UTF-8 text ({e.reason} at position {e.start})"
        ) from None
    if size > limit:
        raise ToolCallError(f"{what} is {size} bytes; at most {limit} are accepted")
    return text


def run_tool(session: Session, call: ToolCall, timeout: float, max_chars: int = 8000) -> str:
    """Execute a non-submit tool call; every failure comes back as observation text (an
    argument no tool can take raises ToolCallError, which the env turns into one too)."""
    try:
        return _run_tool(session, call, timeout, max_chars)
    except ToolCallError:
        raise
    except ValueError as e:  # what slipped past `_arg`: still the call's fault
        raise ToolCallError(f"{call.tool} could not take its arguments: {e}") from None
    except OSError as e:
        if e.errno != errno.E2BIG:
            raise  # the sandbox's own failure (e.g. the engine went away), not the call's
        raise ToolCallError(f"{call.tool} could not take its arguments: {e}") from None


def _run_tool(session: Session, call: ToolCall, timeout: float, max_chars: int) -> str:
    if call.tool is Tool.BASH:
        if not call.body.strip():
            raise ToolCallError("bash needs a command on the lines after `bash`")
        r = session.exec(_arg("the bash command", call.body, MAX_COMMAND), timeout=timeout)
        return f"{r.combined(max_chars)}\n[exit code {r.exit_code}]"
    if call.tool is Tool.VIEW:
        parts = call.body.split()
        if not parts:
            raise ToolCallError("view needs a PATH")
        data = session.get_file(_arg("the view path", parts[0], MAX_PATH))
        if data is None:
            return f"error: {parts[0]} does not exist, is not a readable regular file or is over 256 MiB"
        lines = data.decode("utf-8", "replace").splitlines()
        start, end = 1, len(lines)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            start, end = max(1, int(parts[1])), min(len(lines), int(parts[2]))
        text = "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(start, end + 1))
        return text[:max_chars]
    if call.tool is Tool.STR_REPLACE:
        args = _json_body(call, ("path", "old", "new"))
        _arg("the str_replace path", args["path"], MAX_PATH)
        _arg("`new`", args["new"], MAX_CONTENT, nul_ok=True)
        data = session.get_file(args["path"])
        if data is None:
            return f"error: {args['path']} does not exist"
        text = data.decode("utf-8", "replace")
        n = text.count(args["old"]) if args["old"] else 0
        if n != 1:
            return f"error: `old` occurs {n} times in {args['path']}; it must occur exactly once"
        try:
            session.put_file(args["path"], text.replace(args["old"], args["new"]).encode())
        except SandboxError as e:  # e.g. a path the agent's user may not write
            return f"error: {e}"
        return f"edited {args['path']}"
    if call.tool is Tool.CREATE:
        args = _json_body(call, ("path", "content"))
        _arg("the create path", args["path"], MAX_PATH)
        _arg("the content", args["content"], MAX_CONTENT, nul_ok=True)
        try:
            session.put_file(args["path"], args["content"].encode())
        except SandboxError as e:  # e.g. a path the agent's user may not write
            return f"error: {e}"
        return f"wrote {args['path']} ({len(args['content'])} chars)"
    raise ToolCallError(f"{call.tool} is not executable here")
