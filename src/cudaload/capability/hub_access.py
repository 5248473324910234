"""Whether a Hub model id can be read now, asked once and fast, before transformers is imported: a config in
the local cache, the Hub reachable, or neither (then the `hf download` command to run where there is a network).

Without a network, huggingface_hub retries each request for tens of seconds (31 s measured on 2026-12-06 for one
`plan`) and ends with "download it first" and no command; one TCP connection with a short timeout answers the
same question in at most `timeout` seconds. `HF_HUB_OFFLINE` semantics: offline, nothing is asked.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
from urllib.parse import urlsplit

__all__ = ["check_hub_reachable", "download_command", "hub_reachable", "in_local_cache", "looks_like_a_path"]

_DEFAULT_ENDPOINT = "https://huggingface.co"


def looks_like_a_path(model: str) -> bool:
    """`/x`, `./x`, `../x`, `~/x`, `a/b/c` or an existing folder: a path, never a Hub id (a Hub id is `owner/name`,
    one slash)."""
    local = model.startswith(("/", "./", "../", "~", ".\\")) or model in (".", "..") or model.count("/") > 1
    return local or os.path.exists(model)


def in_local_cache(model: str) -> bool:
    """Whether the Hub cache holds `model`'s config.json (what a plan reads), without any request."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # an id huggingface_hub refuses (e.g. three slashes): not cached
        return False
    return isinstance(found, str)


def hub_reachable(timeout: float = 3.0) -> tuple[bool, str]:
    """One TCP connection to the Hub endpoint (HF_ENDPOINT, else huggingface.co), name lookup included, bounded
    by `timeout` (a lookup without network can block longer than any socket timeout: it runs in a thread)."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    answer: list[tuple[bool, str]] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            answer.append((True, f"{host}:{port} answered"))
        except OSError as exc:
            answer.append((False, f"{host}:{port} did not answer ({type(exc).__name__}: {exc})"))

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else (False, f"{host}:{port} did not answer within {timeout:g} s")


def download_command(model: str) -> str:
    """The command that puts `model` in the local Hub cache, to run where there is a network."""
    return f"hf download {shlex.quote(model)}"


def check_hub_reachable(
    repo: str, *, offline: bool, timeout: float = 5.0, endpoint: str | None = None
) -> tuple[bool, str]:
    """Can `repo` (a Hub kernel repository) be fetched right now? One metadata request, bounded
    by `timeout`. Only `cudaload doctor --check-hub` calls this: detection itself never touches
    the network."""
    if offline:
        return False, "HF_HUB_OFFLINE is set: nothing is fetched"
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint).repo_info(repo, repo_type="kernel", timeout=timeout)
    except Exception as exc:  # any failure means "cannot fetch now"; say which
        lines = str(exc).strip().splitlines()
        return False, f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return True, f"reachable (revision {str(getattr(info, 'sha', '') or '')[:12] or 'unknown'})"
