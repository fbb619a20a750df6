"""The training tasks, one module each; the loop in training/trainer.py drives any of them.

    training.tasks.base       the Task protocol, HeldOutTask (evaluate / save), padding, the pre-training corpus
    training.tasks.mlm        masked-LM pre-training (BERT / RoBERTa / ALBERT, NSP / SOP)   MLMTask
    training.tasks.classify   sequence-classification fine-tuning of an encoder checkpoint  ClassifyTask
    training.tasks.token_classify  per-token (word) classification of an encoder checkpoint   TokenClassifyTask
    training.tasks.lm         causal-LM pre-training (GPT-2 / Llama)                         LMTask
    training.tasks.g2p        CMUdict grapheme-to-phoneme, the original Transformer (Marian) G2PTask
"""
from .base import Batch, CorpusSplits, HeldOutTask, Task, default_corpus, prepare_tokenizer_copy, user_corpus
from .classify import CLASSIFIER_FAMILIES, PLATEAU_TOP1, ClassifyConfig, ClassifyTask, plateaued_mlm
from .g2p import G2PConfig, G2PTask
from .token_classify import TOKEN_CLASSIFIER_FAMILIES, TokenClassifyConfig, TokenClassifyTask
from .lm import LM_ARCHS, LMConfig, LMTask
from .mlm import (
    DEFAULT_PAIR_OBJECTIVE,
    ENCODER_ARCHS,
    EVAL_MASKING,
    MLM_KINDS,
    PAIR_OBJECTIVES,
    MLMConfig,
    MLMTask,
    from_scratch_mlm,
)

__all__ = [
    "Batch", "CLASSIFIER_FAMILIES", "ClassifyConfig", "ClassifyTask", "CorpusSplits", "DEFAULT_PAIR_OBJECTIVE",
    "ENCODER_ARCHS", "EVAL_MASKING", "G2PConfig", "G2PTask", "HeldOutTask", "LMConfig", "LMTask", "LM_ARCHS", "MLMConfig", "MLMTask",
    "MLM_KINDS", "PAIR_OBJECTIVES", "PLATEAU_TOP1", "TOKEN_CLASSIFIER_FAMILIES", "Task", "TokenClassifyConfig", "TokenClassifyTask", "default_corpus", "from_scratch_mlm", "plateaued_mlm",
    "prepare_tokenizer_copy", "user_corpus",
]
