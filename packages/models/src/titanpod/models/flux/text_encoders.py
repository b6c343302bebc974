"""FLUX.1's frozen text encoders: T5 (per-token context) and CLIP (one pooled vector per prompt).

Legend: B batch (prompts), T T5 tokens, D_t5 T5 width (the transformer's joint context width),
D_clip CLIP width (the transformer's pooled-vector width).

Arithmetic follows diffusers' ``FluxPipeline.encode_prompt``: T5 reads prompts padded (and
truncated) to ``t5_max_length`` tokens, without an attention mask, and gives its last hidden
state; CLIP reads prompts padded to 77 tokens and gives its pooled output (the final-norm
hidden state at the end-of-text token). Neither encoder trains.

The encoders are transformers models, imported only when a constructor runs: published weights
in diffusers' FLUX pipeline layout (``from_pretrained``), or a tiny random pair with a tokenizer
built here (``random``: byte-level, or whole words of a given vocabulary), which needs no download
and runs the tests and debug recipes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CLIP_SUBFOLDERS = ("text_encoder", "tokenizer")
"""Where a FLUX pipeline folder keeps CLIP (``CLIPTextModel``) and its tokenizer."""
T5_SUBFOLDERS = ("text_encoder_2", "tokenizer_2")
"""Where a FLUX pipeline folder keeps T5 (``T5EncoderModel``) and its tokenizer."""
CLIP_MAX_LENGTH = 77
"""CLIP's context: prompts are padded or truncated to this many tokens."""
FLUX_DEV_T5_MAX_LENGTH = 512
"""T5 tokens FLUX.1-dev reads (schnell reads 256)."""

PAD, EOS, BOS = "<pad>", "</s>", "<s>"
"""Special tokens of the built-in tokenizers, ids 0, 1 and 2; the 256 bytes, or <unk> and the words, follow."""
UNK = "<unk>"
"""The word-level tokenizer's token for a word outside its vocabulary (id 3)."""


@dataclass(frozen=True)
class TinyTextEncoderConfig:
    """Shapes of the random T5 and CLIP text encoders (``FluxTextEncoders.random``)."""

    context_dim: int = 64
    """T5 width: the per-token embeddings' last dimension; match the transformer's joint context width."""
    pooled_dim: int = 32
    """CLIP width: the pooled embedding's dimension; match the transformer's pooled-vector width."""
    t5_layers: int = 2
    """T5 encoder blocks."""
    t5_heads: int = 2
    """T5 attention heads."""
    t5_head_dim: int = 16
    """Width of one T5 head (T5's ``d_kv``; need not be ``context_dim / t5_heads``)."""
    t5_ffn_dim: int = 128
    """Hidden width of T5's gated-GELU feed-forward layers."""
    clip_layers: int = 2
    """CLIP encoder layers."""
    clip_heads: int = 2
    """CLIP attention heads; divides ``pooled_dim``."""
    clip_ffn_dim: int = 64
    """Hidden width of CLIP's feed-forward layers."""
    t5_max_length: int = 32
    """T5 tokens per prompt (padded or truncated to this), i.e. T of the embeddings."""
    clip_max_length: int = CLIP_MAX_LENGTH
    """CLIP tokens per prompt, and CLIP's number of positions."""
    words: tuple[str, ...] = ()
    """The vocabulary of a word-level tokenizer: each of these words is one token, any other word <unk>
    (words are split at spaces and punctuation). Empty: the byte-level tokenizer, which reads any text
    byte by byte (a word of n letters is n tokens)."""

    def __post_init__(self) -> None:
        if self.pooled_dim % self.clip_heads:
            raise ValueError(f"pooled_dim ({self.pooled_dim}) must be divisible by clip_heads ({self.clip_heads}).")
        if self.t5_max_length < 2 or self.clip_max_length < 3:
            raise ValueError(
                "t5_max_length must be at least 2 and clip_max_length at least 3 (room for special tokens)."
            )


