"""Reads a model's config as transformers does, and turns each way that can fail into an error that
says what the folder really holds and what to do (`load_config`, `check_sizes`)."""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any

from ..errors import MissingPackageError, ModelConfigError, RemoteCodeError, describe_error
from .hub_access import download_command
from .per_layer import layer_values

__all__ = ["check_sizes", "load_config", "text_config"]


def load_config(
    model: Any, trust_remote_code: bool, revision: str | None, config_kwargs: Mapping[str, Any] | None = None
) -> Any:
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return model
    name = str(model)
    extra = dict(config_kwargs or {})
    _check_local_path(name, extra)
    _check_config_file(name)
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, revision=revision, **extra)
    except ImportError as exc:
        if "gguf_file" in extra:  # transformers reads a GGUF file's metadata with the `gguf` package
            raise MissingPackageError(
                f"gguf_file={extra['gguf_file']!r}: transformers reads a GGUF file with the gguf package, which is "
                f"not installed here ({describe_error(exc)}). Install it (pip install gguf), or load a "
                "safetensors checkpoint."
            ) from exc
        raise
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise RemoteCodeError(
                f"{name!r} needs custom code from its repository to build its config, and "
                "trust_remote_code was not passed. cudaload never enables remote code for you: read the "
                "repository's code, then pass trust_remote_code=True yourself if you trust it."
            ) from exc
        raise ModelConfigError(
            f"Could not read the config of {name!r}: {str(exc).rstrip('.')}. {_what_the_folder_holds(name, extra)}"
        ) from exc
    except struct.error as exc:  # gguf's reader unpacks past the end of a truncated or foreign .gguf file
        raise ModelConfigError(
            f"gguf_file={extra.get('gguf_file')!r} in {name!r} could not be read as GGUF ({describe_error(exc)}): "
            "check that it is a complete GGUF file (a download may have stopped early)."
        ) from exc
    except _config_validation_errors() as exc:
        # transformers 5 configs are strict dataclasses: huggingface_hub names the field and the value.
        raise ModelConfigError(f"{name!r}: config.json has a value its config class refuses: {exc}") from exc
    except ArithmeticError as exc:  # a config class's validate_architecture divides by a size (hidden % heads)
        raise ModelConfigError(
            f"transformers could not build the config of {name!r} from its config.json: {type(exc).__name__}: "
            f"{exc}{_non_positive_sizes(name)}. Fix that value in config.json (save_pretrained() writes a valid one)."
        ) from exc
    except RuntimeError as exc:
        if type(exc).__name__ != "AmbiguousGlobalPerLayerAttributeError":
            raise
        # transformers 5.25 integrations/heterogeneity/configuration_utils.py: AmbiguousGlobalPerLayerAttributeError
        # (5.22 too), raised when a per-layer attribute that differs between layers is read globally, as this
        # config class's own validation reads it.
        raise ModelConfigError(
            f"transformers cannot build the config of {name!r}: its per_layer_config gives layers different values "
            f"of an attribute its config class reads for the whole model ({str(exc).splitlines()[0].rstrip('.')}), "
            "so transformers itself cannot load this checkpoint. Give every layer the same value of that attribute "
            "(or remove it from per_layer_config), or use the model type that supports it per layer."
        ) from exc
    except (AttributeError, TypeError, KeyError) as exc:
        # transformers fails inside the config class on values it cannot take (e.g. "dtype": "auto"
        # in config.json makes 5.22 look up torch.auto): the file is the problem, not the network.
        raise ModelConfigError(
            f"transformers could not build the config of {name!r} from its config.json: "
            f'{type(exc).__name__}: {exc}. Fix that value in config.json (a "dtype" key can be removed: '
            "the weights' dtype is then used)."
        ) from exc
    except OSError as exc:
        if os.path.isdir(name):
            folder = os.path.join(name, str(extra.get("subfolder") or ""))
            if os.path.isfile(os.path.join(folder, "config.json")) and not extra.get("gguf_file"):
                raise ModelConfigError(
                    f"{name!r} is a local folder, but its config.json is missing or unreadable: "
                    f"{str(exc).rstrip('.')}. Save the model there with save_pretrained(), or pass the folder that "
                    "holds config.json."
                ) from exc
            raise ModelConfigError(
                f"{name!r} is a local folder, but transformers could not read its config: {str(exc).rstrip('.')}. "
                f"{_what_the_folder_holds(name, extra)}"
            ) from exc
        raise ModelConfigError(
            f"Could not read the config of {name!r}: it is not a local folder with a config.json and "
            "could not be fetched from the Hub (offline, not cached, or a wrong id). Pass a local path, "
            f"or download it first where there is a network: {download_command(name)}. Cause: {exc}"
        ) from exc


