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
observation (the turn counts, the episode goes on). All file tools go through the sandbox
session, so they see exactly what `bash` sees.
"""

from __future__ import annotations

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


def run_tool(session: Session, call: ToolCall, timeout: float, max_chars: int = 8000) -> str:
    """Execute a non-submit tool call; every failure comes back as observation text."""
    if call.tool is Tool.BASH:
        if not call.body.strip():
            raise ToolCallError("bash needs a command on the lines after `bash`")
        r = session.exec(call.body, timeout=timeout)
        return f"{r.combined(max_chars)}\n[exit code {r.exit_code}]"
    if call.tool is Tool.VIEW:
        parts = call.body.split()
        if not parts:
            raise ToolCallError("view needs a PATH")
        data = session.get_file(parts[0])
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
        try:
            session.put_file(args["path"], args["content"].encode())
        except SandboxError as e:  # e.g. a path the agent's user may not write
            return f"error: {e}"
        return f"wrote {args['path']} ({len(args['content'])} chars)"
    raise ToolCallError(f"{call.tool} is not executable here")
