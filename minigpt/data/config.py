"""Configuration of corpora and tokenizers (YAML: `configs/data/*.yaml`, `configs/tokenizer/*.yaml`).

Every field is a YAML key: `data.val_ratio` in YAML is `DataConfig.val_ratio` here. Values are
checked in `__post_init__`, which runs when a script converts the composed config, so a bad value
fails before any file is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minigpt.errors import UserError

SOURCES = ("pystdlib", "shakespeare", "text", "files")
VERIFY_MODES = ("stamp", "hash")
TOKENIZER_KINDS = ("bpe", "gpt2", "cl100k", "char", "byte")
BPE_VOCAB_SIZE = 4096  # the default bpe vocabulary: small enough for a CPU model's embedding table

# Folders of the standard library that are not representative Python source: the test suites
# (half the library by size, full of generated fixtures), the IDLE GUI, third-party packages
# installed beside the library, and the turtle demos. `encodings` is mostly machine-generated
# codec tables (cp*.py, mac_*.py), which would teach the model hex tables rather than Python.
DEFAULT_EXCLUDE = ["test", "tests", "idlelib", "site-packages", "turtledemo", "encodings", "__pycache__"]
# What folders and globs contribute when data.extensions is null: prose for `text`; for `files` the formats
# it streams (anything else a glob or folder yields would be read as one plain-text document per file).
DEFAULT_EXTENSIONS = {"text": [".txt", ".md"], "files": [".parquet", ".jsonl", ".jsonl.gz", ".txt"]}


@dataclass
class DataConfig:
    """Which text to train on, how to split it, and where prepared token files are cached."""

    source: str = "pystdlib"  # pystdlib | shakespeare | text | files
    # Fraction held out for validation. Multi-file corpora are split by file (a stable hash of each
    # file's relative path), a single document by its tail (cut at a line break); `files` by document
    # (a stable hash of "<file>#<row>", so the split is decided while streaming).
    val_ratio: float = 0.05
    # Prepared datasets live in <cache_dir>/<source>-<tokenizer>-<fingerprint[:12]>/; relative paths
    # are relative to where you launched the command (hydra.job.chdir is false).
    cache_dir: str = "outputs/data"
    # pystdlib: skip files larger than this (the few huge ones are generated data, e.g. pydoc topics).
    max_file_bytes: int = 200_000
    # pystdlib: folder names skipped anywhere in the tree.
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    # text, files: files, folders (searched recursively) or glob patterns (`**` allowed).
    paths: list[str] = field(default_factory=list)
    # text, files: file name endings that folders and globs contribute (explicitly named files always
    # count); an empty list accepts every file; null: DEFAULT_EXTENSIONS of the source.
    extensions: list[str] | None = None
    # text, files: how to treat bytes that are not UTF-8: strict (fail naming the file) | replace (U+FFFD).
    encoding_errors: str = "strict"
    # files: the jsonl field / parquet column that holds each document's text.
    text_key: str = "text"
    # shakespeare: where to download from; the sha256 is checked whatever the URL.
    url: str = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
    # Processes that encode text into tokens (0: one per CPU core; 1: this process only). They start
    # only for corpora large enough to repay their start-up (see encode.py). Never changes the tokens,
    # so it is not part of the fingerprint.
    num_workers: int = 0
    # Tokens per shard file (train_000.bin, train_001.bin, ...): 100M tokens is 200 MB of uint16, a
    # size every filesystem and copy tool handles well; the default corpus fits in one shard per split.
    # The shards of a split are one logical stream, so this changes files, never tokens or batches.
    shard_tokens: int = 100_000_000
    # How reuse checks the bins against meta.json. Sizes are always compared. stamp: hash a shard once,
    # then trust it while its size, mtime and inode stay those recorded when it was last hashed (a
    # restart costs a stat per shard, whatever the corpus size); hash: hash every shard on every reuse.
    verify: str = "stamp"

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise UserError(f"data.source={self.source!r} is unknown; use one of {', '.join(SOURCES)}")
        if not 0.0 < self.val_ratio < 1.0:
            raise UserError(f"data.val_ratio={self.val_ratio} must be between 0 and 1 (exclusive), e.g. 0.05")
        if self.max_file_bytes <= 0:
            raise UserError(f"data.max_file_bytes={self.max_file_bytes} must be positive, e.g. 200000")
        if self.encoding_errors not in ("strict", "replace"):
            raise UserError(f"data.encoding_errors={self.encoding_errors!r} must be strict or replace")
        if self.num_workers < 0:
            raise UserError(f"data.num_workers={self.num_workers} must be >= 0 (0 = one per CPU core)")
        if self.shard_tokens < 1:
            raise UserError(f"data.shard_tokens={self.shard_tokens} must be positive, e.g. 100000000")
        if self.verify not in VERIFY_MODES:
            raise UserError(f"data.verify={self.verify!r} must be one of {', '.join(VERIFY_MODES)}")
        if not self.text_key:
            raise UserError("data.text_key is empty; name the jsonl field / parquet column, e.g. text")
        if not self.cache_dir:
            raise UserError("data.cache_dir is empty; give a folder, e.g. data.cache_dir=outputs/data")
        bad = [e for e in self.extensions or () if not e.startswith(".")]
        if bad:
            raise UserError(f"data.extensions={bad} must start with a dot, e.g. [.txt,.md]")
        if self.source in ("text", "files") and not self.paths:
            example = "notes/*.md" if self.source == "text" else "/data/corpus/*.parquet"
            raise UserError(
                f"data={self.source} needs data.paths: files, folders or globs, e.g. 'data.paths=[{example}]'"
            )

    def file_extensions(self) -> list[str]:
        """`extensions`, or the source's own list when it is null."""
        if self.extensions is not None:
            return list(self.extensions)
        return list(DEFAULT_EXTENSIONS.get(self.source, DEFAULT_EXTENSIONS["text"]))