def _what_the_folder_holds(name: str, config_kwargs: Mapping[str, Any]) -> str:
    """What to do, from what a local folder really holds: a PEFT adapter, GGUF files, models in subfolders,
    a config.json that is there but not valid, or no config.json at all (never "check config.json is valid
    JSON" when there is none)."""
    folder = os.path.join(name, str(config_kwargs.get("subfolder") or ""))
    if not os.path.isdir(folder):
        return "Check the path (and subfolder=), or the Hub id."
    entries = sorted(os.listdir(folder))
    config = os.path.join(folder, "config.json")
    if os.path.isfile(os.path.join(folder, "adapter_config.json")) and not os.path.isfile(config):
        base = _adapter_base(os.path.join(folder, "adapter_config.json"))
        return (
            f"It is a PEFT adapter (adapter_config.json{f', base model {base!r}' if base else ''}), not a model: "
            "cudaload plans and loads the base model. Load the base with cudaload.load(base) (or "
            "load_for_finetune(base) to train on), then attach the adapter: "
            f"peft.PeftModel.from_pretrained(model, {folder!r})."
        )
    if config_kwargs.get("gguf_file"):
        return (
            f"transformers read the config from gguf_file={config_kwargs['gguf_file']!r}'s metadata: check that it "
            "is a complete GGUF file of a model type transformers converts, and that it is in this folder."
        )
    gguf = [e for e in entries if e.endswith(".gguf")]
    if gguf:
        return f"It holds GGUF file(s) {gguf[:3]}: pass gguf_file={gguf[0]!r} to read one."
    inner = [e for e in entries if os.path.isfile(os.path.join(folder, e, "config.json"))]
    if inner and not os.path.isfile(config):
        return f"It has no config.json, but {inner[:3]} do: pass subfolder={inner[0]!r} to read that model."
    if os.path.isfile(config):
        return "Check that its config.json is valid JSON with a model_type, as save_pretrained() writes it."
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "") if entries else "nothing"
    return (
        f"It has no config.json (it holds {shown}). Save the model there with save_pretrained(), or pass the "
        "folder that holds config.json."
    )


def _adapter_base(path: str) -> str | None:
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            base = json.load(handle).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) else None


