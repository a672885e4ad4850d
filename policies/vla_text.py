"""Instructions to token ids for VLA policies.

:class:`PromptTokenizer` formats a prompt as openpi's pi0 does (strip, ``_`` and newlines
to spaces, BOS first, ``"\\n"`` after the text as the start-of-answer, right-padded to
``max_len`` with a mask) on top of either

* a tokenizer folder that transformers' ``AutoTokenizer`` loads offline (for a real
  checkpoint: PaliGemma's ``tokenizer.model``/``tokenizer.json``, e.g. the files of
  ``google/paligemma-3b-pt-224``), or
* :class:`ByteTokenizer` (UTF-8 bytes), for models trained here from scratch, which need
  no vocabulary file.

An instruction longer than the model's token budget is refused (``ValueError``), never
truncated: a silently cut instruction is a different task.
"""

from __future__ import annotations

from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


class ByteTokenizer:
    """UTF-8 bytes as ids 3..258 (0 pad, 1 BOS, 2 EOS)."""

    pad_id, bos_id = 0, 1
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]


class _HFTokenizer:
    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.bos_id = self.tok.bos_token_id if self.tok.bos_token_id is not None else 2
        self.pad_id = 0
        self.vocab_size = len(self.tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))


def open_tokenizer(folder: str | Path | None):
    """The tokenizer in ``folder`` (``None``: bytes). A folder without tokenizer files is
    refused naming the files to put there."""
    if folder is None:
        return ByteTokenizer()
    folder = Path(folder).expanduser()
    if not folder.is_dir() or not any((folder / f).exists() for f in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"policy.tokenizer={folder}: no tokenizer there. Put the model's tokenizer files in that folder "
            f"({' or '.join(TOKENIZER_FILES)} with tokenizer_config.json; for pi0 the PaliGemma tokenizer, e.g. "
            f"the files of google/paligemma-3b-pt-224)"
        )
    return _HFTokenizer(folder)


class PromptTokenizer:
    def __init__(self, tokenizer, max_len: int):
        self.tok = tokenizer
        self.max_len = int(max_len)
        self.vocab_size = tokenizer.vocab_size

    def ids(self, prompt: str) -> list[int]:
        text = str(prompt).strip().replace("_", " ").replace("\n", " ")
        ids = [self.tok.bos_id, *self.tok.encode(text), *self.tok.encode("\n")]
        if len(ids) > self.max_len:
            raise ValueError(
                f"instruction {prompt!r} is {len(ids)} tokens; the model takes at most {self.max_len} "
                f"(shorten it, or use a model with a longer token budget)"
            )
        return ids

    def __call__(self, prompts: list[str], device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, L)`` ids (right-padded) and their mask; ``L`` is the batch's longest prompt
        (padding is masked, so a shorter pad changes no output and saves the compute)."""
        ids = [self.ids(p) for p in prompts]
        width = max((len(x) for x in ids), default=1)
        tokens = torch.full((len(prompts), width), self.tok.pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.bool)
        for i, x in enumerate(ids):
            tokens[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = True
        if torch.device(device).type == "cuda":  # pinned and asynchronous: acting does not wait on the host copy
            return tokens.pin_memory().to(device, non_blocking=True), mask.pin_memory().to(device, non_blocking=True)
        return tokens.to(device), mask.to(device)
