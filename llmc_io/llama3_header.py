"""LLaMA-3 model files: the header dataclass and the two layouts' tensor tables.

The formats themselves: llama3.py's docstring and docs/formats.md §2.
"""

from __future__ import annotations

import dataclasses
import math


from llmc_io import header as hdr
from llmc_io.header import round_to_fp32
from llmc_io.tensors import (
    VERSION_DTYPES,
    resolve,
    total_size,
)

LAYOUT_INFINITRAIN = "infinitrain"
LAYOUT_LLMC = "llmc-llama3-branch"

LLMC_HEADER_BYTES = 2 * hdr.HEADER_BYTES
# The llama3 branch does not store max_gen_batch_size; this is its Python default.
LLMC_DEFAULT_MAX_GEN_BATCH_SIZE = 4
# Slots 14/15 (LLaMA version major/minor) are ignored by InfiniTrain; its removed SaveAsLLMC wrote 1/0.
DEFAULT_MAJOR_MINOR = (1, 0)

# Symbols: V vocab, L layers, C channels, QKV = C + 2*kv rows of c_attn, H ffn hidden.
_INFINITRAIN_TENSORS = (
    ("wte", "wte/embedding", ("V", "C")),
    ("ln_1", "h/ln_1/scale", ("L", "C")),
    ("c_attn", "h/attn/c_attn/kernel", ("L", "QKV", "C")),  # rows Q [0,C), K [C,C+kv), V [C+kv,C+2kv)
    ("attn_proj", "h/attn/c_proj/kernel", ("L", "C", "C")),
    ("ln_2", "h/ln_2/scale", ("L", "C")),
    ("c_fc", "h/mlp/c_fc/kernel", ("L", "H", "C")),  # up (w3)
    ("c_fc2", "h/mlp/c_fc2/kernel", ("L", "H", "C")),  # gate (w1)
    ("mlp_proj", "h/mlp/c_proj/kernel", ("L", "C", "H")),
    ("ln_f", "ln_f/scale", ("C",)),
    ("lm_head", "lm_head/kernel", ("V", "C")),
)

# The fc slot holds, per layer, c_fc's H rows then c_fc2's H rows; it is split by name below.
_FC_PAIR = "h/mlp/c_fc/kernel + h/mlp/c_fc2/kernel"
_LLMC_TENSORS = (
    ("wte", "wte/embedding", ("V", "C")),
    ("lm_head", "lm_head/kernel", ("V", "C")),  # in GPT-2's wpe slot
    ("ln1w", "h/ln_1/scale", ("L", "C")),
    ("ln1b", None, ("L", "C")),  # zero biases: checked, then dropped
    ("qkvw", "h/attn/c_attn/kernel", ("L", "QKV", "C")),
    ("qkvb", None, ("L", "QKV")),
    ("attprojw", "h/attn/c_proj/kernel", ("L", "C", "C")),
    ("attprojb", None, ("L", "C")),
    ("ln2w", "h/ln_2/scale", ("L", "C")),
    ("ln2b", None, ("L", "C")),
    ("fcw", _FC_PAIR, ("L", "2H", "C")),
    ("fcb", None, ("L", "2H")),
    ("fcprojw", "h/mlp/c_proj/kernel", ("L", "C", "H")),
    ("fcprojb", None, ("L", "C")),
    ("lnfw", "ln_f/scale", ("C",)),
    ("lnfb", None, ("C",)),
)

_FLOAT_FIELDS = ("ffn_dim_multiplier", "norm_eps", "rope_theta")
_OVERRIDABLE = _FLOAT_FIELDS + ("max_gen_batch_size",)


# LLaMA3Header's fields that only a Hugging Face config.json sets.
HF_ONLY_FIELDS = (
    "tie_embeddings",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_seq_len",
)