def _looks_like_a_path(name: str) -> bool:
    """A name no Hub id can be ("org/name" at most): absolute, relative with ./ or ../, from ~, with two
    slashes or more, or ending with one."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or name.endswith(("/", os.sep))


def _check_local_path(name: str, extra: Mapping[str, Any]) -> None:
    """A model given as a path must be a folder: a GGUF file names its folder and `gguf_file=` (transformers
    reads it as JSON and says "is not a valid JSON file"); a folder that is not there says so (transformers
    takes it for a Hub id and says "Repo id must use alphanumeric chars")."""
    if os.path.isfile(name):
        folder, file = os.path.split(os.path.abspath(name))
        if name.endswith(".gguf") and not extra.get("gguf_file"):
            raise ModelConfigError(
                f"{name!r} is a GGUF file, not a model folder: pass its folder and the file's name, "
                f"{folder!r} with gguf_file={file!r} (transformers converts it with the gguf package)."
            )
        raise ModelConfigError(
            f"{name!r} is a file, not a model folder: pass the folder that holds config.json and the weights "
            "(as save_pretrained() writes it), or a Hub id such as 'Qwen/Qwen3-0.6B'."
        )
    _check_path_length(name)
    if not os.path.exists(os.path.expanduser(name)) and _looks_like_a_path(name):
        parent = os.path.dirname(os.path.abspath(os.path.expanduser(name).rstrip("/"))) or "/"
        where = (
            f"{parent!r} exists but holds no {os.path.basename(name.rstrip('/'))!r}"
            if os.path.isdir(parent)
            else (f"nor does {parent!r}")
        )
        raise ModelConfigError(
            f"{name!r}: no such folder ({where}). Check the path; a Hub id is 'org/name' (e.g. 'Qwen/Qwen3-0.6B')."
        )


def _check_path_length(name: str) -> None:
    """A path the file system cannot take (ENAMETOOLONG: over PATH_MAX, or a name over 255 bytes) is said as
    such, not as a folder that is not there (os.path.exists is False for it)."""
    import errno

    try:
        os.stat(os.path.expanduser(name))
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return
        longest = max(name.split(os.sep), key=len)
        shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"
        raise ModelConfigError(
            f"{shown!r} ({len(name)} characters, its longest name {len(longest)}) is longer than this file system "
            f"takes ({exc.strerror}): no folder can have that path. Check how the path was built, or move (or "
            "symlink) the model to a shorter one."
        ) from None
    except ValueError:  # a NUL byte: transformers' own error says the id is invalid
        return


def _check_config_file(name: str) -> None:
    """A local folder's config.json must be a regular file of sane size before transformers opens
    it: a FIFO would block the read forever and a symlink to /dev/zero would fill memory."""
    import stat

    from .cache import MAX_READ_BYTES

    path = os.path.join(name, "config.json")
    if not os.path.isdir(name) or not os.path.lexists(path):
        return  # a Hub id, or a folder without one: transformers' own error says so
    try:
        info = os.stat(path)  # stat opens nothing, so a FIFO does not block it
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_READ_BYTES:
        kind = "is not a regular file" if not stat.S_ISREG(info.st_mode) else f"is {info.st_size:,} bytes"
        raise ModelConfigError(
            f"{path} {kind}: cudaload reads only a regular config.json of at most {MAX_READ_BYTES >> 20} MiB "
            "(a FIFO or a device would hang or fill memory). Save the model with save_pretrained()."
        )


def _non_positive_sizes(name: str) -> str:
    """ " (config.json has num_attention_heads=0)": the sizes at or below 0 in a local folder's config.json, read
    raw (the config class failed before cudaload could check its sizes); "" when none or not a local folder."""
    import json

    from .cache import read_regular_file

    raw = read_regular_file(os.path.join(name, "config.json"))
    try:
        data = json.loads(raw.decode("utf-8")) if raw is not None else {}
    except ValueError:
        return ""
    parts = [data, *(v for v in data.values() if isinstance(v, dict))] if isinstance(data, dict) else []
    bad = [
        f"{field}={value!r}"
        for part in parts
        for field, value in part.items()
        if field in _SIZE_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0
    ]
    return f" (config.json has {', '.join(bad)}; each must be a whole number of at least 1)" if bad else ""


def _config_validation_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's strict-dataclass validation errors (transformers 5 configs), when it has them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: configs are not validated there
        return ()
    return (StrictDataclassError,)


# Config sizes the meta model is built from: each an int > 0 (a bool is not one). Bounds far above
# any real model (layers and heads: 65,536; widths and vocabularies: 2**26) keep a typo such as
# 10**12 from building a model for minutes or exhausting memory.
_SIZE_FIELDS = {
    "num_hidden_layers": 1 << 16,
    "n_layer": 1 << 16,
    "num_attention_heads": 1 << 16,
    "n_head": 1 << 16,
    "num_key_value_heads": 1 << 16,
    "num_local_experts": 1 << 16,
    "num_experts": 1 << 16,
    "hidden_size": 1 << 26,
    "n_embd": 1 << 26,
    "intermediate_size": 1 << 26,
    "moe_intermediate_size": 1 << 26,
    "head_dim": 1 << 26,
    "vocab_size": 1 << 26,
    "max_position_embeddings": 1 << 26,
    "n_positions": 1 << 26,
}


# A value that means "no limit" to transformers: XLNet's relative attention has no position table, and
# XLNetConfig.max_position_embeddings is -1 for every XLNet (transformers 5.25 configuration_xlnet.py).
_NO_LIMIT = {"max_position_embeddings": -1}


def text_config(config: Any) -> Any:
    """The config's text config (transformers' `get_text_config()`); the decoder's where several qualify
    (musicgen's text_encoder and decoder: `get_text_config()` raises "Multiple valid text configs", transformers
    5.22 and 5.25 configuration_utils.py `PretrainedConfig.get_text_config`), else the config itself."""
    if not hasattr(config, "get_text_config"):
        return config
    for decoder in (False, True):
        try:
            return config.get_text_config(decoder=decoder)
        except ValueError:
            continue
    return config


def check_sizes(config: Any, name: str) -> None:
    """Raise ModelConfigError naming the first config size that is not a positive int in bounds."""
    configs = [config]
    text = text_config(config)
    if text is not config:
        configs.append(text)
    for part in configs:
        for field, bound in _SIZE_FIELDS.items():
            # Per layer where the config is per layer (a heterogeneous config's per_layer_config, gemma3n's
            # list of intermediate sizes): each layer's value must be one.
            for value in layer_values(part, field):
                if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
                    if value == _NO_LIMIT.get(field):
                        continue
                    where = "" if part is config else f" (in {type(part).__name__})"
                    raise ModelConfigError(
                        f"{name!r}: config.json has {field}={value!r}{where}; it must be a whole number from 1 to "
                        f"{bound:,}. Fix that value in config.json (save_pretrained() writes a valid one)."
                    )
        _check_rope_factor(part, name)
        _check_key_value_heads(part, name)


def _check_key_value_heads(config: Any, name: str) -> None:
    """More key/value heads than query heads: transformers' `repeat_kv` gives each query head
    num_attention_heads // num_key_value_heads (0) copies, so the model builds and fails its first forward."""
    try:
        heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    except Exception:  # a heterogeneous config: per-layer values are read by check_sizes above
        return
    if isinstance(heads, int) and isinstance(kv, int) and not isinstance(kv, bool) and 0 < heads < kv:
        raise ModelConfigError(
            f"{name!r}: config.json has num_key_value_heads={kv} but num_attention_heads={heads}: a key/value head "
            "is shared by one or more query heads, never the other way round, so the model would fail its first "
            f"forward. Fix config.json: num_key_value_heads at most {heads} (and dividing it)."
        )


