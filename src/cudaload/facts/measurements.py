"""Measurements of a machine as frozen data: the CPU dtype probe (`DtypeProbe`) and bench records (`TuningRecord`)."""

from __future__ import annotations

from dataclasses import replace

from ..frozen import frozen

__all__ = ["DtypeProbe", "ProbeRound", "TunedVariant", "TuningRecord"]


@frozen
class ProbeRound:
    """One interleaved round of a `DtypeProbe`: every dtype timed once, back to back."""

    prefill_s: tuple[tuple[str, float], ...]
    decode_s: tuple[tuple[str, float], ...]
    cast_s: tuple[tuple[str, str, float], ...] = ()


@frozen
class DtypeProbe:
    """`F.linear` timed on this machine's CPU per dtype: a prefill-shaped GEMM, a decode-shaped GEMV,
    and the cast of a weight between dtypes (what loading a checkpoint in another dtype pays).

    Seconds are medians over interleaved repetitions. The shape bucket (in_features x out_features)
    comes from the model's hidden and intermediate sizes, rounded coarsely: the answer belongs to the
    machine, so a new model of a similar size reuses it. `plan()` measures one on a CPU-only machine
    (cached per machine) and keeps it as `Machine.dtype_probe`; pass one to `Machine.simulated()` to
    plan for another CPU's numbers.

    Attributes:
        in_features: Input width of the timed weight (the shape bucket).
        out_features: Output width of the timed weight.
        prefill_tokens: Rows of the prefill GEMM (tokens in one forward).
        prefill_s: (dtype, seconds) pairs for one [prefill_tokens x in] @ [in x out].
        decode_s: (dtype, seconds) pairs for one [1 x in] @ [in x out], weights not in cache, plus
            that weight's share of a decoder layer's attention of one token over a cache of a
            few hundred tokens (attention in bf16 can be several times slower than in fp32).
        cast_s: (from dtype, to dtype, seconds) to cast one [out x in] weight.
        threads: torch CPU threads the measurement ran with.
        measured_at: ISO date of the measurement.
        fingerprint: (key, value) pairs of `Machine.fingerprint()` when measured: if any differs
            now, the measurement is stale.
        cost_s: Seconds this process spent probing (0 when read from the cache).
        from_cache: True when read from the cache rather than measured now.
        rounds: Each measured round's own timings (empty: only the medians are known, e.g. a
            probe built by hand). The policy compares dtypes round by round, so it can tell a
            real difference from timing noise and call a tie a tie.
        confidence: How far the numbers can be trusted: "quiet" (nothing else competed for the
            cores while measuring), "busy" (others did, but the rounds and a quick re-run agree:
            used, kept for a short while), "disturbed" (they did not: not used, the plan keeps the
            checkpoint's dtype and says so).
        conditions: What the probe saw while measuring, in words (time its threads waited for a
            core, steal, load average, a re-run's verdict).

    Examples:
        >>> import cudaload
        >>> probe = cudaload.DtypeProbe(
        ...     in_features=1024, out_features=4096, prefill_tokens=512,
        ...     prefill_s=(("float32", 0.004), ("bfloat16", 0.002)),
        ...     decode_s=(("float32", 0.0004), ("bfloat16", 0.0002)),
        ...     cast_s=(("bfloat16", "float32", 0.001),),
        ...     threads=8, measured_at="2026-01-01",
        ... )
        >>> probe.prefill("bfloat16"), probe.decode("float16"), probe.cast("bfloat16", "float32")
        (0.002, None, 0.001)
        >>> cudaload.Machine.simulated(dtype_probe=probe).dtype_probe is probe
        True
    """

    in_features: int
    out_features: int
    prefill_tokens: int
    """Rows of the prefill GEMM (tokens in one forward)."""
    prefill_s: tuple[tuple[str, float], ...]
    """dtype -> seconds for one [prefill_tokens x in] @ [in x out]."""
    decode_s: tuple[tuple[str, float], ...]
    """dtype -> seconds for one [1 x in] @ [in x out], weights not in cache."""
    cast_s: tuple[tuple[str, str, float], ...]
    """(from dtype, to dtype, seconds) to cast one [out x in] weight."""
    threads: int
    measured_at: str
    """ISO date of the measurement."""
    fingerprint: tuple[tuple[str, str], ...] = ()
    cost_s: float = 0.0
    """Seconds this process spent probing (0 when read from the cache)."""
    from_cache: bool = False
    rounds: tuple[ProbeRound, ...] = ()
    """Each measured round's timings; the medians above summarise them."""
    confidence: str = "quiet"
    """"quiet", "busy" (used, kept briefly) or "disturbed" (not used)."""
    conditions: str = ""
    """What the probe saw while measuring (waits for a core, steal, load, the re-run)."""

    @property
    def weight_elements(self) -> int:
        return self.in_features * self.out_features

    def prefill(self, dtype: str) -> float | None:
        return dict(self.prefill_s).get(dtype)

    def decode(self, dtype: str) -> float | None:
        return dict(self.decode_s).get(dtype)

    def cast(self, source: str, target: str) -> float:
        if source == target:
            return 0.0
        for a, b, seconds in self.cast_s:
            if (a, b) == (source, target):
                return seconds
        return 0.0

    def per_round(self) -> tuple[DtypeProbe, ...]:
        """This probe as one probe per measured round (just itself when no rounds are kept)."""
        return tuple(
            replace(self, prefill_s=r.prefill_s, decode_s=r.decode_s, cast_s=r.cast_s or self.cast_s, rounds=())
            for r in self.rounds
        ) or (self,)


@frozen
class TunedVariant:
    """One measured (dtype, attention) variant of a tuning record."""

    dtype: str
    attn_implementation: str
    load_s: float
    prefill_s: float
    decode_tokens_per_s: float


@frozen
class TuningRecord:
    """What `cudaload bench --save` measured for one model shape on one machine.

    `plan()` reads the records saved for the planned model's shape (`Machine.tuning`) and, when one
    matches this machine's fingerprint, picks the dtype and attention it measured fastest for the
    workload; pass records to `Machine.simulated(tuning=...)` to plan with them elsewhere.

    Attributes:
        model_key: The model's shape (architecture, sizes, checkpoint dtype) as one string: see
            `ModelFacts.shape_key`.
        prompt_tokens: Prompt length the variants were timed with.
        new_tokens: Tokens generated per timed run.
        variants: One measured (dtype, attention) variant each: load seconds, prefill seconds and
            decode tokens per second.
        fingerprint: (key, value) pairs of the measuring machine's `Machine.fingerprint()`.
        measured_at: ISO date of the measurement.
        path: The file it was read from ("" when built in memory).

    Examples:
        >>> import cudaload
        >>> record = cudaload.TuningRecord("Qwen3ForCausalLM params=1", 512, 128, (), (("cpu", "x"),), "2026-01-01")
        >>> record.prompt_tokens, record.path
        (512, '')
    """

    model_key: str
    """The model's shape (architecture, sizes, checkpoint dtype) as one string: see `model_key()`."""
    prompt_tokens: int
    new_tokens: int
    variants: tuple[TunedVariant, ...]
    fingerprint: tuple[tuple[str, str], ...]
    measured_at: str
    path: str = ""
    """The file it was read from."""
