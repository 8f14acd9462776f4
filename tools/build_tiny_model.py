"""Build a tiny random Llama model plus tokenizer that a real vLLM can serve offline.

Usage (with the vLLM venv's python, which has torch, transformers and tokenizers)::

    $VLLM_PYTHON tools/build_tiny_model.py DIR

The model is written into a temporary sibling of DIR and renamed into place, so DIR either does not
exist or is complete. A marker file ``.autotuner-tiny-model`` (written last) records the recipe
version; if DIR already holds a marker with the current recipe, nothing is done. An existing DIR
without that marker (or with another recipe) is replaced.

Recipe (see shared/notes/vllm-on-cpu.md):
- tokenizer: byte-level BPE trained on the top-level ``*.py`` files of this interpreter's stdlib,
  vocab 4096, specials ``<|pad|> <|bos|> <|eos|> <|im_start|> <|im_end|>`` (ids 0-4), saved as a
  ``PreTrainedTokenizerFast`` with a ChatML chat template;
- model: ``LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=16384,
  tie_word_embeddings=True)``, random weights from a fixed seed, saved in bfloat16 (safetensors).

The output is deterministic for a given interpreter (stdlib) and package set.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

RECIPE = "tiny-llama-v1"
MARKER = ".autotuner-tiny-model"
SEED = 1234
VOCAB_SIZE = 4096
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _log(msg: str) -> None:
    print(f"build_tiny_model: {msg}", file=sys.stderr, flush=True)


def training_files() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py") if p.is_file())
    if len(files) < 20:
        raise SystemExit(f"build_tiny_model: too few stdlib .py files under {stdlib} ({len(files)})")
    return files


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = training_files()
    _log(f"training byte-level BPE (vocab {VOCAB_SIZE}) on {len(files)} stdlib files")
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=16384,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tok) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=16384,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    _log(f"model: {n_params / 1e6:.2f} M parameters")
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)


def is_complete(target: Path) -> bool:
    marker = target / MARKER
    try:
        return marker.read_text().split("\n", 1)[0] == RECIPE
    except OSError:
        return False


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.name == MARKER or not p.is_file():
            continue
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("dir", type=Path, help="model directory to create")
    ap.add_argument("--force", action="store_true", help="rebuild even if DIR is complete")
    args = ap.parse_args(argv)
    target: Path = args.dir.absolute()
    if is_complete(target) and not args.force:
        _log(f"{target} is already complete ({RECIPE})")
        return 0

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp.", dir=target.parent))
    try:
        tok = build_tokenizer(tmp)
        build_model(tmp, tok)
        h = digest(tmp)
        # Marker last: its presence proves the directory is complete.
        (tmp / MARKER).write_text(f"{RECIPE}\nsha256={h}\n")
        for p in tmp.iterdir():
            p.chmod(0o644)
        tmp.chmod(0o755)
        old = None
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.rename(target, old / "x")
        os.rename(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log(f"wrote {target} (sha256 {h[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