def _rope_settings(config: Any) -> list[dict[str, Any]]:
    """The RoPE settings of a config: `rope_parameters` (transformers 5; one per layer type where it is nested)
    and a legacy `rope_scaling` dict. A config that cannot say (a per-layer config) gives none."""
    found: list[dict[str, Any]] = []
    for attribute in ("rope_parameters", "rope_scaling"):
        try:
            value = getattr(config, attribute, None)
        except Exception:  # a per-layer config raises its own error on a global read
            continue
        if not isinstance(value, Mapping):
            continue
        nested = [v for v in value.values() if isinstance(v, Mapping)]
        found.extend(dict(v) for v in nested) if nested else found.append(dict(value))
    return found


def _check_rope_factor(config: Any, name: str) -> None:
    """A RoPE scaling factor must be a finite number above 0. transformers 5.25 (modeling_rope_utils.py:
    RotaryEmbeddingConfigMixin._validate_linear_rope_parameters) only logs "must be a float or int >= 1",
    then a string fails deep in the rotary embedding ("unsupported operand type(s) for /=") and a negative
    factor builds a model whose positions run backwards."""
    import math

    for settings in _rope_settings(config):
        factor = settings.get("factor")
        if factor is None:
            continue
        number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
        if not number or not math.isfinite(factor) or factor <= 0:
            rope_type = settings.get("rope_type", settings.get("type", "default"))
            raise ModelConfigError(
                f"{name!r}: config.json has a RoPE scaling factor={factor!r} (rope_type {rope_type!r}); it must be a "
                "number (not a string) above 0, and transformers expects one >= 1 (e.g. 4.0 to stretch the context "
                "fourfold). Fix rope_parameters (or rope_scaling) in config.json, or remove the scaling."
            )
