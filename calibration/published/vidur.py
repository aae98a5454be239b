"""Reading Vidur's published profiling files (``../shared/data/profiling/vidur``), checked.

Every file is read through ``read_table``: a missing file, a file that is not CSV, or one that lacks a
column this code needs is one ``ConfigError`` naming the file and the columns. Times in the files are
milliseconds; everything returned here is in seconds.

Units of the collective files: ``size`` is the number of float16 elements of the buffer Vidur's collective
profiler all-reduces (``vidur/profiling/collectives/collectives_impl.py`` allocates
``torch.empty(size=(size,), dtype=torch.float16)``), so a message is ``2 · size`` bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.cost.profile import SourceFile
from simulator.errors import ConfigError

MS = 1e-3
"""Seconds per millisecond: the files record milliseconds."""

GPU_FOLDERS: dict[str, str] = {"A100": "a100", "H100": "h100"}
"""Accelerators (names as in calibration/hardware.yaml) with compute profiles, and their folders."""

TOPOLOGIES: dict[str, str] = {"A100": "a100_dgx", "H100": "h100_dgx"}
"""The collective profile of each accelerator: NVSwitch (DGX/HGX), all ranks in one node."""

MODEL_FOLDERS: dict[str, str] = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "internlm-20b": "internlm/internlm-20b",
    "phi-2": "microsoft/phi-2",
    "qwen-72b": "Qwen/Qwen-72B",
}
"""Our catalogue names (calibration/engine/configs.py) of the models Vidur profiled, and their folders."""

GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
"""Operators that are GEMMs against a layer's weights (QKV, O, gate+up, down)."""

ELEMENTWISE_OPS: tuple[str, ...] = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
"""Per-layer operators that read and write activations only. phi-2 has no post-attention norm (its
attention and MLP run in parallel off one norm), so its files lack that column."""

EMBEDDING_OP = "emb"
"""The token embedding lookup: once per step, not per layer."""

SHAPE_COLUMNS: tuple[str, ...] = (
    "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
    "num_tokens", "num_tensor_parallel_workers",
)
"""Columns every operator file must have besides the timings."""

MAX_TOKENS = 4096
"""Token counts used (the files of some models go to 32k; every model has 1–4,096)."""

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiling" / "vidur"
"""Where the data sits next to a checkout (``../shared/data/profiling/vidur`` from the project root)."""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_table(path: Path, columns: tuple[str, ...] | list[str]) -> pd.DataFrame:
    """A CSV file with at least ``columns``; anything else is a one-line ConfigError naming the file."""
    if not path.is_file():
        raise ConfigError("file not found (is --data the folder of Vidur's profiles?)", file=path)
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as err:
        raise ConfigError(f"not a readable CSV table: {err}", file=path) from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise ConfigError(f"lacks columns {shown}", file=path)
    for column in columns:
        values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64)
        if column.startswith("time_stats."):
            # Timing columns may be empty where they do not apply (decode time of a prefill row); a value
            # that is there must be milliseconds >= 0, and less than an hour.
            present = df[column].notna().to_numpy()
            if not present.any() or np.any(present & ~(np.isfinite(values) & (values >= 0) & (values < MAX_MS))):
                raise ConfigError(f"column {column} has a negative, non-numeric or absurd value (an hour or "
                                  "more), or none", file=path)
        elif column != "is_prefill":
            # Counts and shapes (tokens, sizes, ranks, heads): every row a whole number >= 0.
            bad = ~(np.isfinite(values) & (values >= 0) & (values == np.floor(values)))
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                value = df[column].iloc[first]
                shown = "nothing" if pd.isna(value) else repr(str(value))
                raise ConfigError(f"column {column} needs a whole number >= 0 on every row; data row {first + 1} "
                                  f"has {shown}", file=path)
    return df


MAX_MS = 3_600_000.0
"""A published time of an hour or more (in milliseconds) is not a kernel's: the file is refused."""


def check_data_dir(data: Path) -> Path:
    if not data.is_dir():
        raise ConfigError("folder of Vidur's published profiles not found (pass --data DIR)", file=data)
    return data


def gpu_folder(hardware: str) -> str:
    folder = GPU_FOLDERS.get(hardware.upper())
    if folder is None:
        raise ConfigError(
            f"no published compute profiles for {hardware!r}; published: {', '.join(GPU_FOLDERS)}", field="hardware"
        )
    return folder


