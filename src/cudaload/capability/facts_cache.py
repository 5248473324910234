"""The cache of a local folder's `ModelFacts`: keyed by its config files, the Auto class, the installed
transformers and cudaload, so planning a model seen before reads JSON only (`facts_cache_file`,
`cached_facts`, `write_cached_facts`)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..facts.attention_backends import class_flags
from ..facts.model import ModelFacts
from .weights_header import weights_dtype

__all__ = ["FACTS_SCHEMA", "cached_facts", "facts_cache_file", "write_cached_facts"]

# The facts cache. A local folder's facts depend on its config.json (and generation_config.json), the
# Auto class, the installed
# transformers (its classes and their `_supports_*` flags) and this code; the key holds all four.
# Only the checkpoint dtype can change without config.json changing (new weights, no "dtype" in
# the config): it is then re-read from the safetensors header, which costs no import.
# 2: ModelFacts.quantization; 3: ModelFacts.generation; 4: ModelFacts.attention_sinks; 5: GenerationFacts.model_type;
# 6: linear_names without the output embeddings under any name; 7: ModelFacts.sub_model_sdpa; 8: ModelFacts.class_flags;
# 9: ModelFacts.no_split_modules
FACTS_SCHEMA = 9


def facts_cache_file(model: Any, auto_class: str | None) -> Path | None:
    """The cache file for a local folder's facts, or None (a Hub id, a config object, no config.json)."""
    if not isinstance(model, str) or not os.path.isdir(model):
        return None
    from .cache import read_regular_file

    # Only a regular file of at most 16 MiB is hashed: a FIFO would block, /dev/zero never end.
    config = read_regular_file(os.path.join(model, "config.json"))
    if config is None:
        return None  # no cache: the config is then read (and judged) as transformers reads it
    config_hash = hashlib.sha256(config).hexdigest()
    # The checkpoint's generation_config.json (its cache_implementation) is a fact too, and changes alone.
    generation_config = read_regular_file(os.path.join(model, "generation_config.json"))
    from ..installed import installed_versions
    from ..version import __version__
    from .cache import cache_dir, cache_key

    transformers_version = installed_versions().get("transformers")
    if transformers_version is None:
        return None
    key = cache_key(
        {
            "schema": FACTS_SCHEMA,
            "config": config_hash,
            "generation_config": hashlib.sha256(generation_config).hexdigest() if generation_config else None,
            "auto_class": auto_class,
            # the class flags read depend on the attention backends registered (a backend added later reads its own)
            "class_flags": class_flags(),
            "transformers": transformers_version,
            "cudaload": __version__,
        }
    )
    return cache_dir() / "model-facts" / f"{key}.json"


def cached_facts(path: Path, source: str) -> ModelFacts | None:
    """The cached facts, or None when the file is missing, from another schema, or any field has a
    wrong type or a negative or non-finite number (then the facts are read again and rewritten)."""
    from dataclasses import replace

    from .cache import decode, read_json

    data = read_json(path, {"schema": int, "dtype_from_weights": bool, "facts": ModelFacts})
    if data is None or data["schema"] != FACTS_SCHEMA:
        return None
    try:
        facts: ModelFacts = replace(decode(data["facts"], ModelFacts), source=source)
    except (TypeError, ValueError):  # a value the dataclass itself refuses
        return None
    if data["dtype_from_weights"]:
        facts = replace(facts, checkpoint_dtype=weights_dtype(source, None))
    return facts


def write_cached_facts(path: Path, facts: ModelFacts, dtype_from_weights: bool) -> None:
    """Record `facts` at `path` (`dtype_from_weights`: the checkpoint dtype is re-read from the weights)."""
    from .cache import write_json

    write_json(path, {"schema": FACTS_SCHEMA, "dtype_from_weights": dtype_from_weights, "facts": asdict(facts)})
