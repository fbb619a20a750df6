"""A served encoder-decoder (generate with a source: translation, g2p, summarization): the same generation engine
as a decoder's (server/generation/), built with the package's encoder graph and target tokenizer beside the
decoder graph (its manifest's `encoder_decoder` block picks the engine's parts: generation/factory.py).

Everything else is the decoder's: generate / generate_many / stream_many, KServe text mode, raw tensor
calls refused. The prompt of every door is the source; `tokenize` gives source ids, `detokenize` the text of
target ids (what a response's tokens mean), an echoed token-id prompt is source ids.
"""
from __future__ import annotations

from tokenizers import Tokenizer

from server.repository.consistency import check_prompts, check_tokenizer
from server.generation.decoder_model import DecoderModel
from server.generation import GenerationEngine
from server.repository.package import PackageError
from server.text.tokenizer import load_tokenizer
from server.protocol.types import ChatTemplate


class Seq2SeqModel(DecoderModel):
    def build_engine(self, instance: int = 0) -> GenerationEngine:
        block = self.manifest.encoder_decoder
        assert block is not None
        encoder = self.session(instance, block.encoder_file(self.variant))
        self.target_tokenizer = (self.tokenizer if block.target_tokenizer is None
                                 else load_tokenizer(self.package.file(block.target_tokenizer)))
        return GenerationEngine(self.session(instance), self.manifest, self.tokenizer, self.runtime.generation,
                                self.metrics, self.name, encoder_session=encoder,
                                target_tokenizer=self.target_tokenizer, instance=instance)

    def warm_up(self) -> None:
        """tokenizer.json against model.json (the source side: vocab_size is the source vocabulary), the target
        tokenizer against the logits' width, the engine's runs (encoder and decoder edges), a source text through
        the engine's tokenizer path."""
        vocabulary = check_tokenizer(self.package, self.tokenizer)
        _check_target(self.target_tokenizer, self.engine.spec.vocab_size)
        for engine in self.engines:
            engine.warmup()
        source = self.engine.source
        assert source is not None
        check_prompts(self.engine.tokenize, vocabulary, source.vocab_size, source.max_length)

    def chat_template(self) -> ChatTemplate | None:
        return None      # a source is a text to transform, not a conversation

    @property
    def max_length(self) -> int:
        return self.manifest.max_length    # the longest source (the prompt); the target's cap is the cache's


def _check_target(tokenizer: Tokenizer, vocab_size: int) -> None:
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if largest >= vocab_size:
        raise PackageError(f"target tokenizer: token id {largest} is outside the decoder's vocabulary of {vocab_size} "
                           "(model.json encoder_decoder.target_vocab_size): another model's tokenizer?")