@dataclass(frozen=True, slots=True)
class OperatorTable:
    """One model's per-layer operator times on one GPU: seconds by (tokens, TP degree)."""

    model: str
    hardware: str
    path: Path
    source: SourceFile
    frame: pd.DataFrame
    """Columns: num_tokens, tp, and one column of median seconds per operator present."""
    ops: tuple[str, ...]
    """Per-layer operators present in the file (GEMMs first, then elementwise)."""

    def at(self, tp: int) -> pd.DataFrame:
        rows = self.frame[self.frame["tp"] == tp].sort_values("num_tokens")
        if rows.empty:
            degrees = ", ".join(str(t) for t in sorted(self.frame["tp"].unique()))
            raise ConfigError(f"{self.model} on {self.hardware} has no rows at tp={tp}; tp in the data: {degrees}",
                              field="tp")
        return rows

    def layer_seconds(self, tp: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, seconds of one layer's operators) at ``tp``, token counts ascending."""
        rows = self.at(tp)
        return rows["num_tokens"].to_numpy(dtype=np.float64), rows[list(self.ops)].sum(axis=1).to_numpy()

    def embedding_seconds(self, tp: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.at(tp)
        return rows["num_tokens"].to_numpy(dtype=np.float64), rows[EMBEDDING_OP].to_numpy(dtype=np.float64)


def available_models(data: Path, hardware: str) -> list[str]:
    """Catalogue names of the models with an operator file for ``hardware``."""
    root = check_data_dir(data) / "compute" / gpu_folder(hardware)
    return [name for name, folder in MODEL_FOLDERS.items() if (root / folder / "mlp.csv").is_file()]


def load_operators(data: Path, hardware: str, model: str) -> OperatorTable:
    """The operator file of ``model`` on ``hardware``; an unknown or absent model names what there is."""
    folder = MODEL_FOLDERS.get(model)
    known = available_models(data, hardware)
    if folder is None or model not in known:
        raise ConfigError(
            f"no published profile of model {model!r} on {hardware}; published: {', '.join(known)}", field="model"
        )
    path = data / "compute" / gpu_folder(hardware) / folder / "mlp.csv"
    header = read_table(path, list(SHAPE_COLUMNS))
    present = [op for op in (*GEMM_OPS, *ELEMENTWISE_OPS, EMBEDDING_OP) if f"time_stats.{op}.median" in header.columns]
    required = [*GEMM_OPS, "input_layernorm", "mlp_act", "add", EMBEDDING_OP]
    missing = [op for op in required if op not in present]
    if missing:
        raise ConfigError(f"lacks columns {', '.join(f'time_stats.{op}.median' for op in missing)}", file=path)
    df = read_table(path, [*SHAPE_COLUMNS, *(f"time_stats.{op}.median" for op in present)])
    df = df[df["num_tokens"] <= MAX_TOKENS]
    frame = pd.DataFrame({
        "num_tokens": df["num_tokens"].astype(int),
        "tp": df["num_tensor_parallel_workers"].astype(int),
        **{op: df[f"time_stats.{op}.median"].astype(float) * MS for op in present},
    })
    # One row per (tokens, tp): the files hold one already; a duplicate is averaged rather than trusted.
    frame = frame.groupby(["num_tokens", "tp"], as_index=False).mean()
    ops = tuple(op for op in present if op != EMBEDDING_OP)
    shape = header.iloc[0]
    _check_shape(model, shape, path)
    source = SourceFile(path=str(path.relative_to(data)), sha256=sha256_of(path), rows_used=len(df))
    return OperatorTable(model=model, hardware=hardware.upper(), path=path, source=source, frame=frame, ops=ops)


def _check_shape(model: str, row: pd.Series, path: Path) -> None:
    """The file's recorded shape must be the catalogue's: a mismatch means the wrong file or catalogue entry."""
    from calibration.engine.configs import get_model

    shape = get_model(model)
    expected = {"n_head": shape.num_heads, "n_kv_head": shape.num_kv_heads, "n_embd": shape.hidden_size,
                "n_expanded_embd": shape.intermediate_size, "vocab_size": shape.vocab_size}
    wrong = [f"{k} {int(row[k])} (catalogue {v})" for k, v in expected.items() if int(row[k]) != v]
    if wrong:
        raise ConfigError(f"shape differs from the catalogue's {model}: {', '.join(wrong)}", file=path)


@dataclass(frozen=True, slots=True)
class AllReduceCurves:
    """Measured all-reduce seconds by message bytes, per rank count, on one topology."""

    topology: str
    source: SourceFile
    curves: dict[int, tuple[np.ndarray, np.ndarray]]
    """ranks -> (message bytes ascending, median seconds over ranks and repeats)."""

    def at(self, ranks: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self.curves[ranks]
        except KeyError:
            known = ", ".join(str(r) for r in sorted(self.curves)) or "none (no row within one node)"
            raise ConfigError(f"no all-reduce measurements on {self.topology} at {ranks} ranks; ranks: {known}",
                              field="tp") from None


ALLREDUCE_COLUMNS = ("time_stats.all_reduce.median", "num_workers", "size", "devices_per_node")


def load_allreduce(data: Path, hardware: str) -> AllReduceCurves:
    """The all-reduce curves of ``hardware``'s NVSwitch topology, all ranks in one node."""
    topology = TOPOLOGIES.get(hardware.upper())
    if topology is None:
        raise ConfigError(f"no published collective profile for {hardware!r}", field="hardware")
    path = check_data_dir(data) / "network" / topology / "all_reduce.csv"
    df = read_table(path, ALLREDUCE_COLUMNS)
    one_node = df[df["devices_per_node"] == df["num_workers"]]
    curves: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for ranks, rows in one_node.groupby("num_workers"):
        per_size = rows.groupby("size")["time_stats.all_reduce.median"].median().sort_index()
        curves[int(str(ranks))] = (per_size.index.to_numpy(dtype=np.float64) * 2.0, per_size.to_numpy() * MS)
    source = SourceFile(path=str(path.relative_to(data)), sha256=sha256_of(path), rows_used=len(one_node))
    return AllReduceCurves(topology=topology, source=source, curves=curves)


ATTENTION_FILE = Path("compute") / "a100" / "attention_llama70b_tp2_shape" / "attention.csv"
ATTENTION_COLUMNS = (
    "time_stats.attn_decode.median", "time_stats.attn_prefill.median", "time_stats.attn_input_reshape.median",
    "time_stats.attn_output_reshape.median", "n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers",
    "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
)


@dataclass(frozen=True, slots=True)
class AttentionTable:
    """The one published attention profile (A100, Llama-2-70B's shape at TP 2), per layer, seconds."""

    source: SourceFile
    q_heads: int
    """Query heads per rank of the profiled shape."""
    kv_heads: int
    """KV heads per rank of the profiled shape."""
    head_dim: int
    decode: pd.DataFrame
    """batch_size, kv_cache_size (context of each sequence), seconds."""
    prefill: pd.DataFrame
    """chunk (new tokens), prefix (tokens already cached), seconds."""


def load_attention(data: Path) -> AttentionTable:
    path = check_data_dir(data) / ATTENTION_FILE
    df = read_table(path, ATTENTION_COLUMNS)
    row = df.iloc[0]
    tp = int(row["num_tensor_parallel_workers"])
    q_heads = int(row["n_q_head"]) // tp
    kv_heads = max(1, int(row["n_kv_head"]) // tp)
    head_dim = int(row["n_embd"]) // int(row["n_q_head"])
    is_prefill = df["is_prefill"].astype(str).str.lower() == "true"
    reshape = (df["time_stats.attn_input_reshape.median"].fillna(0.0)
               + df["time_stats.attn_output_reshape.median"].fillna(0.0))
    dec = df[~is_prefill]
    pre = df[is_prefill]
    decode = pd.DataFrame({
        "batch_size": dec["batch_size"].astype(int), "kv_cache_size": dec["kv_cache_size"].astype(int),
        "seconds": (dec["time_stats.attn_decode.median"] + reshape[~is_prefill]) * MS,
    }).dropna()
    prefill = pd.DataFrame({
        "chunk": pre["prefill_chunk_size"].astype(int), "prefix": pre["kv_cache_size"].astype(int),
        "seconds": (pre["time_stats.attn_prefill.median"] + reshape[is_prefill]) * MS,
    }).dropna()
    source = SourceFile(path=str(ATTENTION_FILE), sha256=sha256_of(path), rows_used=len(decode) + len(prefill))
    return AttentionTable(source=source, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                          decode=decode, prefill=prefill)
