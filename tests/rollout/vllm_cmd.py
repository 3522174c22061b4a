"""Reading a vLLM command line in tests."""


def flag(cmd: list[str], name: str) -> str:
    """The value after `name` in `cmd` (asserting the flag is there)."""
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]
