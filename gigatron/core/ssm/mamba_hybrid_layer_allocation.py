"""The hybrid layer pattern: one symbol per layer, `|` between pipeline stages, `/` before MTP.

Mirrors `megatron.core.models.hybrid.hybrid_layer_allocation` (kept here, on the layers' floor,
re-exported there as Megatron re-exports it the other way; Symbols, ParsedHybridPattern,
parse_hybrid_pattern, get_hybrid_total_layer_count, get_hybrid_total_pipeline_segment_count,
get_hybrid_layer_counts, validate_segment_layers, select_pipeline_segment). Pure functions of the
pattern string (and the PP rank / size), unit-tested without processes.

Example: "M*M-|M-M*/MM/MM" = 8 decoder layers (Mamba, attention, Mamba, MLP | ...) on 2 pipeline
stages, with 2 MTP depths of "MM" each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


class Symbols:
    """Layer symbols and separators of the pattern language (Megatron's)."""

    MAMBA = "M"
    GDN = "G"
    ATTENTION = "*"
    DS_ATTENTION = "D"
    MLA = "+"
    MLP = "-"
    MOE = "E"
    PIPE = "|"
    MTP_SEPARATOR = "/"
    VALID_LAYERS = {MAMBA, GDN, ATTENTION, DS_ATTENTION, MLA, MLP, MOE}

    @classmethod
    def name_sorted_valid_layer_symbols(cls) -> list[str]:
        return sorted(cls.VALID_LAYERS)


@dataclass
class ParsedHybridPattern:
    """main_pattern (may hold `|`), the MTP pattern of one depth (or None), the MTP depth count."""

    main_pattern: str | None
    mtp_pattern: str | None
    mtp_num_depths: int


def parse_hybrid_pattern(pattern: str | None) -> ParsedHybridPattern:
    """ "M*M*/MM/MM" -> ParsedHybridPattern("M*M*", "MM", 2); every MTP part must be the same."""
    if pattern is None:
        return ParsedHybridPattern(None, None, 0)
    main, *mtp = pattern.split(Symbols.MTP_SEPARATOR)
    _validate(main, "main", allow_pipe=True)
    for i, part in enumerate(mtp):
        if part != mtp[0]:
            raise ValueError(
                f"All MTP patterns must be identical: pattern 1 is '{mtp[0]}', pattern {i + 1} "
                f"is '{part}' (full pattern '{pattern}')"
            )
        _validate(part, "MTP")
    return ParsedHybridPattern(main, mtp[0] if mtp else None, len(mtp))


def _validate(pattern: str, name: str, allow_pipe: bool = False) -> None:
    valid = Symbols.VALID_LAYERS | ({Symbols.PIPE} if allow_pipe else set())
    for char in pattern:
        if char not in valid:
            raise ValueError(
                f"In the {name} hybrid layer pattern '{pattern}', '{char}' is not a valid layer "
                f"symbol; valid symbols are {''.join(sorted(valid))}"
            )
    if Symbols.ATTENTION in pattern and (Symbols.DS_ATTENTION in pattern or Symbols.MLA in pattern):
        raise ValueError("Not supported to have both Attention and MLA/DSA in one model")


def get_hybrid_total_layer_count(pattern: str) -> int:
    """Decoder layers of the pattern (pipes and the MTP part not counted)."""
    return len(pattern.split(Symbols.MTP_SEPARATOR)[0].replace(Symbols.PIPE, ""))


def get_hybrid_total_pipeline_segment_count(pattern: str) -> int:
    """Pipe-delimited segments of the main pattern (1 without pipes)."""
    return pattern.split(Symbols.MTP_SEPARATOR)[0].count(Symbols.PIPE) + 1


def get_hybrid_layer_counts(pattern: str) -> dict[str, int]:
    """{symbol: count} over the decoder layers, every valid symbol present (0 if unused)."""
    counts = {symbol: 0 for symbol in Symbols.name_sorted_valid_layer_symbols()}
    for char in pattern.split(Symbols.MTP_SEPARATOR)[0].replace(Symbols.PIPE, ""):
        counts[char] += 1
    return counts


def validate_segment_layers(segment: str) -> list[str]:
    """A pipe-free segment -> its list of layer symbols (ValueError on an unknown one)."""
    _validate(segment, "segment")
    return list(segment)


def select_pipeline_segment(
    main_pattern: str,
    pp_group=None,
    vp_stage: int | None = None,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    tp_group=None,
    dp_cp_group=None,
    *,
    pp_rank: int | None = None,
    pp_size: int | None = None,
) -> tuple[list[str], int]:
    """(layer symbols of this stage, global index of its first layer).

    With `|` the pattern's segments are the stages (segment vp_stage * pp_size + pp_rank);
    without, the layers split evenly over pp_size (or by first/last_stage_layers). pp_rank /
    pp_size (gigatron, keyword-only) give the stage without a process group (tests, planning).
    """
    if pp_rank is None or pp_size is None:
        pp_rank = dist.get_rank(pp_group) if pp_group is not None else 0
        pp_size = dist.get_world_size(pp_group) if pp_group is not None else 1
    segments = main_pattern.split(Symbols.PIPE) if main_pattern else [""]
    if len(segments) > 1:
        if first_stage_layers is not None or last_stage_layers is not None:
            raise ValueError(
                "num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage cannot be "
                "set when hybrid_layer_pattern has pipe ('|') separators"
            )
        if len(segments) % pp_size:
            raise ValueError(
                f"The number of pipe-delimited segments ({len(segments)}) in "
                f"hybrid_layer_pattern must be divisible by pipeline_model_parallel_size "
                f"({pp_size})"
            )
        index = (vp_stage or 0) * pp_size + pp_rank
        if index >= len(segments):
            raise ValueError(
                f"Pipeline segment index {index} (pp_rank={pp_rank}, vp_stage={vp_stage}) is out "
                f"of range for {len(segments)} segments of hybrid_layer_pattern"
            )
        return validate_segment_layers(segments[index]), sum(len(s) for s in segments[:index])
    if vp_stage is not None and pp_size > 1:
        raise ValueError(
            "virtual pipeline stages need pipe ('|') separators in hybrid_layer_pattern"
        )
    layers = validate_segment_layers(segments[0])
    first = first_stage_layers or 0
    last = last_stage_layers or 0
    middle = pp_size - (first_stage_layers is not None) - (last_stage_layers is not None)
    rest = len(layers) - first - last
    if middle and rest % middle:
        raise ValueError(
            f"Number of layers ({rest}) must be evenly divisible by the pipeline stages "
            f"({middle}) when hybrid_layer_pattern has no pipe separators"
        )
    per = rest // middle if middle else 0
    if first_stage_layers is not None and pp_rank == 0:
        offset, count = 0, first
    elif last_stage_layers is not None and pp_rank == pp_size - 1:
        offset, count = len(layers) - last, last
    else:
        offset = (pp_rank - (first_stage_layers is not None)) * per + first
        count = per
    return layers[offset : offset + count], offset