def byte_level_tokenizer(max_length: int, with_bos: bool) -> PreTrainedTokenizerBase:
    """A tokenizer over raw UTF-8 bytes (259 ids: <pad>, </s>, <s>, then the bytes), built in code, offline.

    Every text encodes; each prompt ends with </s>, and starts with <s> when ``with_bos`` (as
    CLIP's do). Truncation keeps the special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, BOS]
    vocab = {token: i for i, token in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    template = f"{BOS} $A {EOS}" if with_bos else f"$A {EOS}"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(EOS, vocab[EOS]), (BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, bos_token=BOS, model_max_length=max_length
    )


def word_level_tokenizer(words: tuple[str, ...], max_length: int, with_bos: bool) -> PreTrainedTokenizerBase:
    """A tokenizer with one id per word of ``words`` (after <pad>, </s>, <s> and <unk>), built in code, offline.

    Text is split at spaces and punctuation; a word outside ``words`` is <unk>. Each prompt ends with </s>,
    and starts with <s> when ``with_bos``; truncation keeps the special tokens.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([PAD, EOS, BOS, UNK, *dict.fromkeys(words)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    template = f"{BOS} $A {EOS}" if with_bos else f"$A {EOS}"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(EOS, vocab[EOS]), (BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
        model_max_length=max_length,
    )  # fmt: skip


class FluxTextEncoders(nn.Module):
    """T5 and CLIP with their tokenizers, frozen: ``encode(prompts)`` -> (T5 embeddings, pooled CLIP)."""

    def __init__(
        self,
        t5: PreTrainedModel,
        t5_tokenizer: PreTrainedTokenizerBase,
        clip: PreTrainedModel,
        clip_tokenizer: PreTrainedTokenizerBase,
        t5_max_length: int = FLUX_DEV_T5_MAX_LENGTH,
        clip_max_length: int = CLIP_MAX_LENGTH,
    ) -> None:
        super().__init__()
        positions = getattr(clip.config, "max_position_embeddings", clip_max_length)
        if clip_max_length > positions:
            raise ValueError(f"clip_max_length ({clip_max_length}) exceeds CLIP's {positions} positions.")
        self.t5 = t5
        self.clip = clip
        self.t5_tokenizer = t5_tokenizer
        self.clip_tokenizer = clip_tokenizer
        self.t5_max_length = t5_max_length
        self.clip_max_length = clip_max_length
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> FluxTextEncoders:
        """The encoders are frozen: they stay in eval mode whatever ``mode`` says."""
        return super().train(False)

    @property
    def context_dim(self) -> int:
        """D_t5: the width of the per-token embeddings."""
        return int(self.t5.config.d_model)

    @property
    def pooled_dim(self) -> int:
        """D_clip: the width of the pooled embedding."""
        return int(self.clip.config.hidden_size)

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids: T5's [B, t5_max_length] and CLIP's [B, clip_max_length], padded and truncated."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError("prompts must be a list of strings (wrap a single prompt in a list).")
        t5_ids = self.t5_tokenizer(
            list(prompts), padding="max_length", max_length=self.t5_max_length, truncation=True, return_tensors="pt"
        ).input_ids
        clip_ids = self.clip_tokenizer(
            list(prompts), padding="max_length", max_length=self.clip_max_length, truncation=True, return_tensors="pt"
        ).input_ids
        return t5_ids, clip_ids

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """T5's last hidden state [B, T, D_t5] and CLIP's pooled output [B, D_clip], on the encoders' device."""
        t5_ids_BT, clip_ids_BS = self.tokenize(prompts)
        t5_device = next(self.t5.parameters()).device
        clip_device = next(self.clip.parameters()).device
        context_BTD = self.t5(input_ids=t5_ids_BT.to(t5_device)).last_hidden_state
        pooled_BD = self.clip(input_ids=clip_ids_BS.to(clip_device)).pooler_output
        return context_BTD, pooled_BD

    @classmethod
    def random(cls, config: TinyTextEncoderConfig | None = None, seed: int = 0) -> FluxTextEncoders:
        """Tiny randomly initialised T5 and CLIP with a built-in tokenizer (byte-level, or word-level over
        ``config.words``); no download.

        The same ``seed`` gives the same weights; the global random state is left untouched.
        """
        from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

        config = config or TinyTextEncoderConfig()
        if config.words:
            t5_tokenizer = word_level_tokenizer(config.words, config.t5_max_length, with_bos=False)
            clip_tokenizer = word_level_tokenizer(config.words, config.clip_max_length, with_bos=True)
        else:
            t5_tokenizer = byte_level_tokenizer(config.t5_max_length, with_bos=False)
            clip_tokenizer = byte_level_tokenizer(config.clip_max_length, with_bos=True)
        vocab_size = len(t5_tokenizer)
        pad_id, eos_id, bos_id = (t5_tokenizer.convert_tokens_to_ids(t) for t in (PAD, EOS, BOS))
        t5_config = T5Config(
            vocab_size=vocab_size,
            d_model=config.context_dim,
            d_kv=config.t5_head_dim,
            d_ff=config.t5_ffn_dim,
            num_layers=config.t5_layers,
            num_heads=config.t5_heads,
            feed_forward_proj="gated-gelu",  # T5 v1.1, as FLUX's T5-XXL
            dropout_rate=0.0,
            is_encoder_decoder=False,
            use_cache=False,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            decoder_start_token_id=pad_id,
            tie_word_embeddings=False,
        )
        clip_config = CLIPTextConfig(
            vocab_size=vocab_size,
            hidden_size=config.pooled_dim,
            intermediate_size=config.clip_ffn_dim,
            num_hidden_layers=config.clip_layers,
            num_attention_heads=config.clip_heads,
            max_position_embeddings=config.clip_max_length,
            projection_dim=config.pooled_dim,
            pad_token_id=pad_id,
            bos_token_id=bos_id,
            eos_token_id=eos_id,  # not 2: the pooled token is the first </s>, not the largest id
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            t5 = T5EncoderModel(t5_config)
            clip = CLIPTextModel(clip_config)
        return cls(t5, t5_tokenizer, clip, clip_tokenizer, config.t5_max_length, config.clip_max_length)

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str | Path,
        dtype: torch.dtype | None = None,
        t5_max_length: int = FLUX_DEV_T5_MAX_LENGTH,
        local_files_only: bool = False,
    ) -> FluxTextEncoders:
        """Read T5 and CLIP from a FLUX pipeline folder or Hub id (diffusers' layout).

        ``text_encoder`` / ``tokenizer`` hold CLIP and ``text_encoder_2`` / ``tokenizer_2`` hold
        T5, as in ``black-forest-labs/FLUX.1-dev``. ``dtype`` defaults to what the files say.
        Use ``t5_max_length`` 256 for FLUX.1-schnell. A Hub id that cannot be fetched (offline,
        or ``local_files_only`` and not cached) is an ``OSError`` that says to pass a local folder.
        """
        from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

        source = str(path_or_hub_id)
        local = Path(source).expanduser()
        is_local = local.is_dir()
        if not is_local and (source.startswith((".", "/", "~")) or source.count("/") > 1 or Path(source).exists()):
            raise FileNotFoundError(f"{source} is not a folder; give a FLUX pipeline folder or a Hub id.")
        if is_local:
            missing = [sub for sub in (*CLIP_SUBFOLDERS, *T5_SUBFOLDERS) if not (local / sub).is_dir()]
            if missing:
                raise FileNotFoundError(
                    f"{local} lacks the subfolders {', '.join(missing)}; a FLUX pipeline folder has "
                    f"{', '.join((*CLIP_SUBFOLDERS, *T5_SUBFOLDERS))}."
                )
            source = str(local)
        options: dict[str, Any] = {"local_files_only": local_files_only}
        if dtype is not None:
            options["dtype"] = dtype
        parts: list[Any] = []
        for kind, subfolder in (
            (CLIPTextModel, CLIP_SUBFOLDERS[0]),
            (AutoTokenizer, CLIP_SUBFOLDERS[1]),
            (T5EncoderModel, T5_SUBFOLDERS[0]),
            (AutoTokenizer, T5_SUBFOLDERS[1]),
        ):
            extra = options if kind is not AutoTokenizer else {"local_files_only": local_files_only}
            try:
                parts.append(kind.from_pretrained(source, subfolder=subfolder, **extra))
            except OSError as error:
                if is_local:
                    raise OSError(f"Could not read {subfolder} from {source}: {error}") from error
                raise OSError(
                    f"Could not load the FLUX text encoders from the Hugging Face Hub id {source!r} "
                    f"(subfolder {subfolder}): the Hub is unreachable or the files are not cached"
                    f"{' (local_files_only=True)' if local_files_only else ''}. Download the pipeline where "
                    f"there is network (e.g. `hf download {source}`), then pass its local folder path, "
                    f"e.g. FluxTextEncoders.from_pretrained('/path/to/{source.split('/')[-1]}')."
                ) from error
        clip, clip_tokenizer, t5, t5_tokenizer = parts
        clip_max_length = min(CLIP_MAX_LENGTH, int(clip.config.max_position_embeddings))
        return cls(t5, t5_tokenizer, clip, clip_tokenizer, t5_max_length, clip_max_length)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the four parts in the FLUX pipeline layout that ``from_pretrained`` reads (safetensors)."""
        directory = Path(directory)
        for part, subfolder in (
            (self.clip, CLIP_SUBFOLDERS[0]),
            (self.clip_tokenizer, CLIP_SUBFOLDERS[1]),
            (self.t5, T5_SUBFOLDERS[0]),
            (self.t5_tokenizer, T5_SUBFOLDERS[1]),
        ):
            part.save_pretrained(directory / subfolder)
        return directory
