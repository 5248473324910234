"""The inputs of a launch, validated where they enter (`Job.checked`), and the shell words every emitter builds
its lines from: each value goes through `shlex.quote`, and a `$NAME` address is the only text left to the shell,
double-quoted so that its value is never split or run."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Sequence

from ..errors import SettingError
from ..frozen import frozen

__all__ = ["HERE", "LAUNCH_ENV", "MANIFEST", "Job", "shell_line"]

LAUNCH_ENV = "CUDALOAD_LAUNCH"
"""The variable every launched rank gets: the path of the manifest its plan must agree with."""
MANIFEST = "cudaload-launch.json"
HERE = '"$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"'
"""A shell expression for the folder of the running script, wherever the files were copied."""
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class Word(str):
    """A shell word that is already shell text (a quoted variable or expression we wrote), not a value."""


def shell_line(argv: Sequence[str]) -> str:
    """`argv` as one shell line: each value quoted with `shlex.quote`, a `Word` kept as the shell text it is."""
    return " ".join(a if isinstance(a, Word) else shlex.quote(a) for a in argv)


def _address(value: object) -> str:
    """Node 0's address: a host name (RFC 1123 labels), an IP address, or `$NAME` (read by the shell)."""
    if not isinstance(value, str) or not value:
        raise SettingError(
            f"main_address={value!r}: pass node 0's host name or IP address (e.g. 10.0.0.1), or '$MASTER_ADDR' to "
            "read it from the environment where the script runs."
        )
    if _VARIABLE.fullmatch(value):
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    labels = value.removesuffix(".").split(".")
    if len(value) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels):
        return value
    raise SettingError(
        f"main_address={value!r} is neither a host name nor an IP address nor a $VARIABLE: pass node 0's address "
        "(e.g. 10.0.0.1 or node0.cluster), or '$MASTER_ADDR' to read it from the environment where the script runs."
    )


def _port(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise SettingError(f"port={value!r}: pass the rendezvous port as a whole number from 1 to 65535 (e.g. 29500).")
    return value


def _script(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise SettingError(f"script={value!r}: pass the path of the training script the launch runs (e.g. train.py).")
    return value


def _script_args(value: object) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SettingError(
            f"script_args={value!r} ({type(value).__name__}): pass a list of strings, one per argument "
            f"(e.g. {shlex.split(value) if isinstance(value, str) else ['--lr', '1e-4']!r}); a string would be "
            "split into its letters."
        )
    bad = [a for a in value if not isinstance(a, str) or "\0" in a]
    if bad:
        raise SettingError(f"script_args holds {bad!r}: each argument is a string (no NUL character).")
    return tuple(value)


def _manifest_path(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise SettingError(f"manifest_path={value!r}: pass the path where the ranks read {MANIFEST}, or None.")
    return value


@frozen
class Job:
    """One launch: its layout and strategy, the rendezvous, the training command and where the manifest is."""

    nodes: int
    ranks: int
    strategy: str
    address: str
    port: int
    manifest: str | None
    script: str
    args: tuple[str, ...]
    gpus: bool

    @classmethod
    def checked(
        cls,
        *,
        nodes: int,
        ranks: int,
        strategy: str,
        address: object,
        port: object,
        manifest: object,
        script: object,
        args: object,
        gpus: bool,
    ) -> Job:
        """The job, each input checked (SettingError naming the input otherwise)."""
        return cls(
            nodes, ranks, strategy, _address(address), _port(port), _manifest_path(manifest), _script(script),
            _script_args(args), gpus,
        )  # fmt: skip

    @property
    def address_variable(self) -> str | None:
        """The variable the address is read from where the script runs ("MASTER_ADDR"), or None for a host."""
        found = _VARIABLE.fullmatch(self.address)
        return found.group(1) if found else None

    def address_word(self) -> str:
        """The address as a shell word: a variable double-quoted (expanded, never split or run), else quoted."""
        name = self.address_variable
        return Word(f'"${{{name}}}"') if name else self.address

    def manifest_word(self, folder: str) -> str:
        """The manifest's path as a shell word: the one given, or `MANIFEST` in `folder` (shell text)."""
        return self.manifest if self.manifest is not None else Word(f'{folder[:-1]}/{MANIFEST}"')

    def command_tail(self) -> list[str]:
        return [self.script, *self.args]