@dataclasses.dataclass(frozen=True)
class LLaMA3Header:
    """The model a LLaMA-3 file header describes.

    Float fields are rounded to fp32 on construction: that is all a file can hold, and it makes a
    header equal to itself after a save/load round trip.
    """

    max_seq_len: int
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    channels: int
    ffn_dim_multiplier: float  # 0.0 means "none" (InfiniTrain writes 0.0 for an absent multiplier)
    multiple_of: int
    norm_eps: float
    rope_theta: float
    use_scaled_rope: bool
    max_gen_batch_size: int
    # What a Hugging Face config.json adds (llm.c and InfiniTrain files hold none of it: their
    # head is untied, and their scaled RoPE is Llama-3.1's, these defaults).
    tie_embeddings: bool = False  # one tensor for wte and the head (Llama-3.2-1B and 3B)
    rope_factor: float = 8.0  # rope_scaling's factor, low/high_freq_factor and original context
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq_len: int = 8192

    def __post_init__(self):
        for name in _FLOAT_FIELDS:
            object.__setattr__(self, name, round_to_fp32(float(getattr(self, name))))
        object.__setattr__(self, "use_scaled_rope", bool(self.use_scaled_rope))
        object.__setattr__(self, "tie_embeddings", bool(self.tie_embeddings))

    @property
    def head_dim(self) -> int:
        return self.channels // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def ffn_hidden_dim(self) -> int:
        """docs/formats.md §2c, as llm.c's Python computes it: H = 4C, H = floor(2H/3),
        H = floor(mult*H) in double, then H rounded up to a multiple of multiple_of.

        InfiniTrain rounds mult*H to nearest (llround) instead of flooring; the two agree for every
        released config (1B/3B -> 8192, 8B -> 14336).
        """
        hidden = int(2 * (4 * self.channels) / 3)
        if self.ffn_dim_multiplier > 0:
            hidden = int(self.ffn_dim_multiplier * hidden)
        m = self.multiple_of
        return m * ((hidden + m - 1) // m)

    @property
    def num_parameters(self) -> int:
        """Values in the parameter tree = values in an InfiniTrain file, lm_head included
        (for 3.2-1B, whose HF lm_head is tied, the file holds two copies)."""
        return total_size(self.tensor_specs(LAYOUT_INFINITRAIN))

    def num_stored_values(self, layout: str = LAYOUT_INFINITRAIN) -> int:
        """Values the given layout stores; the llm.c layout adds the zero biases."""
        return total_size(self.tensor_specs(layout))

    def file_size(self, layout: str = LAYOUT_INFINITRAIN, version: int = 3) -> int:
        header_bytes = hdr.HEADER_BYTES if layout == LAYOUT_INFINITRAIN else LLMC_HEADER_BYTES
        return header_bytes + self.num_stored_values(layout) * VERSION_DTYPES[version][1].itemsize

    def tensor_specs(self, layout: str = LAYOUT_INFINITRAIN):
        H = self.ffn_hidden_dim
        dims = {
            "V": self.vocab_size,
            "L": self.num_layers,
            "C": self.channels,
            "QKV": self.channels + 2 * self.kv_dim,
            "H": H,
            "2H": 2 * H,
        }
        table = {LAYOUT_INFINITRAIN: _INFINITRAIN_TENSORS, LAYOUT_LLMC: _LLMC_TENSORS}[layout]
        return resolve(table, dims)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """{tree path: shape} of the parameter tree for this header (llmc_io/PARAMS_SPEC.md); a
        tied header's tree has no lm_head (wte is the head)."""
        shapes = {spec.tree_path: spec.tree_shape for spec in self.tensor_specs(LAYOUT_INFINITRAIN)}
        if self.tie_embeddings:
            del shapes["lm_head/kernel"]
        return shapes

    def problems(self) -> list[tuple[str, str, str]]:
        """(field, expected, found) for every inconsistency; empty when the header is usable."""
        found = []
        for name in (
            "max_seq_len",
            "vocab_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "channels",
            "multiple_of",
        ):
            value = getattr(self, name)
            if not 0 < value < 2**31:
                found.append((name, "a positive int32", str(value)))
        if not 0 <= self.max_gen_batch_size < 2**31:
            found.append(("max_gen_batch_size", "a non-negative int32", str(self.max_gen_batch_size)))
        if not (math.isfinite(self.ffn_dim_multiplier) and self.ffn_dim_multiplier >= 0):
            found.append(("ffn_dim_multiplier", "a finite float >= 0", repr(self.ffn_dim_multiplier)))
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                found.append((name, "a finite float > 0", repr(value)))
        if found:
            return found
        if self.channels % self.num_heads:
            found.append(("channels", f"a multiple of num_heads ({self.num_heads})", str(self.channels)))
        elif self.num_heads % self.num_kv_heads:
            found.append(
                ("num_heads", f"a multiple of num_kv_heads ({self.num_kv_heads})", str(self.num_heads))
            )
        elif self.ffn_hidden_dim <= 0:
            found.append(
                (
                    "ffn_hidden_dim",
                    "> 0 (from channels, ffn_dim_multiplier, multiple_of)",
                    str(self.ffn_hidden_dim),
                )
            )
        return found
