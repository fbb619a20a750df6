"""Runs in bench/.venv-gguf: llama.cpp's convert_hf_to_gguf.py on one of our checkpoints, the BPE pre-tokenizer named.

    python gguf_convert.py LLAMA_CPP_SRC CHECKPOINT_DIR OUT_GGUF PRE_TOKENIZER

The converter recognises a BPE pre-tokenizer by hashing its ids for a fixed text and refuses any hash it does not
list ("BPE pre-tokenizer was not recognized"); ours, trained here, is in no list. Its pre-tokenizer is GPT-2's
(byte-level, GPT-2's split pattern, no prefix space: training/tokenizer.py), which llama.cpp calls `gpt-2`, so the
name is given instead of guessed. bench/llamacpp.py then checks that llama.cpp tokenizes like ours.
The file is written as f32 (every tensor as in the checkpoint); llama-quantize makes the 8- and 4-bit files from it.
"""
import sys
from pathlib import Path

# Run as a script, this file's folder (bench/) heads sys.path, and bench/http.py would shadow the standard library's
# http for everything the converter imports.
_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def main() -> None:
    src, ckpt, out, pre = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    sys.path.insert(0, str(src))
    sys.argv = [str(src / "convert_hf_to_gguf.py"), ckpt, "--outfile", out, "--outtype", "f32"]
    from conversion.base import TextModel

    def named_pre_tokenizer(self, tokenizer) -> str:   # replaces the hash lookup
        return pre

    TextModel.get_vocab_base_pre = named_pre_tokenizer
    import convert_hf_to_gguf

    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