@dataclass
class TokenizerConfig:
    """Which tokenizer turns text into ids. `bpe` is trained on the corpus' train split."""

    kind: str = "bpe"  # bpe | gpt2 | cl100k | char | byte
    # bpe only: the total vocabulary, counting <|endoftext|>. 256 byte tokens + (vocab_size - 257)
    # learned merges + 1 special token; null means BPE_VOCAB_SIZE. Other kinds have a fixed or corpus-given
    # size, and refuse the key rather than ignore it.
    vocab_size: int | None = None
    # bpe only: train on at most this many characters of the train split (in corpus order);
    # null trains on all of it. The encoder still tokenises the whole corpus.
    train_chars: int | None = None

    @property
    def bpe_vocab_size(self) -> int:
        """The bpe vocabulary size: `vocab_size`, or BPE_VOCAB_SIZE when it is null."""
        return BPE_VOCAB_SIZE if self.vocab_size is None else self.vocab_size

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            kinds = ", ".join(TOKENIZER_KINDS)
            raise UserError(f"tokenizer.kind={self.kind!r} is unknown; use one of {kinds}")
        if self.kind != "bpe":
            for key in ("vocab_size", "train_chars"):
                if getattr(self, key) is not None:
                    raise UserError(f"tokenizer.{key} applies only to tokenizer=bpe; tokenizer={self.kind} "
                                    f"has a fixed or corpus-given vocabulary (drop tokenizer.{key})")
            return
        if not 257 <= self.bpe_vocab_size <= 2**31 - 1:
            raise UserError(
                f"tokenizer.vocab_size={self.vocab_size} must be at least 257 for tokenizer=bpe "
                "(256 byte tokens + <|endoftext|>), e.g. 4096"
            )
        if self.train_chars is not None and self.train_chars <= 0:
            raise UserError(f"tokenizer.train_chars={self.train_chars} must be positive, or null for all")


@dataclass
class PrepareConfig:
    """Root of `configs/prepare.yaml`: text -> tokenizer -> token bins."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
